"""Admin logins throttled (tenants.staff_login): repeated failures lock a
username and an address, counted from the client address that
core.client_address gives (X-Forwarded-For only from a trusted proxy)."""

from __future__ import annotations

import itertools
import time

import pytest
from django.core.cache import cache
from django.urls import reverse

from tenants import staff_login
from tests.support.staff_checks import PASSWORD, browser, create_staff, log_in, try_login

pytestmark = pytest.mark.django_db

_names = itertools.count(1)


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff() -> str:
    username = f"staff{next(_names)}-{time.monotonic_ns()}"
    create_staff(username, "operator")
    return username


def logged_in(response) -> bool:
    return response.status_code == 302


def refused_as_throttled(response) -> bool:
    return response.status_code == 200 and "Too many failed logins" in response.content.decode()


def test_a_username_is_locked_after_repeated_failures_even_for_the_right_password(staff):
    client = browser()
    for _ in range(staff_login.MAX_FAILURES_PER_USERNAME):
        response = try_login(client, staff, "wrong-password-here")
        assert response.status_code == 200 and not refused_as_throttled(response)
    assert refused_as_throttled(try_login(client, staff, PASSWORD))
    # From anywhere: the lock is the username's.
    assert refused_as_throttled(try_login(browser(), staff, PASSWORD))
    assert "_auth_user_id" not in client.session


def test_an_address_is_locked_after_failures_across_usernames(staff):
    client = browser()
    for n in range(staff_login.MAX_FAILURES_PER_ADDRESS):
        try_login(client, f"guess-{n}-{staff}", "wrong-password-here")
    assert refused_as_throttled(try_login(client, staff, PASSWORD))
    assert logged_in(try_login(browser(), staff, PASSWORD))  # another address is not held up


def test_a_successful_login_clears_its_usernames_count(staff):
    client = browser()
    for _ in range(staff_login.MAX_FAILURES_PER_USERNAME - 1):
        try_login(client, staff, "wrong-password-here")
    assert logged_in(try_login(client, staff, PASSWORD))
    for _ in range(staff_login.MAX_FAILURES_PER_USERNAME - 1):
        try_login(browser(), staff, "wrong-password-here")
    assert logged_in(try_login(browser(), staff, PASSWORD))


def test_the_lock_ends_with_its_window(staff, monkeypatch):
    monkeypatch.setattr(staff_login, "WINDOW", 1)
    for _ in range(staff_login.MAX_FAILURES_PER_USERNAME):
        try_login(browser(), staff, "wrong-password-here")
    assert refused_as_throttled(try_login(browser(), staff, PASSWORD))
    time.sleep(1.5)
    assert logged_in(try_login(browser(), staff, PASSWORD))


def test_a_forged_forwarded_for_does_not_escape_the_address_count(staff, settings):
    settings.HOPBASE_TRUSTED_PROXIES = ()
    client = browser()
    for n in range(staff_login.MAX_FAILURES_PER_ADDRESS):
        client.defaults["HTTP_X_FORWARDED_FOR"] = f"203.0.113.{n + 1}"
        try_login(client, f"forged-{n}-{staff}", "wrong-password-here")
    client.defaults["HTTP_X_FORWARDED_FOR"] = "203.0.113.200"
    assert refused_as_throttled(try_login(client, staff, PASSWORD))


def test_behind_a_trusted_proxy_each_client_is_counted_apart(staff, settings):
    settings.HOPBASE_TRUSTED_PROXIES = ("10.0.0.0/8",)
    proxy = browser()
    proxy.defaults["REMOTE_ADDR"] = "10.1.2.3"
    proxy.defaults["HTTP_X_FORWARDED_FOR"] = "192.0.2.66"
    for n in range(staff_login.MAX_FAILURES_PER_ADDRESS):
        try_login(proxy, f"proxied-{n}-{staff}", "wrong-password-here")
    assert refused_as_throttled(try_login(proxy, staff, PASSWORD))
    proxy.defaults["HTTP_X_FORWARDED_FOR"] = "192.0.2.67"  # another client through the same proxy
    assert logged_in(try_login(proxy, staff, PASSWORD))


def test_an_unreachable_cache_does_not_lock_staff_out(staff, monkeypatch):
    def down(*args, **kwargs):
        raise ConnectionError("cache down")

    for name in ("get_many", "add", "incr", "delete"):
        monkeypatch.setattr(cache, name, down)
    try_login(browser(), staff, "wrong-password-here")
    assert logged_in(try_login(browser(), staff, PASSWORD))


def test_a_logged_in_operator_reaches_the_admin(staff):
    client = log_in(staff)
    assert client.get(reverse("admin:index")).status_code == 200
