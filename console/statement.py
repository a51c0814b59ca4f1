"""The tenant's statement (K2): its ledger entries, top-ups, charges and
adjustments, each with the balance it left (the ledger's own
``balance_after_usd``, written with the entry in one transaction), newest
first and a page at a time by keyset; and its CSV download, which is
``exportbilling --tenant NAME --format csv`` for the same range, made by the
same code (billing.exports).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from billing.exports import csv_lines, export_queryset, export_rows
from billing.models import LedgerEntry
from console import filters
from tenants.models import Tenant

PAGE_SIZE = 50
SHOWN = ("id", "created_at", "kind", "amount_usd", "balance_after_usd", "note", "request_log__request_id")


@dataclass
class StatementPage:
    rows: list[dict] = field(default_factory=list)
    next_cursor: str | None = None
    error: str | None = None


def page(tenant: Tenant, query: Mapping[str, str], size: int = PAGE_SIZE) -> StatementPage:
    try:
        since, until = filters.period(query)
        position = filters.cursor(query)
    except filters.FilterError as error:
        return StatementPage(error=str(error))
    entries = LedgerEntry.objects.filter(tenant=tenant)
    if since is not None:
        entries = entries.filter(created_at__gte=since)
    if until is not None:
        entries = entries.filter(created_at__lt=until)
    rows = list(filters.after(entries, position).order_by("-created_at", "-id").values(*SHOWN)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return StatementPage(rows, filters.cursor_text(rows[-1]["created_at"], rows[-1]["id"]) if more else None)


def csv_download(tenant: Tenant, query: Mapping[str, str]) -> Iterator[str]:
    """The export's CSV lines for this tenant and range; ``FilterError`` first
    if the range is malformed (raised before any line is made)."""
    since, until = filters.period(query)
    return csv_lines(export_rows(export_queryset(since=since, until=until, tenant=tenant)))
