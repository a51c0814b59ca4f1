"""Keys an owner manages from the console (K3): create within what the
operator allowed the tenant (console.allowance), show the secret once,
revoke, rotate. Each change is written with its audit row (Django's admin
log, which operators read in the admin as hopbase.audit) in one
transaction, naming the console user; never the secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.http import QueryDict
from django.utils import timezone

from billing.budgets.windows import BadPeriod, parse_period
from billing.models import Budget
from console.allowance import RATE_LIMITS, Allowance, allowance
from console.models import TenantMembership
from tenants.models import ApiKey, Tenant

LABEL_MAX_LENGTH = ApiKey._meta.get_field("label").max_length
LIMIT_NAMES = {"rpm": "RPM", "tpm": "TPM", "concurrency": "Concurrency"}
BUDGET_PERIODS = ("1d", "1w", "1mo", "total")
# The grace periods an owner picks from when rotating: the old secret works this long.
GRACES = {0: "none (refused at once)", 3600: "1 hour", 86400: "24 hours", 7 * 86400: "7 days"}


class KeyRefused(ValueError):
    """A key the owner may not make, with the message the page shows."""


@dataclass(frozen=True)
class KeyRequest:
    label: str
    models: list[str]
    limits: dict[str, int | None]  # rpm, tpm, concurrency; None: as loose as allowed
    budget: tuple[str, Decimal] | None  # period, USD


def key_request(form: QueryDict) -> KeyRequest:
    """The new-key form's fields, read; a malformed one is ``KeyRefused``.
    ``models`` is a comma list, or one value per checkbox, or both."""
    seen: dict[str, None] = {}
    for value in form.getlist("models"):
        for name in value.split(","):
            if name.strip():
                seen[name.strip()] = None
    limits = {name: _whole(form.get(name, ""), LIMIT_NAMES[name]) for name in RATE_LIMITS}
    return KeyRequest(form.get("name", "").strip(), list(seen), limits, _budget(form))


def _whole(raw: str, name: str) -> int | None:
    raw = raw.strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise KeyRefused(f"{name} must be a whole number from 1 (or empty).")
    return int(raw)


def _budget(form: QueryDict) -> tuple[str, Decimal] | None:
    raw = form.get("budget_usd", "").strip()
    if not raw:
        return None
    try:
        period = parse_period(form.get("budget_period", "1mo"))
        amount = Decimal(raw)
    except BadPeriod as error:
        raise KeyRefused(f"Budget period: {error}.") from None
    except InvalidOperation:
        raise KeyRefused(f"Budget: {raw!r} is not an amount of USD.") from None
    if not amount.is_finite() or amount < 0 or amount.as_tuple().exponent < -10 or amount >= 10**10:
        raise KeyRefused(f"Budget: {raw!r} is not an amount of USD from 0, to at most 10 decimal places.")
    return period, amount


def create_key(membership: TenantMembership, asked: KeyRequest) -> tuple[ApiKey, str]:
    """A new key of the owner's tenant and its secret (returned once, never stored)."""
    if len(asked.label) > LABEL_MAX_LENGTH:
        raise KeyRefused(f"The name is longer than {LABEL_MAX_LENGTH} characters.")
    allowed = allowance(membership.tenant)
    if not allowed.granted:
        raise KeyRefused("Every key your operator issued this tenant is revoked or expired, and new keys are "
                         "made within those: ask your operator for one.")
    models = _models_within(allowed, asked.models)
    limits = {name: _limit_within(allowed, name, value) for name, value in asked.limits.items()}
    budgets = _budgets_within(allowed, asked.budget)
    with transaction.atomic():
        key, secret = ApiKey.objects.issue(membership.tenant, label=asked.label, allowed_models=models,
                                           expires_at=allowed.expires_at, made_in_console=True, **limits)
        Budget.objects.bulk_create(Budget(tenant=membership.tenant, api_key=key, period=period, limit_usd=limit)
                                   for period, limit in budgets.items())
        audit(membership.user, key, ADDITION, "Created from the tenant console; " + _described(key, budgets))
    return key, secret


