"""The operators' dashboard at ``/admin/dashboard/`` (B7): spend, requests,
tokens and error and cancel rates per day, per model and per tenant.

Every number is aggregated by the database (TruncDate, Sum, Count) over the
window asked for, so the page costs a few grouped queries however many logs
there are. Charts are inline SVG drawn from those numbers by the template:
no script, no CDN. Staff with permission to view request logs only.

The window asked for (the last 30 days by default) is fitted to the data:
the charts and the per-day table start at the first day with requests in
it, and show at least a week, so that one day of traffic is not one bar in
a month of empty panels.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from billing.models import RequestLog
from core.money import CHARGE_QUANTUM, usd_text

DEFAULT_DAYS = 30
MAX_DAYS = 366
# The fewest days a fitted window shows (it ends today).
MIN_DAYS_SHOWN = 7
TOP = 15
# Requests that ended in an error the customer saw (the provider's or ours).
ERRORS = ("failed", "stalled", "interrupted")

TOKENS = F("input_tokens") + F("output_tokens") + F("cache_read_tokens") + F("cache_write_tokens")
METRICS: dict[str, Any] = {
    "requests": Count("id"),
    "spend": Coalesce(Sum("charge_usd"), Decimal(0)),
    "tokens": Coalesce(Sum(TOKENS), 0),
    "errors": Count("id", filter=Q(status__in=ERRORS)),
    "cancelled": Count("id", filter=Q(status="cancelled")),
    "rejected": Count("id", filter=Q(status="rejected")),
}


@dataclass
class Stats:
    label: str
    requests: int = 0
    spend: Decimal = Decimal(0)
    tokens: int = 0
    errors: int = 0
    cancelled: int = 0
    rejected: int = 0

    def __post_init__(self) -> None:
        # To the ledger's ten places: SQLite sums in floating point, and this
        # rounds its noise away (PostgreSQL's sum is exact anyway).
        self.spend = Decimal(self.spend).quantize(CHARGE_QUANTUM)

    @property
    def spend_text(self) -> str:
        return usd_text(self.spend)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def cancel_rate(self) -> float:
        return self.cancelled / self.requests if self.requests else 0.0


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    text: str


@dataclass
class Chart:
    """One series drawn as bars in a ``width`` x ``height`` SVG box."""

    title: str
    top_text: str
    first_label: str
    last_label: str
    bars: list[Bar] = field(default_factory=list)
    width: int = 720
    height: int = 140


def chart(title: str, labels: list[str], values: list[float], texts: list[str], top_text: str) -> Chart:
    drawn = Chart(title, top_text, labels[0] if labels else "", labels[-1] if labels else "")
    peak = max(values, default=0) or 1
    slot = drawn.width / max(len(values), 1)
    for index, (label, value, text) in enumerate(zip(labels, values, texts, strict=True)):
        height = round(drawn.height * value / peak, 1)
        drawn.bars.append(
            Bar(round(index * slot + slot * 0.1, 1), round(drawn.height - height, 1), round(slot * 0.8, 1), height,
                label, text)
        )
    return drawn


def window(days: int, now: dt.datetime | None = None) -> tuple[dt.date, dt.datetime]:
    """The first day shown (UTC) and the moment it starts."""
    today = (now or timezone.now()).astimezone(dt.timezone.utc).date()
    first = today - dt.timedelta(days=days - 1)
    return first, dt.datetime.combine(first, dt.time.min, tzinfo=dt.timezone.utc)


def grouped(logs: QuerySet[RequestLog], key: str) -> list[Stats]:
    rows = logs.values(key).annotate(**METRICS).order_by(key)
    return [Stats(str(row[key]), **{name: row[name] for name in METRICS}) for row in rows]


def per_day(logs: QuerySet[RequestLog], first: dt.date, days: int) -> list[Stats]:
    """One Stats per day of the window, from its first day with requests
    (or MIN_DAYS_SHOWN before its last day, if that is earlier) to its last."""
    by_day = {
        row["day"]: row
        for row in logs.annotate(day=TruncDate("created_at", tzinfo=dt.timezone.utc))
        .values("day")
        .annotate(**METRICS)
        .order_by("day")
    }
    last = first + dt.timedelta(days=days - 1)
    start = fitted_start(first, last, min(by_day, default=None))
    out = []
    for offset in range((last - start).days + 1):
        day = start + dt.timedelta(days=offset)
        row = by_day.get(day)
        values = {name: row[name] for name in METRICS} if row else {}
        out.append(Stats(day.isoformat(), **values))
    return out


def fitted_start(first: dt.date, last: dt.date, first_with_data: dt.date | None) -> dt.date:
    """Where the days shown begin: empty leading days are dropped, but at
    least MIN_DAYS_SHOWN days are shown (never more than the window)."""
    at_most = last - dt.timedelta(days=MIN_DAYS_SHOWN - 1)
    return max(first, min(first_with_data or last, at_most))


def top(stats: list[Stats]) -> list[Stats]:
    return sorted(stats, key=lambda s: (-s.spend, -s.requests, s.label))[:TOP]


def percent(rate: float) -> str:
    return f"{rate * 100:.1f}%"


def dashboard_context(days: int, now: dt.datetime | None = None) -> dict[str, Any]:
    first, start = window(days, now)
    logs = RequestLog.objects.filter(created_at__gte=start)
    daily = per_day(logs, first, days)
    totals = Stats("total", **logs.aggregate(**METRICS))
    labels = [s.label for s in daily]
    charts = [
        chart("Spend (USD) per day", labels, [float(s.spend) for s in daily], [s.spend_text for s in daily],
              usd_text(max((s.spend for s in daily), default=Decimal(0)))),
        chart("Requests per day", labels, [s.requests for s in daily], [str(s.requests) for s in daily],
              str(max((s.requests for s in daily), default=0))),
        chart("Tokens per day", labels, [s.tokens for s in daily], [str(s.tokens) for s in daily],
              str(max((s.tokens for s in daily), default=0))),
        chart("Error rate per day", labels, [s.error_rate for s in daily], [percent(s.error_rate) for s in daily],
              percent(max((s.error_rate for s in daily), default=0))),
        chart("Cancel rate per day", labels, [s.cancel_rate for s in daily], [percent(s.cancel_rate) for s in daily],
              percent(max((s.cancel_rate for s in daily), default=0))),
    ]
    models = top(grouped(logs, "model"))
    tenants = top(grouped(logs, "tenant__name"))
    peak_spend = max((s.spend for s in models + tenants), default=Decimal(0)) or Decimal(1)
    return {
        "days": days,
        "first_day": dt.date.fromisoformat(daily[0].label),
        "window_start": first,
        "totals": totals,
        "charts": charts,
        "daily": daily,
        "models": [(s, float(s.spend / peak_spend * 100)) for s in models],
        "tenants": [(s, float(s.spend / peak_spend * 100)) for s in tenants],
    }


def parse_days(raw: str | None) -> int:
    if raw and raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_DAYS:
        return int(raw)
    return DEFAULT_DAYS


def dashboard(request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("billing.view_requestlog"):
        raise PermissionDenied
    days = parse_days(request.GET.get("days"))
    context = {
        **admin.site.each_context(request),
        "title": "Dashboard",
        **dashboard_context(days),
        "day_choices": (7, 30, 90),
    }
    return TemplateResponse(request, "admin/billing/dashboard.html", context)


view = admin.site.admin_view(dashboard)
