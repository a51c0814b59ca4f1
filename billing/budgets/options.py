"""The checks of a budget's settings that the operator commands share
(setbudget, createapikey): each refusal a ``CommandError`` naming its flag,
as core.commands does for the rest."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.core.validators import URLValidator

from billing.budgets.windows import BadPeriod, parse_period
from billing.models import Budget

WEBHOOK_MAX_LENGTH = Budget._meta.get_field("webhook_url").max_length


def parse_budget_period(text: str, flag: str) -> str:
    """The period's canonical spelling (``30`` is ``30s``), the refusal naming ``flag``."""
    try:
        return parse_period(text)
    except BadPeriod as error:
        raise CommandError(f"{flag}: {error}") from None


def parse_percent(text: str, flag: str) -> int:
    """An alert threshold: a whole percent of the limit, 1 to 100 (the column's constraint)."""
    raw = text.strip()
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 100:
        raise CommandError(f"{flag}: {raw!r} is not a whole percent from 1 to 100")
    return int(raw)


def validate_webhook(url: str) -> str:
    """An http(s) URL the column holds (a validator for ``core.commands.checked``)."""
    url = url.strip()
    if len(url) > WEBHOOK_MAX_LENGTH:
        raise ValidationError(f"longer than {WEBHOOK_MAX_LENGTH} characters")
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise ValidationError(f"{url!r} is not an http(s) URL") from None
    return url
