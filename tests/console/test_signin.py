"""Signing in to the console (console.signin, console.access; K1, K4): by
email and password, throttled, with a session that expires; anonymous
visitors sent to the sign-in page; a staff user with no membership sees no
console."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from console.signin import THROTTLED, WRONG
from tenants import staff_login
from tests.support.console_cast import PASSWORD, cast, email

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def sign_in(client: Client, address: str, password: str, next_url: str = ""):
    return client.post("/console/login/", {"email": address, "password": password, "next": next_url})


def test_it_signs_in_by_email_in_any_case_and_goes_to_the_page_asked_for():
    alice = cast().alice
    client = Client()
    assert client.get("/console/logs/?status=failed")["Location"] == "/console/login/?next=/console/logs/%3Fstatus%3Dfailed"
    response = sign_in(client, alice.user.email.upper(), PASSWORD, "/console/logs/?status=failed")
    assert response.status_code == 302 and response["Location"] == "/console/logs/?status=failed"
    assert client.get("/console/").status_code == 200


def test_it_never_sends_a_signed_in_person_off_the_console():
    alice = cast().alice
    response = sign_in(Client(), alice.user.email, PASSWORD, "https://evil.example/console/")
    assert response["Location"] == "/console/"


def test_a_wrong_password_is_a_clear_message_and_no_session():
    alice = cast().alice
    client = Client()
    response = sign_in(client, alice.user.email, "not the password at all")
    assert response.status_code == 400 and WRONG in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_a_staff_user_without_a_membership_cannot_sign_in_and_sees_no_console():
    staff = get_user_model().objects.create_user(username=email("ops"), password=PASSWORD, is_staff=True)
    response = sign_in(Client(), staff.username, PASSWORD)
    assert response.status_code == 400 and WRONG in response.content.decode()
    client = Client()
    client.force_login(staff)
    assert client.get("/console/").status_code == 404


def test_repeated_failures_lock_the_email_even_for_the_right_password():
    alice = cast().alice
    for _ in range(staff_login.MAX_FAILURES_PER_USERNAME):
        assert THROTTLED not in sign_in(Client(), alice.user.email, "wrong wrong wrong").content.decode()
    response = sign_in(Client(), alice.user.email, PASSWORD)
    assert response.status_code == 400 and THROTTLED in response.content.decode()


def test_the_session_expires_after_the_console_session_age(settings):
    settings.HOPBASE_CONSOLE_SESSION_AGE = 600
    alice = cast().alice
    client = Client()
    sign_in(client, alice.user.email, PASSWORD)
    assert client.session.get_expiry_age() == 600


def test_signing_out_is_a_post_and_ends_the_session():
    alice = cast().alice
    client = Client()
    sign_in(client, alice.user.email, PASSWORD)
    assert client.get("/console/logout/").status_code == 405
    assert client.post("/console/logout/")["Location"] == "/console/login/"
    assert client.get("/console/").status_code == 302


def test_every_post_needs_the_csrf_token():
    alice = cast().alice
    client = Client(enforce_csrf_checks=True)
    assert sign_in(client, alice.user.email, PASSWORD).status_code == 403  # no token
    client.get("/console/login/")
    token = client.cookies["csrftoken"].value
    forged = client.post("/console/login/", {"email": alice.user.email, "password": PASSWORD,
                                             "csrfmiddlewaretoken": "x" * 64})
    assert forged.status_code == 403
    good = client.post("/console/login/", {"email": alice.user.email, "password": PASSWORD,
                                           "csrfmiddlewaretoken": token})
    assert good.status_code == 302
