"""Which tenants have run out of credit, for the hot path (auth -> *balance
gate* -> relay). Budgets, which hold per period, are gateway.governance.spend's.

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

from core.snapshots import Snapshot
from tenants.models import Tenant


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
