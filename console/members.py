"""People of a tenant (K1): made here, checked once, by the
``createtenantuser`` command and by invitations; removed by an owner.

Each refusal is a ``MemberError`` naming what was wrong (``field``), raised
before anything is written.
"""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from console.models import Role, TenantMembership
from tenants.models import Tenant


class MemberError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def normal_email(raw: str) -> str:
    """The form an email is stored and signed in with: trimmed, lower case
    (people type their address in any case; two spellings must not be two people)."""
    email = raw.strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise MemberError("email", f"{raw.strip()!r} is not an email address") from None
    max_length = get_user_model()._meta.get_field("username").max_length
    if len(email) > max_length:
        raise MemberError("email", f"longer than {max_length} characters")
    return email


def add_member(tenant: Tenant, email: str, role: str, password: str) -> TenantMembership:
    """A new console user of ``tenant``: a plain (not staff) Django user whose
    username is the email, and the membership, in one transaction."""
    email = normal_email(email)
    if role not in Role.values:
        raise MemberError("role", f"{role!r} is not one of {', '.join(Role.values)}")
    User = get_user_model()
    # A person removed from a tenant keeps a user row (the audit trail names
    # it), inactive: invited again, they take it up anew.
    removed = User._default_manager.filter(username=email, is_active=False, is_staff=False, is_superuser=False,
                                           membership__isnull=True).first()
    user: AbstractBaseUser = removed or User(username=email, email=email, is_staff=False, is_superuser=False)
    user.is_active = True
    if not password:
        raise MemberError("password", "empty")
    try:
        validate_password(password, user)
    except ValidationError as error:
        raise MemberError("password", " ".join(error.messages)) from None
    user.set_password(password)
    try:
        with transaction.atomic():
            user.save()
            return TenantMembership.objects.create(user=user, tenant=tenant, role=role)
    except IntegrityError:  # the username is unique: this email is someone's already
        raise MemberError("email", f"{email} already has an account") from None


def remove_member(owner: TenantMembership, membership_id: int) -> TenantMembership | None:
    """Take one of the tenant's people out of it: the membership goes, the
    user is made inactive (which ends their sessions) and kept for the audit
    trail. None if the tenant has no such person; ``MemberError`` for its
    last owner (a tenant is never left with no one to manage its keys)."""
    with transaction.atomic():
        people = TenantMembership.objects.select_for_update().filter(tenant=owner.tenant)
        leaving = people.select_related("user").filter(pk=membership_id).first()
        if leaving is None:
            return None
        if leaving.is_owner and not people.filter(role=Role.OWNER).exclude(pk=leaving.pk).exists():
            raise MemberError("role", "the last owner cannot be removed: make another owner first")
        user = leaving.user
        leaving.delete()
        user.is_active = False
        user.save(update_fields=["is_active"])
        LogEntry.objects.log_actions(owner.user.pk, [user], CHANGE, f"Removed from the tenant console of "
                                     f"{owner.tenant.name} (was {leaving.role}); sign-in disabled.", single_object=True)
    return leaving
