"""Admin logins, throttled: after repeated failures for one username, or
from one client address, the login form refuses before it checks the
password (so a lucky guess during the lock-out learns nothing).

Counted in Django's cache (Redis with REDIS_URL, shared by every process;
otherwise this process's memory): a window opens with the first failure and
lasts ``WINDOW`` seconds; ``MAX_FAILURES_PER_USERNAME`` failures for a
username, or ``MAX_FAILURES_PER_ADDRESS`` from an address (the client address
of core.client_address, X-Forwarded-For only from a trusted proxy), lock
it until the window ends. A successful login clears its username's count,
not its address's. If the cache cannot be reached, logins are not throttled
(a warning is logged): the admin must stay usable through a Redis outage.
"""

from __future__ import annotations

import hashlib
import logging

from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.cache import cache
from django.core.exceptions import ValidationError

from core import loggers
from core.client_address import client_address

logger = logging.getLogger(loggers.STAFF_LOGIN)

MAX_FAILURES_PER_USERNAME = 5
MAX_FAILURES_PER_ADDRESS = 20
WINDOW = 15 * 60  # seconds
PREFIX = "hopbase:login-failures:"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def counters(username: str, address: str) -> list[tuple[str, int]]:
    """``(cache key, limit)`` of each count a login attempt falls under."""
    return [
        (f"{PREFIX}user:{_digest(username.strip().casefold())}", MAX_FAILURES_PER_USERNAME),
        (f"{PREFIX}address:{_digest(address)}", MAX_FAILURES_PER_ADDRESS),
    ]


def locked(username: str, address: str) -> bool:
    keys = counters(username, address)
    try:
        counts = cache.get_many([key for key, _ in keys])
    except Exception:
        logger.warning("login throttle: the cache is unreachable; this login is not throttled", exc_info=True)
        return False
    return any(counts.get(key, 0) >= limit for key, limit in keys)


def record_failure(username: str, address: str) -> None:
    try:
        for key, _limit in counters(username, address):
            if not cache.add(key, 1, WINDOW):  # the first failure opens the window
                try:
                    cache.incr(key)
                except ValueError:  # the window closed in between
                    cache.add(key, 1, WINDOW)
    except Exception:
        logger.warning("login throttle: the cache is unreachable; a failed login was not counted", exc_info=True)


def clear_username(username: str) -> None:
    try:
        cache.delete(counters(username, "")[0][0])
    except Exception:
        logger.warning("login throttle: the cache is unreachable", exc_info=True)


class StaffLoginForm(AdminAuthenticationForm):
    """The admin's login form, throttled."""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "throttled": (
            "Too many failed logins for this username or from this address. "
            f"Try again in {WINDOW // 60} minutes."
        ),
    }

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        address = client_address(self.request) if self.request is not None else "unknown"
        if locked(username, address):
            logger.warning("admin login refused: too many failures (username %r, address %s)", username, address)
            raise ValidationError(self.error_messages["throttled"], code="throttled")
        try:
            cleaned = super().clean()
        except ValidationError:
            if self.user_cache is None and self.cleaned_data.get("password"):
                # A wrong password (not: a right one for a user who may not log in here).
                record_failure(username, address)
            raise
        clear_username(username)
        return cleaned
