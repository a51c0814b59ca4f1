"""Where budgets stand now: each one's current window, what the window has
spent and what requests in flight hold reserved in it (rule G6), as the
admin's budget list, ``budgets`` and ``GET /v1/usage`` show them.

Spent is budget_spend's number (the settled charges of the scope's requests
made in the window: the rows and amounts of the export), summed for many
budgets in one query, so a page of budgets costs one query whatever its
length. Reserved is the gateway's (billing.budgets.store): with Redis every
process's open reservations; without it 0, since each process keeps its own
out of sight. Redis out of reach makes it unknown (None) rather than failing
the page that shows it.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from itertools import islice
from typing import Any

from django.db.models import Sum
from redis.exceptions import RedisError

from billing.budgets import store as budget_store
from billing.budgets.spend import spend_filter
from billing.budgets.windows import Window, window_at
from billing.exports import utc_iso
from billing.models import Budget, RequestLog
from core import loggers
from core.money import round_charge, usd_text

logger = logging.getLogger(loggers.BUDGET_STATUS)

# Budgets summed per query: one aggregate expression each, so a long list
# (``budgets`` over every tenant) is cut into queries of a bounded size.
PER_QUERY = 100


@dataclass(frozen=True)
class Standing:
    budget: Budget
    window: Window
    spent_usd: Decimal
    reserved_usd: Decimal | None  # None: Redis could not be asked

    @property
    def key_prefix(self) -> str | None:
        return self.budget.api_key.prefix if self.budget.api_key_id is not None else None

    def as_json(self) -> dict[str, Any]:
        """The G6 object (``budgets --format jsonl``): amounts as exact decimal
        strings, times ISO 8601 UTC, ``window_end`` null for ``total``."""
        return {
            "scope": self.budget.scope,
            "tenant": self.budget.tenant.name,
            "key_prefix": self.key_prefix,
            "period": self.budget.period,
            "window_start": utc_iso(self.window.start),
            "window_end": utc_iso(self.window.end) if self.window.end is not None else None,
            "limit_usd": usd_text(self.budget.limit_usd),
            "spent_usd": usd_text(self.spent_usd),
            "reserved_usd": usd_text(self.reserved_usd) if self.reserved_usd is not None else None,
        }


def standings(budgets: Iterable[Budget], now: datetime) -> Iterator[Standing]:
    """Each budget's standing at ``now``, in the order given: a query per
    ``PER_QUERY`` budgets, and a Redis call per budget. Budgets should come
    with their tenant and key (``select_related``) for ``as_json``."""
    budgets = iter(budgets)
    while chunk := list(islice(budgets, PER_QUERY)):
        windows = {budget.pk: window_at(budget.period, now) for budget in chunk}
        spent = spent_by_budget(chunk, windows)
        for budget in chunk:
            window = windows[budget.pk]
            yield Standing(budget, window, spent[budget.pk], reserved_or_none(budget.pk, window))


def spent_by_budget(budgets: list[Budget], windows: dict[int, Window]) -> dict[int, Decimal]:
    """``budget_spend.spent_in`` of every budget, in one query: the same
    filter per budget, each summed apart (an aggregate per budget)."""
    if not budgets:
        return {}
    filters = {budget.pk: spend_filter(budget, windows[budget.pk]) for budget in budgets}
    totals = RequestLog.objects.filter(functools.reduce(operator.or_, filters.values())).aggregate(
        **{f"budget_{pk}": Sum("charge_usd", filter=found) for pk, found in filters.items()}
    )
    # To the ledger's 10 places: SQLite adds its decimals as floating point (docs/operations.md, "Known limits").
    return {pk: round_charge(totals[f"budget_{pk}"]) if totals[f"budget_{pk}"] is not None else Decimal(0)
            for pk in filters}


def reserved_or_none(budget_id: int, window: Window) -> Decimal | None:
    try:
        return budget_store.reserved_usd(budget_id, window)
    except (OSError, RedisError) as error:
        logger.warning("budget %s: reservations unknown, Redis did not answer (%s)", budget_id, error)
        return None
