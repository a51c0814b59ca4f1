"""Invitations (console.invitations; K1): an owner or an operator invites an
email as owner or member; the one-time link works once and until it
expires, makes the person and signs them in; mail carries it where mail is
set up. A member cannot invite, a used, expired, cancelled or made-up link
is refused with a clear page, and nothing is made."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from console.models import Invitation, TenantMembership
from tests.support.console_cast import PASSWORD, cast, email, fast_passwords, signed_in  # noqa: F401 (a fixture)
from tests.support.smtp_sink import SmtpSink

pytestmark = pytest.mark.django_db
LINK = re.compile(r"https?://[^\s<\"]+/console/invite/([A-Za-z0-9_-]+)/")


@pytest.fixture
def people():
    return cast()


def invite(owner, address: str, role: str = "member") -> str:
    response = signed_in(owner).post("/console/people/", {"email": address, "role": role})
    assert response.status_code == 200, response.content.decode()
    return LINK.search(response.content.decode()).group(0)


def join(link: str, password: str = PASSWORD, again: str | None = None) -> tuple[Client, object]:
    client = Client()
    response = client.post(link, {"password": password, "password_again": password if again is None else again})
    return client, response


def test_an_owner_invites_and_the_link_makes_a_signed_in_member(people):
    address = email("dora")
    link = invite(people.alice, address, "member")
    assert Client().get(link).status_code == 200
    client, response = join(link)
    assert response.status_code == 302 and response["Location"] == "/console/"
    membership = TenantMembership.objects.get(user__username=address)
    assert membership.tenant == people.tenant_a and membership.role == "member"
    assert client.get("/console/").status_code == 200
    assert Client().login(username=address, password=PASSWORD)
    invitation = Invitation.objects.get(email=address)
    assert invitation.accepted_at is not None
    entry = LogEntry.objects.get(object_id=str(invitation.pk), action_flag=ADDITION)
    assert entry.user_id == people.alice.user.pk and link.rsplit("/", 2)[-2] not in entry.change_message


def test_the_link_works_once(people):
    link = invite(people.alice, email("eve"))
    join(link)
    _, again = join(link, "another long passphrase 77")
    assert again.status_code == 410 and "has been used already" in again.content.decode()


def test_an_expired_link_is_refused_and_makes_no_one(people):
    address = email("fay")
    link = invite(people.alice, address)
    Invitation.objects.filter(email=address).update(expires_at=timezone.now() - timedelta(seconds=1))
    _, response = join(link)
    assert response.status_code == 410 and "has expired" in response.content.decode()
    assert not get_user_model().objects.filter(username=address).exists()


def test_a_made_up_link_is_a_404(people):
    response = Client().get("/console/invite/" + "x" * 43 + "/")
    assert response.status_code == 404 and "not valid" in response.content.decode()


def test_a_weak_or_mismatched_password_keeps_the_invitation_open(people):
    address = email("gus")
    link = invite(people.alice, address)
    _, weak = join(link, "short")
    _, differ = join(link, PASSWORD, PASSWORD + "!")
    assert weak.status_code == 400 and "too short" in weak.content.decode()
    assert differ.status_code == 400 and "The two passwords differ." in differ.content.decode()
    assert not get_user_model().objects.filter(username=address).exists()
    assert join(link)[1].status_code == 302


def test_an_owner_cancels_an_invitation_and_its_link_stops_working(people):
    address = email("hal")
    link = invite(people.alice, address)
    invitation = Invitation.objects.get(email=address)
    assert signed_in(people.alice).post(f"/console/people/invitations/{invitation.pk}/cancel/").status_code == 302
    assert join(link)[1].status_code == 410


@pytest.mark.parametrize(("form", "message"), [
    ({"email": "not-an-email", "role": "member"}, "is not an email address"),
    ({"email": "ok@example.com", "role": "admin"}, "is not one of owner, member"),
])
def test_a_bad_invitation_is_refused_on_the_page(people, form, message):
    response = signed_in(people.alice).post("/console/people/", form)
    assert response.status_code == 400 and message in response.content.decode()
    assert not Invitation.objects.exists()


def test_one_of_the_tenants_own_people_is_not_invited_again(people):
    response = signed_in(people.alice).post("/console/people/", {"email": people.bob.user.email, "role": "owner"})
    assert response.status_code == 400 and "is one of your people already" in response.content.decode()


def test_an_owner_cannot_learn_whether_another_tenants_person_has_an_account(people):
    """Inviting someone with an account elsewhere looks like inviting anyone:
    only the acceptance page, the invitee's own, says they have one."""
    theirs, nobodys = people.charlie.user.email, email("nobody")
    pages = [signed_in(people.alice).post("/console/people/", {"email": address, "role": "member"})
             for address in (theirs, nobodys)]
    assert [page.status_code for page in pages] == [200, 200]
    seen = [re.sub(r'value="[A-Za-z0-9]{64}"', "CSRF", LINK.sub("LINK", page.content.decode().replace(address, "X")))
            for page, address in zip(pages, (theirs, nobodys))]
    assert seen[0] == seen[1]  # the same page, whoever the address is
    link = LINK.search(pages[0].content.decode()).group(0)
    client, refused = join(link)
    assert refused.status_code == 409 and "has a HopBase account already" in refused.content.decode()
    assert not TenantMembership.objects.filter(user__username=theirs, tenant=people.tenant_a).exists()


