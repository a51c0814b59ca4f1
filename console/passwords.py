"""Password resets of console users (K1) by one-time expiring links: Django's
own token generator, whose token changes once the password does (or the
person signs in), and ends after PASSWORD_RESET_TIMEOUT. The link is printed
by ``resettenantuser`` for the operator to hand over, and mailed when the
person asks on the sign-in page where mail is set up.
"""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_decode, urlsafe_base64_encode

from console.mail import later, send

# A second mail to the same address within this many seconds is not sent
# (the page answers the same): asking cannot flood someone's mailbox.
MAIL_INTERVAL = 300


class ResetRefused(Exception):
    pass


def console_user(email: str) -> AbstractBaseUser | None:
    """The active console user (one with a membership) signing in with this email."""
    return get_user_model()._default_manager.filter(
        username=email.strip().lower(), is_active=True, membership__isnull=False).first()


def path_of(user: AbstractBaseUser) -> str:
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    return f"/console/reset/{uid}/{default_token_generator.make_token(user)}/"


def mail_link(email: str, base_url: str) -> None:
    """Mail a reset link to ``email`` if it is a console user's, at most
    once per MAIL_INTERVAL, after the request: the page answers the same, as
    soon, either way (no account probing)."""
    user = console_user(email)
    if user is not None:
        later(_mail_once, user, base_url + path_of(user))


def _mail_once(user: AbstractBaseUser, link: str) -> None:
    if cache.add(f"console-reset-mail:{user.get_username()}", 1, MAIL_INTERVAL):
        send_link(user, link)


def send_link(user: AbstractBaseUser, link: str) -> bool:
    """Mail ``link`` to the user, where mail is set up; True if sent."""
    return send(user.email, "Reset your HopBase console password",
                "Here is a link to choose a new password for your HopBase console account. It works once, "
                f"for a limited time:\n{link}\n\nIf you did not ask for it, ignore this mail: "
                "your password stays as it is.\n")


def holder(uidb64: str, token: str) -> AbstractBaseUser:
    """The console user this link is for, or ``ResetRefused``."""
    try:
        pk = int(urlsafe_base64_decode(uidb64).decode())
    except (ValueError, UnicodeDecodeError):
        raise ResetRefused from None
    user = get_user_model()._default_manager.filter(pk=pk, is_active=True, membership__isnull=False).first()
    if user is None or not default_token_generator.check_token(user, token):
        raise ResetRefused
    return user


def reset(user: AbstractBaseUser, password: str, again: str) -> None:
    """Set the new password (which ends the link), or ``ValidationError``."""
    if password != again:
        raise ValidationError("The two passwords differ.")
    validate_password(password, user)
    user.set_password(password)
    user.save(update_fields=["password"])
    LogEntry.objects.log_actions(user.pk, [user], CHANGE, "Password reset by a one-time link.", single_object=True)
