"""The console's overview (K2): the tenant's balance, where each of its
budgets stands, and its spend and tokens of the last 30 days by day, by
model and by key.

Every number is aggregated by the database on the (tenant, created_at)
index, so the page costs the same few queries whatever the number of logs:
one for the days and models, one for the keys (and one naming the top
ten), and budget_status's one per hundred budgets.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import F, Sum
from django.db.models.functions import Coalesce, TruncDate

from billing.budgets.status import Standing, standings
from billing.models import Budget, RequestLog
from tenants.models import ApiKey, Tenant

DAYS = 30
TOP = 10  # models and keys shown; the rest are in the logs
TOKENS = F("input_tokens") + F("output_tokens") + F("cache_read_tokens") + F("cache_write_tokens")


@dataclass(frozen=True)
class Bar:
    label: str
    spend: Decimal
    tokens: int
    percent: int  # of the largest spend in its chart, for the bar's width


@dataclass(frozen=True)
class Overview:
    tenant: Tenant
    since: dt.date
    budgets: list[Standing]
    by_day: list[Bar]
    by_model: list[Bar]
    by_key: list[Bar]


def overview(tenant: Tenant, now: dt.datetime) -> Overview:
    since = (now - dt.timedelta(days=DAYS - 1)).date()
    start = dt.datetime.combine(since, dt.time(), tzinfo=dt.timezone.utc)
    logs = RequestLog.objects.filter(tenant=tenant, created_at__gte=start)
    totals = {"spend": Coalesce(Sum("charge_usd"), Decimal(0)), "tokens": Coalesce(Sum(TOKENS), 0)}

    # Days and models from one pass over the window's rows (a tenant has few
    # models, so day x model stays small): each pass is most of the page's time.
    days: dict[dt.date, dict] = {}
    models: dict[str, dict] = {}
    for row in logs.annotate(day=TruncDate("created_at")).values("day", "model").annotate(**totals):
        for table, name in ((days, row["day"]), (models, row["model"] or "(none)")):
            found = table.setdefault(name, {"spend": Decimal(0), "tokens": 0})
            found["spend"] += row["spend"]
            found["tokens"] += row["tokens"]
    by_day = [(str(day), days.get(day, {"spend": Decimal(0), "tokens": 0}))
              for day in (since + dt.timedelta(days=n) for n in range(DAYS))]
    by_model = sorted(models.items(), key=lambda item: (-item[1]["spend"], item[0]))[:TOP]
    # Grouped by the key's id alone (no join over the window's rows), then named.
    top_keys = list(logs.values("api_key_id").annotate(**totals).order_by("-spend", "api_key_id")[:TOP])
    named = ApiKey.objects.filter(tenant=tenant, pk__in=[row["api_key_id"] for row in top_keys])
    keys = {pk: (prefix, label) for pk, prefix, label in named.values_list("pk", "prefix", "label")}
    by_key = [(key_label(*keys.get(row["api_key_id"], (None, None))), row) for row in top_keys]
    budgets = Budget.objects.filter(tenant=tenant).select_related("tenant", "api_key").order_by("api_key_id", "period")
    return Overview(tenant, since, list(standings(budgets, now)), bars(by_day), bars(by_model), bars(by_key))


def key_label(prefix: str | None, label: str | None) -> str:
    if prefix is None:
        return "(no key)"
    return f"{prefix}… {label}" if label else f"{prefix}…"


def bars(rows: list[tuple[str, dict]]) -> list[Bar]:
    largest = max((row["spend"] for _, row in rows), default=Decimal(0))
    return [Bar(label, row["spend"], row["tokens"], int(row["spend"] * 100 / largest) if largest > 0 else 0)
            for label, row in rows]
