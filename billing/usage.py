"""What ``GET /v1/usage`` answers: a customer's own balance and request logs (B8)
(settlement -> *what the customer sees*).

Authenticated by the customer's HopBase key, taken from wherever the SDKs
send it (P7); an unknown key gets the OpenAI-format 401. The answer holds
only the key's tenant's rows, whatever is asked: every query is filtered by
the tenant id that authentication returned.

Query parameters:
- ``limit``: 1-100 rows (default 20), newest first;
- ``before``: a ``request_id`` from an earlier page (its ``last_id``): the
  rows made before it. A cursor, not an offset, so a page stays correct
  while new requests arrive;
- ``since`` (inclusive) / ``until`` (exclusive): ISO 8601 moments, UTC when
  they carry no offset.

Response (JSON)::

    {"object": "list", "tenant": "acme", "balance_usd": "12.50",
     "data": [{"request_id": ..., "created_at": ..., "model": ..., "status": ...,
               "stream": ..., "api_key": <display prefix>, "input_tokens": ...,
               "output_tokens": ..., "cache_read_tokens": ..., "cache_write_tokens": ...,
               "usage_estimated": ..., "charge_usd": "0.0012" or null, "settled": ...}],
     "first_id": ..., "last_id": ..., "has_more": false, "budgets": [...]}

``charge_usd`` is null until the request is settled; cancelled, stalled and
interrupted requests are listed with what they cost (B1-B4).

``budgets`` lists the budgets that cover the calling key (G6): its tenant's
and its own, never another key's, each as ``{"scope": "tenant" | "key",
"period": ..., "window_start": ..., "window_end": ... or null (total),
"limit_usd": ..., "spent_usd": ..., "reserved_usd": ... or null (Redis did
not answer)}``, where it stands now, whatever the page asked for.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Q
from django.utils import timezone

from billing.budgets.status import standings
from billing.exports import utc_iso
from billing.models import Budget, RequestLog
from core.errors import ErrorKind, GatewayError
from core.moments import utc_moment
from core.money import usd_text
from core.snapshots import refresh_connection
from tenants.models import Tenant

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass(frozen=True)
class Page:
    tenant_id: int
    key_id: int  # the calling key: the budgets shown are its own and its tenant's
    limit: int = DEFAULT_LIMIT
    before: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


def parse_moment(name: str, raw: str) -> dt.datetime:
    try:
        return utc_moment(raw)
    except ValueError:
        raise GatewayError(ErrorKind.MALFORMED, f"{name} must be an ISO 8601 date or datetime.") from None


def parse_page(tenant_id: int, key_id: int, params: Any) -> Page:
    raw_limit = params.get("limit", str(DEFAULT_LIMIT))
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise GatewayError(ErrorKind.MALFORMED, f"limit must be a whole number from 1 to {MAX_LIMIT}.")
    since = parse_moment("since", params["since"]) if params.get("since") else None
    until = parse_moment("until", params["until"]) if params.get("until") else None
    before = params.get("before") or None
    if before is not None and "\x00" in before:
        raise GatewayError(ErrorKind.MALFORMED, "before must be a request_id from an earlier page.")
    return Page(tenant_id, key_id, int(raw_limit), before, since, until)


def log_entry(log: RequestLog) -> dict[str, Any]:
    return {
        "request_id": log.request_id,
        "created_at": utc_iso(log.created_at),
        "model": log.model,
        "status": log.status,
        "stream": log.stream,
        "api_key": log.api_key.prefix if log.api_key is not None else None,
        "input_tokens": log.input_tokens,
        "output_tokens": log.output_tokens,
        "cache_read_tokens": log.cache_read_tokens,
        "cache_write_tokens": log.cache_write_tokens,
        "usage_estimated": log.usage_estimated,
        "charge_usd": usd_text(log.charge_usd) if log.charge_usd is not None else None,
        "settled": log.settled_at is not None,
    }


def budget_entries(tenant_id: int, key_id: int) -> list[dict[str, Any]]:
    """Where the key's budgets and its tenant's stand now (two queries)."""
    covering = (Budget.objects.covering(tenant_id, key_id).select_related("tenant", "api_key")
                .defer("webhook_secret").order_by(F("api_key_id").asc(nulls_first=True), "period"))
    fields = ("scope", "period", "window_start", "window_end", "limit_usd", "spent_usd", "reserved_usd")
    return [{name: entry[name] for name in fields}
            for entry in (standing.as_json() for standing in standings(covering, timezone.now()))]


def read_page(page: Page) -> dict[str, Any]:
    """The page as a JSON-ready dict: four or five indexed queries, all
    scoped to the tenant (index log_tenant_time) or, for budgets, the key."""
    refresh_connection()  # a pool thread: no request signal does this for it
    tenant = Tenant.objects.only("name", "balance_usd").get(pk=page.tenant_id)
    logs = RequestLog.objects.filter(tenant_id=page.tenant_id)
    if page.since is not None:
        logs = logs.filter(created_at__gte=page.since)
    if page.until is not None:
        logs = logs.filter(created_at__lt=page.until)
    if page.before is not None:
        cursor = (
            RequestLog.objects.filter(tenant_id=page.tenant_id, request_id=page.before)
            .values_list("created_at", "id")
            .first()
        )
        if cursor is None:  # unknown, or another tenant's: the same answer
            raise GatewayError(ErrorKind.MALFORMED, "before must be a request_id from an earlier page.")
        created_at, log_id = cursor
        logs = logs.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=log_id))
    rows = list(
        logs.select_related("api_key")
        .only(
            "request_id", "created_at", "model", "status", "stream", "input_tokens", "output_tokens",
            "cache_read_tokens", "cache_write_tokens", "usage_estimated", "charge_usd", "settled_at",
            "api_key__prefix",
        )
        .order_by("-created_at", "-id")[: page.limit + 1]
    )
    data = [log_entry(log) for log in rows[: page.limit]]
    return {
        "object": "list",
        "tenant": tenant.name,
        "balance_usd": usd_text(tenant.balance_usd),
        "data": data,
        "first_id": data[0]["request_id"] if data else None,
        "last_id": data[-1]["request_id"] if data else None,
        "has_more": len(rows) > page.limit,
        "budgets": budget_entries(page.tenant_id, page.key_id),
    }
