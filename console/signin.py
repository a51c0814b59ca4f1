"""Signing in to the console by email and password (K1), throttled like the
admin's login (tenants.staff_login's counters: failures per email and per
client address, held in Django's cache), and with a session that ends after
HOPBASE_CONSOLE_SESSION_AGE seconds (K4).
"""

from __future__ import annotations

import logging

from django import forms
from django.conf import settings
from django.contrib.auth import authenticate, login
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest

from console.models import TenantMembership
from core import loggers
from core.client_address import client_address
from tenants.staff_login import WINDOW, clear_username, locked, record_failure

logger = logging.getLogger(loggers.CONSOLE_SIGNIN)

WRONG = "That email and password do not match an account of the console. Check both and try again."
THROTTLED = f"Too many failed sign-ins for this email or from this address. Try again in {WINDOW // 60} minutes."


class SignInForm(forms.Form):
    email = forms.EmailField(label="Email", max_length=150,
                             widget=forms.EmailInput(attrs={"autocomplete": "email", "autofocus": True}))
    password = forms.CharField(label="Password", strip=False,
                               widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))

    def __init__(self, request: HttpRequest, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        self.user: AbstractBaseUser | None = None

    def clean(self) -> dict:
        cleaned = super().clean()
        email = (cleaned.get("email") or "").strip().lower()
        password = cleaned.get("password")
        if not email or not password:
            return cleaned
        address = client_address(self.request)
        # Checked before the password, so a lucky guess during a lock-out learns nothing.
        if locked(email, address):
            logger.warning("console sign-in refused: too many failures (email %r, address %s)", email, address)
            raise forms.ValidationError(THROTTLED, code="throttled")
        user = authenticate(self.request, username=email, password=password)
        # A staff user with no membership is as unknown here as a wrong password.
        if user is None or not TenantMembership.objects.filter(user_id=user.pk).exists():
            record_failure(email, address)
            raise forms.ValidationError(WRONG, code="invalid_login")
        clear_username(email)
        self.user = user
        return cleaned


def sign_in(request: HttpRequest, user: AbstractBaseUser) -> None:
    login(request, user)
    request.session.set_expiry(settings.HOPBASE_CONSOLE_SESSION_AGE)