def test_a_member_sees_people_but_a_crafted_invitation_is_403(people):
    client = signed_in(people.bob)
    page = client.get("/console/people/").content.decode()
    assert people.alice.user.email in page and "Invite someone" not in page
    assert client.post("/console/people/", {"email": email("ian"), "role": "owner"}).status_code == 403
    assert not Invitation.objects.exists()


def test_another_tenants_invitation_cannot_be_cancelled(people):
    invite(people.charlie, email("jo"))
    theirs = Invitation.objects.get(tenant=people.tenant_b)
    assert signed_in(people.alice).post(f"/console/people/invitations/{theirs.pk}/cancel/").status_code == 404
    assert Invitation.objects.open().filter(pk=theirs.pk).exists()
    assert theirs.email.encode() not in signed_in(people.alice).get("/console/people/").content


def test_with_mail_set_up_the_link_goes_to_the_address_only(people, settings):
    """The invitation binds its email: the owner who made it never sees the
    link, so they cannot accept it as someone else's address."""
    settings.EMAIL_HOST = "smtp.example.com"  # the test run's backend keeps mail in memory
    address = email("kim")
    page = signed_in(people.alice).post("/console/people/", {"email": address, "role": "owner"}).content.decode()
    assert "on its way" in page and "only they can accept it" in page
    assert LINK.search(page) is None
    (message,) = mail.outbox
    assert message.to == [address]
    client, response = join(LINK.search(message.body).group(0))
    assert response.status_code == 302
    assert TenantMembership.objects.get(user__username=address).tenant == people.tenant_a


def test_the_link_goes_out_through_a_real_smtp_conversation(people, settings):
    sink = SmtpSink()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", sink.port
        settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
        settings.DEFAULT_FROM_EMAIL = "HopBase <console@hopbase.test>"
        address = email("max")
        page = signed_in(people.alice).post("/console/people/", {"email": address, "role": "member"}).content
        recipients, message = sink.next_message()
    finally:
        sink.close()
    assert recipients == [address] and message["From"] == "HopBase <console@hopbase.test>"
    assert people.tenant_a.name in message["Subject"]
    assert LINK.search(message.get_content()) is not None and LINK.search(page.decode()) is None


def test_the_command_prints_a_link_that_works(people, settings):
    settings.HOPBASE_PUBLIC_URL = "https://llm.example.com"
    out = io.StringIO()
    address = email("lee")
    call_command("invitetenantuser", people.tenant_a.name, address, "--role", "owner", stdout=out)
    link = LINK.search(out.getvalue()).group(0)
    assert link.startswith("https://llm.example.com/console/invite/")
    assert join(link.removeprefix("https://llm.example.com"))[1].status_code == 302
    assert TenantMembership.objects.get(user__username=address).role == "owner"
    with pytest.raises(CommandError, match="one of your people already"):
        call_command("invitetenantuser", people.tenant_a.name, address, "--role", "member", stdout=io.StringIO())
    with pytest.raises(CommandError, match="has an account already"):  # an operator may know, elsewhere too
        call_command("invitetenantuser", people.tenant_b.name, address, "--role", "member", stdout=io.StringIO())


def test_a_live_link_never_reaches_the_log(people):
    import logging

    handler = next(h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler)  # settings.LOGGING
    out = io.StringIO()
    stream = handler.setStream(out)
    try:
        link = invite(people.alice, email("ned"))
        _, weak = join(link, "short")  # a 400, which Django logs with the request's path
        forged = Client(enforce_csrf_checks=True).post(link, {"password": PASSWORD, "password_again": PASSWORD})
    finally:
        handler.setStream(stream)
    token = link.rstrip("/").rsplit("/", 1)[-1]
    # Django's own handlers (DEBUG's console, mail to ADMINS) would write before this filter.
    assert not logging.getLogger("django").handlers
    assert weak.status_code == 400 and forged.status_code == 403
    assert "/console/invite/…" in out.getvalue() and token not in out.getvalue()
