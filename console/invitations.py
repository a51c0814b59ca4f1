"""Invitations (K1): an owner (or an operator, with ``invitetenantuser``)
invites an email as owner or member; the link, made once, works once and
until HOPBASE_CONSOLE_INVITE_AGE; accepting it with a password makes the
person (console.members) and signs them in.

The token is 256 random bits in the link; only its SHA-256 is stored, so
guessing is hopeless and a copy of the table opens nothing. Acceptance
locks the invitation's row, so two tabs accepting at once make one person.

An invitation binds the email it was sent to: where mail is set up, the
link goes to that address only and the owner who made it never sees it, so
whoever accepts it reads that mailbox (without mail the owner hands the
link over, and the email is what they say it is). And an owner learns
nothing of other tenants' people: any address may be invited (only this
tenant's own people are refused, by name); one that has an account already
cannot accept, and is told so on the acceptance page, which is theirs.
Operators (``invitetenantuser``) are told at once.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from console.mail import configured, send
from console.members import MemberError, add_member, normal_email
from console.models import Invitation, Role, TenantMembership
from tenants.models import Tenant


class InvitationRefused(Exception):
    """An invitation that cannot be made or used, with the message the page
    shows and the HTTP status that goes with it."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def path_of(token: str) -> str:
    return f"/console/invite/{token}/"


def invite(tenant: Tenant, email: str, role: str, by: AbstractBaseUser,
           operator: bool = False) -> tuple[Invitation, str]:
    """A new invitation and its token (returned once, never stored), with
    its audit row by ``by``. ``operator``: whether an address with an
    account anywhere is refused at once (an operator may know)."""
    try:
        email = normal_email(email)
    except MemberError as error:
        raise InvitationRefused(f"Email: {error.message}.") from None
    if role not in Role.values:
        raise InvitationRefused(f"Role: {role!r} is not one of {', '.join(Role.values)}.")
    if TenantMembership.objects.filter(tenant=tenant, user__username=email, user__is_active=True).exists():
        raise InvitationRefused(f"{email} is one of your people already.")
    taken = get_user_model()._default_manager.filter(username=email).exclude(
        is_active=False, is_staff=False, is_superuser=False, membership__isnull=True)  # one removed may come back
    if operator and taken.exists():
        raise InvitationRefused(f"{email} cannot be invited: it has an account already.")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            tenant=tenant, email=email, role=role, token_hash=_hash(token), invited_by=by,
            expires_at=timezone.now() + timedelta(seconds=settings.HOPBASE_CONSOLE_INVITE_AGE),
        )
        _audit(by, invitation, ADDITION,
               f"Invited {email} as {role}, until {invitation.expires_at:%Y-%m-%d %H:%M} UTC.")
    return invitation, token


def mail_set_up() -> bool:
    return configured()


def mail(invitation: Invitation, link: str) -> bool:
    """Send the link to the invited email, where mail is set up; True if sent."""
    return send(invitation.email, f"You are invited to {invitation.tenant.name} on HopBase",
                f"You are invited to the HopBase console of {invitation.tenant.name} as {invitation.role}.\n\n"
                f"Choose your password here (the link works once, until "
                f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC):\n{link}\n")


def usable(token: str) -> Invitation:
    """The invitation this token opens, or ``InvitationRefused`` saying why not."""
    invitation = Invitation.objects.select_related("tenant").filter(token_hash=_hash(token)).first()
    _check(invitation)
    return invitation


def accept(token: str, password: str) -> TenantMembership:
    """The person the invitation makes, with ``password``; the invitation is used up."""
    with transaction.atomic():
        # The invitation's row alone: a lock on its tenant's row would hold the
        # tenant's settlements and request logs while the password is hashed.
        invitation = Invitation.objects.select_for_update(of=("self",)).select_related("tenant").filter(
            token_hash=_hash(token)).first()
        _check(invitation)
        try:
            membership = add_member(invitation.tenant, invitation.email, invitation.role, password)
        except MemberError as error:
            if error.field == "email":  # told to whoever holds the link: the address's owner, where mail is set up
                raise InvitationRefused(f"{invitation.email} has a HopBase account already: sign in with it, "
                                        "or ask whoever invited you.", status=409) from None
            raise InvitationRefused(f"{error.field.capitalize()}: {error.message}.") from None
        invitation.accepted_at = timezone.now()
        invitation.save(update_fields=["accepted_at"])
        _audit(membership.user, invitation, CHANGE, f"Accepted: {invitation.email} joined as {invitation.role}.")
    return membership


def cancel(membership: TenantMembership, invitation_id: int) -> Invitation | None:
    """End one of the tenant's open invitations now; None if it has none such."""
    with transaction.atomic():
        invitation = Invitation.objects.select_for_update().open().filter(
            tenant=membership.tenant, pk=invitation_id).first()
        if invitation is not None:
            invitation.expires_at = timezone.now()
            invitation.save(update_fields=["expires_at"])
            _audit(membership.user, invitation, CHANGE, f"Cancelled the invitation of {invitation.email}.")
    return invitation


def _check(invitation: Invitation | None) -> None:
    if invitation is None:
        raise InvitationRefused("This invitation link is not valid. Ask for a new one.", status=404)
    if invitation.accepted_at is not None:
        raise InvitationRefused("This invitation link has been used already. Sign in instead.", status=410)
    if invitation.expires_at <= timezone.now():
        raise InvitationRefused("This invitation link has expired. Ask for a new one.", status=410)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _audit(user: AbstractBaseUser, invitation: Invitation, flag: int, message: str) -> None:
    LogEntry.objects.log_actions(user.pk, [invitation], flag, message, single_object=True)


def people(tenant: Tenant) -> tuple[list[TenantMembership], list[Invitation]]:
    """The tenant's people and its open invitations."""
    return (list(TenantMembership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")),
            list(Invitation.objects.open().filter(tenant=tenant).order_by("-created_at")))
