"""Billing exports for finance (B7): one row per request log, as CSV or JSON
Lines (-> metering -> settlement -> *export*).

The rows come from one joined query streamed with ``.iterator()``, and the
encoders are generators of text lines, so an export of any size holds one
chunk of rows in memory. The same generators serve the ``exportbilling``
command and, through ``streamed()``, the admin's streamed HTTP download.

Column meanings (the operator contract, docs/billing.md):
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
import itertools
import json
import operator
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from billing.models import RequestLog
from core.money import usd_text
from tenants.models import Tenant

COLUMNS = (
    "request_id", "created_at", "tenant", "api_key", "model", "channel", "protocol", "stream", "status",
    "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "usage_estimated",
    "charge_usd", "settled", "extras",
)
CHUNK_SIZE = 2000

Row = dict[str, Any]


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
    return for_export(logs)


def for_export(logs: QuerySet[RequestLog]) -> QuerySet[RequestLog]:
    """Any selection of logs (a period, an admin filter) in export order:
    oldest first."""
    return logs.order_by("created_at", "id")


# What each row is read from: one joined query returning plain tuples, no
# model instances (an export of millions of rows spends its time here).
SOURCE = (
    "request_id", "created_at", "tenant__name", "api_key__prefix", "model", "channel__name", "protocol", "stream",
    "status", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "usage_estimated",
    "charge_usd", "settled_at", "extras",
)


def utc_iso(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def export_row(values: tuple[Any, ...]) -> Row:
    """One export row from the values of SOURCE, in that order."""
    (request_id, created_at, tenant, api_key, model, channel, protocol, stream, status, input_tokens,
     output_tokens, cache_read_tokens, cache_write_tokens, usage_estimated, charge_usd, settled_at, extras) = values
    return {
        "request_id": request_id,
        "created_at": utc_iso(created_at),
        "tenant": tenant,
        "api_key": api_key or "",
        "model": model,
        "channel": channel or "",
        "protocol": protocol,
        "stream": stream,
        "status": status,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_tokens": cache_read_tokens,
        "cache_write_tokens": cache_write_tokens,
        "usage_estimated": usage_estimated,
        "charge_usd": usd_text(charge_usd) if charge_usd is not None else "",
        "settled": settled_at is not None,
        # The surcharges priced into the charge (B10), e.g. "service_tier:priority x2".
        "extras": extras,
    }


def export_rows(logs: QuerySet[RequestLog], chunk_size: int = CHUNK_SIZE) -> Iterator[Row]:
    """Rows streamed from the database ``chunk_size`` at a time (a server-side
    cursor on PostgreSQL), in the queryset's order."""
    for values in logs.values_list(*SOURCE).iterator(chunk_size=chunk_size):
        yield export_row(values)


BOOLEAN_COLUMNS = ("stream", "usage_estimated", "settled")
# Columns whose text comes from outside (a client's model name, operators'
# names): a spreadsheet would run a cell starting with one of FORMULA_STARTS
# as a formula, so such a cell is prefixed with an apostrophe in CSV.
FREE_TEXT_COLUMNS = ("tenant", "model", "channel")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_lines(rows: Iterable[Row]) -> Iterator[str]:
    """The header, then one CSV line per row (booleans as true/false)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    pick = operator.itemgetter(*COLUMNS)
    flags = [COLUMNS.index(column) for column in BOOLEAN_COLUMNS]
    texts = [COLUMNS.index(column) for column in FREE_TEXT_COLUMNS]

    def line(values: Iterable[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(values)
        return buffer.getvalue()

    yield line(COLUMNS)
    for row in rows:
        values = list(pick(row))
        for index in flags:
            values[index] = "true" if values[index] else "false"
        for index in texts:
            if values[index].startswith(FORMULA_STARTS):
                values[index] = "'" + values[index]
        yield line(values)


def jsonl_lines(rows: Iterable[Row]) -> Iterator[str]:
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"


ENCODERS: dict[str, Callable[[Iterable[Row]], Iterator[str]]] = {"csv": csv_lines, "jsonl": jsonl_lines}
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}
# Lines handed over per thread hop by streamed(): big enough that the hop is
# cheap, small enough to stay a few hundred kilobytes.
LINES_PER_PIECE = 500


async def streamed(lines: Iterator[str], per_piece: int = LINES_PER_PIECE) -> AsyncIterator[bytes]:
    """The lines of a sync export generator as an async iterator for
    ``StreamingHttpResponse``: under ASGI Django reads a sync iterator whole
    into memory before sending, but streams an async one.

    The generator runs its database cursor, so every step runs in the
    request's one thread-sensitive thread (the connection's thread). If the
    client goes away the generator is closed there too, which closes the
    cursor."""
    take = sync_to_async(lambda: "".join(itertools.islice(lines, per_piece)), thread_sensitive=True)
    try:
        while piece := await take():
            yield piece.encode("utf-8")
    finally:
        close = getattr(lines, "close", None)
        if close is not None:
            await sync_to_async(close, thread_sensitive=True)()
