"""What a tenant may give a key made in the console (K3): models, limits,
budgets and an expiry no looser than the operator allowed it.

The operator allows a tenant through the keys they issue it, so the
allowance is the envelope of the tenant's live keys that an operator issued
(a key made here never counts: making keys cannot widen it, and an operator
who narrows or revokes their keys narrows it): the models some enabled
channel serves that one of them may use (a key allowing every model, an
empty list, allows every served model); for RPM, TPM and concurrency the
largest any of them has, with no ceiling once one has none; for a budget
period, the largest budget of that period when every one of them has one,
and never more than the tenant's own budget of that period; and the latest
of their expiries, unless one never expires. When every key the operator
issued is revoked or expired, the tenant may make none; when the operator
has issued none at all, nothing bounds the tenant's keys but its own
budgets (the operator has narrowed nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from billing.models import Budget
from channels_pool.models import Channel
from tenants.models import ApiKey, Tenant

RATE_LIMITS = ("rpm", "tpm", "concurrency")


@dataclass(frozen=True)
class Allowance:
    models: list[str]  # sorted
    every_model: bool  # some live operator key of the tenant may use every served model
    granted: bool = True  # False: no live key from the operator, so no key may be made
    rpm: int | None = None  # None: no ceiling
    tpm: int | None = None
    concurrency: int | None = None
    # Per budget period: the most a key's budget of that period may be, and
    # whether every key must have one (the operator bounded every key so).
    budget_ceilings: dict[str, Decimal] = field(default_factory=dict)
    budgets_required: frozenset[str] = frozenset()
    expires_at: datetime | None = None  # the latest a key may live; None: no end

    def ceiling(self, name: str) -> int | None:
        return getattr(self, name)


def allowance(tenant: Tenant) -> Allowance:
    served: set[str] = set()
    for channel in Channel.objects.enabled().only("served_models"):
        served.update(channel.model_map())
    issued = ApiKey.objects.filter(tenant=tenant).issued_by_operators()
    live = list(issued.active().unexpired().only("allowed_models", "expires_at", *RATE_LIMITS)
                .prefetch_related("budgets"))
    if not live and issued.exists():
        # The operator's keys are all revoked or expired: what they allowed is gone, not widened.
        return Allowance([], every_model=False, granted=False)
    if not live or any(not key.allowed_models for key in live):
        models, every_model = sorted(served), True
    else:
        models, every_model = sorted(served & {m for key in live for m in key.allowed_models}), False
    limits = {name: _loosest([getattr(key, name) for key in live]) for name in RATE_LIMITS}
    required, ceilings = _budget_envelope(live)
    for budget in Budget.objects.filter(tenant=tenant, api_key__isnull=True):
        ceilings[budget.period] = min(ceilings.get(budget.period, budget.limit_usd), budget.limit_usd)
    ends = [key.expires_at for key in live]
    expires_at = None if not ends or None in ends else max(ends)
    return Allowance(models, every_model, budget_ceilings=ceilings, budgets_required=required,
                     expires_at=expires_at, **limits)


def _loosest(values: list[int | None]) -> int | None:
    if not values or None in values:
        return None
    return max(values)


def _budget_envelope(live: list[ApiKey]) -> tuple[frozenset[str], dict[str, Decimal]]:
    if not live:
        return frozenset(), {}
    by_key = [{budget.period: budget.limit_usd for budget in key.budgets.all()} for key in live]
    shared = frozenset(set.intersection(*(set(periods) for periods in by_key)))
    return shared, {period: max(periods[period] for periods in by_key) for period in shared}