def _models_within(allowed: Allowance, models: list[str]) -> list[str]:
    beyond = [model for model in models if model not in allowed.models]
    if beyond:
        raise KeyRefused(f"Not a model this tenant may use: {', '.join(beyond)}.")
    if models or allowed.every_model:
        return models
    # "All" for this tenant is its allowance, spelled out, never the gateway's every model.
    if not allowed.models:
        raise KeyRefused("This tenant may use no model yet; ask your operator.")
    return allowed.models


def _limit_within(allowed: Allowance, name: str, value: int | None) -> int | None:
    ceiling = allowed.ceiling(name)
    if value is None or ceiling is None:
        return value if value is not None else ceiling
    if value > ceiling:
        raise KeyRefused(f"{LIMIT_NAMES[name]} {value} is above this tenant's limit of {ceiling}.")
    return value


def _budgets_within(allowed: Allowance, asked: tuple[str, Decimal] | None) -> dict[str, Decimal]:
    budgets = {period: allowed.budget_ceilings[period] for period in allowed.budgets_required}
    if asked is not None:
        period, amount = asked
        ceiling = allowed.budget_ceilings.get(period)
        if ceiling is not None and amount > ceiling:
            raise KeyRefused(f"A {period} budget of {amount} USD is above this tenant's {period} limit of "
                             f"{ceiling.normalize():f} USD.")
        budgets[period] = amount
    return budgets


def _described(key: ApiKey, budgets: dict[str, Decimal]) -> str:
    parts = [f"models: {', '.join(key.allowed_models) or 'all the tenant may use'}"]
    parts += [f"{LIMIT_NAMES[name]} {getattr(key, name)}" for name in RATE_LIMITS if getattr(key, name)]
    parts += [f"{period} budget {limit.normalize():f} USD" for period, limit in budgets.items()]
    if key.expires_at is not None:
        parts.append(f"expires {key.expires_at:%Y-%m-%d %H:%M} UTC")
    return "; ".join(parts) + "."


def revoke_key(membership: TenantMembership, key_id: int) -> ApiKey | None:
    """Revoke one of the tenant's keys; None if the tenant has no such key."""
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().filter(tenant=membership.tenant, pk=key_id).first()
        if key is None:
            return None
        if not key.revoked:
            key.revoke()
            audit(membership.user, key, CHANGE, "Revoked from the tenant console.")
    return key


def grace_of(raw: str) -> timedelta:
    """The rotation form's grace, one of GRACES (in seconds)."""
    if not (raw.strip().isascii() and raw.strip().isdigit()) or int(raw) not in GRACES:
        raise KeyRefused("Pick a grace period from the list.")
    return timedelta(seconds=int(raw))


def rotate_key(membership: TenantMembership, key_id: int, grace: timedelta) -> tuple[ApiKey, str] | None:
    """A new secret for one of the tenant's live keys (the same key: its
    logs, limits and budgets carry on), the old secret accepted for
    ``grace``; None if the tenant has no such key."""
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().filter(tenant=membership.tenant, pk=key_id).first()
        if key is None:
            return None
        if key.refused_from is not None and key.refused_from <= timezone.now():
            raise KeyRefused(f"Key {key.prefix}… is revoked or expired: make a new key instead.")
        old_prefix = key.prefix
        secret = key.rotate(grace)
        audit(membership.user, key, CHANGE,
              f"Rotated from the tenant console: new secret {key.prefix}…; the old one ({old_prefix}…) "
              f"is accepted until {key.previous_until:%Y-%m-%d %H:%M:%S} UTC.")
    return key, secret


def audit(user: AbstractBaseUser, key: ApiKey, flag: int, message: str) -> None:
    LogEntry.objects.log_actions(user.pk, [key], flag, message, single_object=True)


def tenant_keys(tenant: Tenant) -> list[ApiKey]:
    return list(ApiKey.objects.filter(tenant=tenant).prefetch_related("budgets")
                .order_by("revoked_at", "-created_at", "-id"))
