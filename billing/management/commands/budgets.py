"""budgets [--tenant NAME] [--format text|jsonl]

One line per budget, where it stands now (rule G6): its scope, tenant, key
prefix, period, the current window, the limit, what the window has spent
and what requests in flight hold reserved in it. In JSONL, one object per
budget with the keys ``scope`` (``tenant`` or ``key``), ``tenant``,
``key_prefix`` (null for a tenant's budget), ``period``, ``window_start``,
``window_end`` (null for ``total``), ``limit_usd``, ``spent_usd`` and
``reserved_usd``: amounts as exact decimal strings, times ISO 8601 UTC.
Spent is the sum of ``charge_usd`` that ``exportbilling`` gives for the same
rows (billing.budgets.spend). A webhook's secret is never shown.
"""

from __future__ import annotations

import json

from django.core.management.base import CommandError
from django.db.models import F
from django.utils import timezone

from billing.budgets.status import Standing, standings
from billing.models import Budget
from core.commands import OperatorCommand
from core.money import usd_text
from tenants.commands import find_tenant

FORMATS = ("text", "jsonl")


def text_line(standing: Standing) -> str:
    budget, window = standing.budget, standing.window
    moment = "%Y-%m-%dT%H:%M:%SZ"
    ends = window.end.strftime(moment) if window.end is not None else "never"
    reserved = usd_text(standing.reserved_usd) if standing.reserved_usd is not None else "unknown"
    return (f"{budget.scope:<6} {budget.tenant.name} {standing.key_prefix or '-'} {budget.period} "
            f"{window.start.strftime(moment)} -> {ends} limit {usd_text(budget.limit_usd)} "
            f"spent {usd_text(standing.spent_usd)} reserved {reserved} USD")


def jsonl_line(standing: Standing) -> str:
    return json.dumps(standing.as_json(), ensure_ascii=False, separators=(",", ":"))


class Command(OperatorCommand):
    help = "List budgets with their current window, limit, spend and reservations."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", metavar="NAME", help="Only this tenant's budgets (its keys' included)")
        parser.add_argument("--format", default="text", help=f"One of {', '.join(FORMATS)} (default text)")

    def handle(self, *args, **options) -> None:
        fmt = options["format"].strip().lower()
        if fmt not in FORMATS:
            raise CommandError(f"--format: {options['format']!r} is not one of {', '.join(FORMATS)}")
        budgets = Budget.objects.select_related("tenant", "api_key").defer("webhook_secret")  # never decrypted
        if options["tenant"] is not None:
            budgets = budgets.filter(tenant=find_tenant(options["tenant"], "--tenant"))
        # A tenant's budgets first, then its keys' (NULL sorts first on SQLite, last on PostgreSQL).
        budgets = budgets.order_by("tenant__name", F("api_key__prefix").asc(nulls_first=True), "api_key_id", "period")
        line = jsonl_line if fmt == "jsonl" else text_line
        unknown = 0
        for standing in standings(list(budgets), timezone.now()):
            unknown += standing.reserved_usd is None
            self.stdout.write(line(standing))
        if unknown:
            self.stderr.write(f"Redis did not answer: the reservations of {unknown} budget(s) are unknown")
