"""Which tenants have run out of credit, for the hot path (auth -> *balance
gate* -> relay).

A tenant whose ``balance_usd`` is zero or less is refused (table E, balance
exhausted). The intake asks ``await balances.exhausted(tenant_id)``,
answered from the set of exhausted tenant ids, loaded in one query for all
tenants and trusted for HOPBASE_CONFIG_TTL seconds (core.snapshots). So a
tenant is refused within the TTL after the settlement that emptied its
balance, and served again within the TTL after a top-up. Balances move only
at settlement, after the request, so a tenant can overspend by what its
requests in flight and not yet settled cost: the gate is a stop, not a
reservation. While the database is unreachable the last sets known are
used, for up to HOPBASE_STALE_MAX_AGE seconds (core.snapshots).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Sum
from django.utils import timezone

from billing.models import RequestLog
from core.snapshots import Snapshot
from hopbase.models import ApiKey, Tenant


def load_exhausted_tenants() -> frozenset[int]:
    """Ids of every tenant with nothing left to spend (one query)."""
    return frozenset(Tenant.objects.filter(balance_usd__lte=0).values_list("pk", flat=True))


class BalanceBook:
    def __init__(self, loader: Callable[[], frozenset[int]] = load_exhausted_tenants) -> None:
        self._snapshot: Snapshot[frozenset[int]] = Snapshot(loader)

    async def exhausted(self, tenant_id: int) -> bool:
        return tenant_id in await self._snapshot.get()

    async def exhausted_tenants(self) -> frozenset[int]:
        return await self._snapshot.get()

    def clear(self) -> None:
        self._snapshot.clear()


balances = BalanceBook()


def load_keys_over_limit() -> frozenset[int]:
    """Ids of the keys whose settled charges this calendar month (UTC) have
    reached their monthly limit (one query over the month's logs of keys
    that have a limit)."""
    now = timezone.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    spent = (
        RequestLog.objects.filter(
            api_key__monthly_limit_usd__isnull=False, created_at__gte=month_start, charge_usd__isnull=False
        )
        .values("api_key_id", "api_key__monthly_limit_usd")
        .annotate(spent=Sum("charge_usd"))
    )
    over = {row["api_key_id"] for row in spent if row["spent"] >= row["api_key__monthly_limit_usd"]}
    # A limit of zero allows nothing, spent or not.
    over.update(ApiKey.objects.filter(monthly_limit_usd__lte=0).values_list("pk", flat=True))
    return frozenset(over)


class KeySpendBook:
    """Which keys are over their monthly spend limit, for the hot path.
    Like balances, a stop and not a reservation: spend counts once settled,
    and the set is trusted for HOPBASE_CONFIG_TTL seconds."""

    def __init__(self, loader: Callable[[], frozenset[int]] = load_keys_over_limit) -> None:
        self._snapshot: Snapshot[frozenset[int]] = Snapshot(loader)

    async def over_limit(self, key_id: int) -> bool:
        return key_id in await self._snapshot.get()

    def clear(self) -> None:
        self._snapshot.clear()


key_spend = KeySpendBook()
