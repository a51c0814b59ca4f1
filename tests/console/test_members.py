"""People of a tenant (console.members, ``createtenantuser``, K1): one
membership per user, the email as the sign-in name, Django's password
validators; a refusal names its flag and saves nothing."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from console.models import TenantMembership
from tests.support.console_cast import PASSWORD, email
from tests.support.factories import make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def create(*args: str, password: str = PASSWORD) -> str:
    out = io.StringIO()
    call_command("createtenantuser", *args, stdin=io.StringIO(password + "\n"), stdout=out)
    return out.getvalue()


def nothing_saved() -> bool:
    return not get_user_model().objects.exists() and not TenantMembership.objects.exists()


def test_it_creates_an_owner_who_signs_in_with_the_email_in_lower_case():
    tenant = make_tenant()
    address = email("Alice").replace("alice", "ALICE")
    out = create(tenant.name, address, "--role", "owner", "--password-stdin")
    membership = TenantMembership.objects.get()
    assert membership.tenant == tenant and membership.role == "owner" and membership.is_owner
    user = membership.user
    assert user.username == user.email == address.lower()
    assert user.check_password(PASSWORD) and not user.is_staff and not user.is_superuser
    assert f"of tenant {tenant.name}" in out and PASSWORD not in out


@pytest.mark.parametrize(
    ("args", "password", "names"),
    [
        (["nosuchtenant", "a@example.com", "--role", "owner", "--password-stdin"], PASSWORD, "unknown tenant"),
        (["T", "a@example.com", "--role", "admin", "--password-stdin"], PASSWORD, "--role"),
        (["T", "not-an-email", "--role", "member", "--password-stdin"], PASSWORD, "EMAIL"),
        (["T", "a@example.com", "--role", "member"], PASSWORD, "--password-stdin"),
        (["T", "a@example.com", "--role", "member", "--password-stdin"], "", "--password-stdin"),
        (["T", "a@example.com", "--role", "member", "--password-stdin"], "short", "password"),
        (["T", "a@example.com", "--role", "member", "--password-stdin"], "12345678901234", "password"),
    ],
)
def test_it_refuses_bad_input_naming_the_flag_and_saves_nothing(args, password, names):
    make_tenant("T")
    with pytest.raises(CommandError, match=names):
        create(*args, password=password)
    assert nothing_saved()


def test_an_email_already_taken_is_refused_in_any_case():
    tenant = make_tenant()
    create(tenant.name, "taken@example.com", "--role", "member", "--password-stdin")
    with pytest.raises(CommandError, match="EMAIL: taken@example.com already has an account"):
        create(make_tenant().name, "Taken@Example.com", "--role", "owner", "--password-stdin")
    assert TenantMembership.objects.count() == 1


def test_the_database_allows_one_membership_per_user_and_known_roles_only():
    tenant = make_tenant()
    create(tenant.name, email("bob"), "--role", "member", "--password-stdin")
    user = TenantMembership.objects.get().user
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantMembership.objects.create(user=user, tenant=make_tenant(), role="owner")
    other = get_user_model().objects.create(username=email("eve"))
    with pytest.raises(IntegrityError), transaction.atomic():
        TenantMembership.objects.create(user=other, tenant=tenant, role="admin")


# -- an owner removes people (console.members.remove_member) -------------------


def test_an_owner_removes_a_member_who_is_signed_out_and_cannot_sign_in_again():
    from django.contrib.admin.models import LogEntry

    from tests.support.console_cast import cast, signed_in

    people = cast()
    bobs_session = signed_in(people.bob)
    response = signed_in(people.alice).post(f"/console/people/{people.bob.pk}/remove/")
    assert response.status_code == 302 and not TenantMembership.objects.filter(pk=people.bob.pk).exists()
    bob = get_user_model().objects.get(pk=people.bob.user.pk)
    assert not bob.is_active and bobs_session.get("/console/")["Location"].startswith("/console/login/")
    entry = LogEntry.objects.get(object_id=str(bob.pk))
    assert entry.user_id == people.alice.user.pk and "was member" in entry.change_message


def test_the_last_owner_is_not_removed_and_a_member_cannot_remove_anyone():
    from tests.support.console_cast import cast, signed_in

    people = cast()
    refused = signed_in(people.alice).post(f"/console/people/{people.alice.pk}/remove/", follow=True)
    assert "the last owner cannot be removed" in refused.content.decode()
    assert signed_in(people.bob).post(f"/console/people/{people.alice.pk}/remove/").status_code == 403
    assert signed_in(people.alice).post(f"/console/people/{people.charlie.pk}/remove/").status_code == 404
    assert TenantMembership.objects.filter(pk__in=[people.alice.pk, people.charlie.pk]).count() == 2


def test_someone_removed_can_be_invited_back():
    import re

    from django.test import Client

    from tests.support.console_cast import cast, signed_in

    people = cast()
    signed_in(people.alice).post(f"/console/people/{people.bob.pk}/remove/")
    page = signed_in(people.alice).post("/console/people/", {"email": people.bob.user.email, "role": "owner"})
    link = re.search(r"/console/invite/[A-Za-z0-9_-]+/", page.content.decode()).group(0)
    new_password = "back again with a new passphrase"
    assert Client().post(link, {"password": new_password, "password_again": new_password}).status_code == 302
    back = TenantMembership.objects.get(user__username=people.bob.user.email)
    assert back.role == "owner" and back.user.pk == people.bob.user.pk and back.user.is_active
