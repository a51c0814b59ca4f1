"""What a budget's window has spent, by the ledger's own numbers (rule G1, G6).

Spend in a window is the sum of the charges (the tenant's multiplier
applied, as settlement charges them) of the requests made in it that
settlement has charged: the same rows and amounts as the export, so
``budgets --format jsonl`` and ``exportbilling`` agree to the last decimal.
Requests still in flight are the gateway's reservations
(``gateway.governance.spend``), not spend.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

from django.db.models import Q, Sum

from billing.budgets.windows import Window, window_at
from billing.models import Budget, RequestLog


def spend_filter(budget: Budget, window: Window) -> Q:
    scope = Q(tenant_id=budget.tenant_id) if budget.api_key_id is None else Q(api_key_id=budget.api_key_id)
    within = Q(created_at__gte=window.start) if window.end is None else Q(created_at__gte=window.start,
                                                                         created_at__lt=window.end)
    return scope & within & Q(charge_usd__isnull=False)


def spent_in(budget: Budget, window: Window) -> Decimal:
    """The settled charges of ``budget``'s scope in ``window`` (one query)."""
    total = RequestLog.objects.filter(spend_filter(budget, window)).aggregate(total=Sum("charge_usd"))["total"]
    return total if total is not None else Decimal(0)


def spent_now(budgets: Iterable[Budget], now: datetime) -> dict[int, tuple[Window, Decimal]]:
    """Each budget's current window and what it has spent (a query each)."""
    found = {}
    for budget in budgets:
        window = window_at(budget.period, now)
        found[budget.pk] = (window, spent_in(budget, window))
    return found
