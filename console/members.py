"""Making people of a tenant (K1): checked here once, used by the
``createtenantuser`` command (and, later, invitations).

Each refusal is a ``MemberError`` naming what was wrong (``field``), raised
before anything is written.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from console.models import Role, TenantMembership
from hopbase.models import Tenant


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
    user: AbstractBaseUser = User(username=email, email=email, is_staff=False, is_superuser=False, is_active=True)
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
