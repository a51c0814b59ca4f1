"""Password resets (console.passwords; K1): a one-time link, printed by
``resettenantuser`` or mailed from the sign-in page where mail is set up,
sets a new password once; asking never tells whether an email has an
account; a used, altered or made-up link is refused."""

from __future__ import annotations

import io
import re

import pytest
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from console.mail import later
from tests.support.console_cast import PASSWORD, cast, fast_passwords, signed_in  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db
LINK = re.compile(r"/console/reset/[A-Za-z0-9_-]+/[A-Za-z0-9-]+/")
NEW = "a brand new passphrase 2026"


def mailed(count: int) -> list:
    """The test outbox once it holds ``count`` messages (sent by the mail thread), waited for 10 s at most."""
    later(lambda: None).result(timeout=10)  # one thread, in order: what was asked before is done
    assert len(mail.outbox) == count, mail.outbox
    return mail.outbox


@pytest.fixture
def people():
    return cast()  # emails unique per run: no mail interval carries over


def printed_link(address: str) -> str:
    out = io.StringIO()
    call_command("resettenantuser", address, stdout=out)
    return LINK.search(out.getvalue()).group(0)


def test_the_printed_link_sets_a_new_password_once(people):
    link = printed_link(people.bob.user.email)
    assert Client().get(link).status_code == 200
    response = Client().post(link, {"password": NEW, "password_again": NEW})
    assert response.status_code == 302 and response["Location"] == "/console/login/"
    assert Client().login(username=people.bob.user.email, password=NEW)
    assert not Client().login(username=people.bob.user.email, password=PASSWORD)
    again = Client().post(link, {"password": PASSWORD, "password_again": PASSWORD})
    assert again.status_code == 410 and "expired or has been used" in again.content.decode()


def test_a_reset_signs_out_the_sessions_signed_in_with_the_old_password(people):
    session = signed_in(people.bob)
    assert session.get("/console/").status_code == 200
    Client().post(printed_link(people.bob.user.email), {"password": NEW, "password_again": NEW})
    assert session.get("/console/")["Location"].startswith("/console/login/")


@pytest.mark.parametrize(("password", "again", "message"), [
    ("short", "short", "too short"),
    (NEW, NEW + "!", "The two passwords differ."),
])
def test_a_weak_or_mismatched_new_password_changes_nothing(people, password, again, message):
    link = printed_link(people.bob.user.email)
    response = Client().post(link, {"password": password, "password_again": again})
    assert response.status_code == 400 and message in response.content.decode()
    assert Client().login(username=people.bob.user.email, password=PASSWORD)


def test_an_altered_link_is_refused(people):
    link = printed_link(people.bob.user.email)
    altered = link[:-3] + ("aa/" if not link.endswith("aa/") else "bb/")
    assert Client().get(altered).status_code == 410
    assert Client().get("/console/reset/!!/nonsense/").status_code == 410


def test_the_command_refuses_an_email_without_a_console_account(people):
    with pytest.raises(CommandError, match="is no active console user"):
        call_command("resettenantuser", "nobody@example.com", stdout=io.StringIO())


def test_without_mail_the_page_says_to_ask_the_operator(people):
    page = Client().get("/console/password/forgot/").content.decode()
    assert "Ask your operator" in page and 'name="email"' not in page


def test_with_mail_a_link_is_sent_to_an_account_and_the_answer_is_the_same_for_anyone(people, settings):
    settings.EMAIL_HOST = "smtp.example.com"  # the test run's backend keeps mail in memory
    known = Client().post("/console/password/forgot/", {"email": people.alice.user.email.upper()})
    unknown = Client().post("/console/password/forgot/", {"email": "nobody@example.com"})
    assert known.content == unknown.content and known.status_code == unknown.status_code == 200
    (message,) = mailed(1)  # sent after the answer, off the request
    assert message.to == [people.alice.user.email]
    link = LINK.search(message.body).group(0)
    assert Client().post(link, {"password": NEW, "password_again": NEW}).status_code == 302
    Client().post("/console/password/forgot/", {"email": people.bob.user.email})
    Client().post("/console/password/forgot/", {"email": people.bob.user.email})
    assert len(mailed(2)) == 2  # a second ask within the interval sends nothing more
