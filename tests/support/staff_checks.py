"""What the staff tests share: making staff users the operator's way
(createstaff) and driving the admin as a browser does, with a real login
and CSRF checks on (tests/processes/test_roles.py, tests/tenants/test_staff_login.py)."""

from __future__ import annotations

import io
import itertools
import re

from django.core.management import call_command
from django.test import Client
from django.urls import reverse

PASSWORD = "a-long-staff-passphrase-42"
_addresses = itertools.count(1)


def create_staff(username: str, role: str, password: str = PASSWORD) -> str:
    out = io.StringIO()
    call_command("createstaff", username, "--role", role, "--password-stdin",
                 stdin=io.StringIO(password + "\nnot read\n"), stdout=out)
    return out.getvalue()


def browser() -> Client:
    """A client with CSRF checks on, from an address of its own (the login
    throttle counts failures per address)."""
    return Client(enforce_csrf_checks=True, REMOTE_ADDR=f"198.51.100.{next(_addresses) % 250 + 1}")


def post(client: Client, url: str, data: dict | None = None, **extra):
    """A form post as a browser makes it: with the CSRF cookie's token."""
    if "csrftoken" not in client.cookies:
        client.get(reverse("admin:login"))
    token = client.cookies["csrftoken"].value
    return client.post(url, {**(data or {}), "csrfmiddlewaretoken": token}, **extra)


def try_login(client: Client, username: str, password: str):
    client.get(reverse("admin:login"))
    return post(client, reverse("admin:login"), {"username": username, "password": password, "next": "/admin/"})


def log_in(username: str, password: str = PASSWORD) -> Client:
    client = browser()
    response = try_login(client, username, password)
    assert response.status_code == 302, response.content.decode()[-2000:]
    return client


def form_token(page: str) -> str:
    return re.search(r'name="token" value="([^"]+)"', page)[1]
