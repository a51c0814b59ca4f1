"""Billing exports for finance (B7): one row per request log, as CSV or JSON
Lines (-> metering -> settlement -> *export*).

The rows come from one joined query streamed with ``.iterator()``, and the
encoders are generators of text lines, so an export of any size holds one
chunk of rows in memory. The same generators serve the ``exportbilling``
command and a streamed HTTP response.

Column meanings (operator contract, DESIGN.md):
- ``created_at``: ISO 8601 in UTC with microseconds, ``2025-01-31T12:00:00.000000Z``.
- ``api_key``: the key's display prefix, never the secret; ``channel``: the
  channel's name. Either is empty when the log has none.
- ``charge_usd``: the log's charge as an exact decimal string in the form
  ``usd_text`` gives (``0.00``, ``0.0012345``). A log whose charge has not been
  computed yet exports an empty string; ``settled`` says whether the charge
  is in the ledger, so an unsettled row with a charge is a charge to come.
- CSV: header line first, booleans ``true``/``false``, ``\\n`` line ends.
  JSONL: token counts integers; ``stream``, ``usage_estimated`` and
  ``settled`` booleans; every other value a string.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from billing.models import RequestLog
from hopbase.models import Tenant

COLUMNS = (
    "request_id", "created_at", "tenant", "api_key", "model", "channel", "protocol", "stream", "status",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "usage_estimated",
    "charge_usd", "settled",
)
CHUNK_SIZE = 2000

Row = dict[str, Any]


def usd_text(amount: Decimal) -> str:
    """An exact amount with at least two decimals and no padding beyond the
    last significant digit: 12.5000000000 -> '12.50', 0.0001230000 ->
    '0.000123', 7 -> '7.00', 0 -> '0.00'. Never rounds and never uses an
    exponent, so ``Decimal(usd_text(x)) == x``."""
    if not amount.is_finite():
        raise ValueError(f"not an amount: {amount}")
    if amount.is_zero():
        amount = Decimal(0)  # no "-0.00"
    # Text, not normalize(): normalize() rounds to the context's 28 digits.
    whole, _, fraction = f"{amount:f}".partition(".")
    return f"{whole}.{fraction.rstrip('0').ljust(2, '0')}"


def export_queryset(
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    tenant: Tenant | None = None,
) -> QuerySet[RequestLog]:
    """Request logs with ``since <= created_at < until`` (half-open, so
    consecutive periods neither overlap nor miss a row), oldest first."""
    logs = RequestLog.objects.all()
    if since is not None:
        logs = logs.filter(created_at__gte=since)
    if until is not None:
        logs = logs.filter(created_at__lt=until)
    if tenant is not None:
        logs = logs.filter(tenant=tenant)
    return (
        logs.select_related("tenant", "api_key", "channel")
        .only(
            "request_id", "created_at", "model", "protocol", "stream", "status", "input_tokens",
            "output_tokens", "cache_read_tokens", "cache_write_tokens", "usage_estimated", "charge_usd",
            "settled_at", "tenant__name", "api_key__prefix", "channel__name",
        )
        .order_by("created_at", "id")
    )


def utc_iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def export_row(log: RequestLog) -> Row:
    return {
        "request_id": log.request_id,
        "created_at": utc_iso(log.created_at),
        "tenant": log.tenant.name,
        "api_key": log.api_key.prefix if log.api_key is not None else "",
        "model": log.model,
        "channel": log.channel.name if log.channel is not None else "",
        "protocol": log.protocol,
        "stream": log.stream,
        "status": log.status,
        "input_tokens": log.input_tokens,
        "output_tokens": log.output_tokens,
        "cache_read_tokens": log.cache_read_tokens,
        "cache_write_tokens": log.cache_write_tokens,
        "usage_estimated": log.usage_estimated,
        "charge_usd": usd_text(log.charge_usd) if log.charge_usd is not None else "",
        "settled": log.settled_at is not None,
    }


def export_rows(logs: QuerySet[RequestLog], chunk_size: int = CHUNK_SIZE) -> Iterator[Row]:
    for log in logs.iterator(chunk_size=chunk_size):
        yield export_row(log)


def csv_lines(rows: Iterable[Row]) -> Iterator[str]:
    """The header, then one CSV line per row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")

    def line(values: Iterable[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(values)
        return buffer.getvalue()

    yield line(COLUMNS)
    for row in rows:
        yield line(_csv_value(row[column]) for column in COLUMNS)


def _csv_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def jsonl_lines(rows: Iterable[Row]) -> Iterator[str]:
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"


ENCODERS: dict[str, Callable[[Iterable[Row]], Iterator[str]]] = {"csv": csv_lines, "jsonl": jsonl_lines}
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
