"""The tenant's request logs in the console (K2, B8): newest first, a page
at a time by keyset on (created_at, id), so page 1,000 costs what page 1
does; filters by date, key, model, status and request id.

Every query starts from the signed-in tenant; the channel that served a
request is the operator's business and is never selected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from django.db.models import QuerySet

from billing.models import RequestLog
from console import filters
from core.vocabulary import RequestStatus
from tenants.models import ApiKey, Tenant

PAGE_SIZE = 50
# What a row of the list or the detail page shows: no channel, no provider ids.
SHOWN = ("id", "request_id", "created_at", "model", "protocol", "endpoint", "stream", "status", "error_kind",
         "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "thinking_tokens",
         "usage_estimated", "ttft_ms", "duration_ms", "charge_usd", "settled_at", "api_key__prefix", "api_key__label")


@dataclass
class LogPage:
    rows: list[dict] = field(default_factory=list)
    next_cursor: str | None = None
    error: str | None = None


def tenant_logs(tenant: Tenant) -> QuerySet[RequestLog]:
    return RequestLog.objects.filter(tenant=tenant)


def filtered(tenant: Tenant, query: Mapping[str, str]) -> QuerySet[RequestLog]:
    """The tenant's logs the query string asks for; ``FilterError`` names a bad field."""
    logs = tenant_logs(tenant)
    since, until = filters.period(query)
    if since is not None:
        logs = logs.filter(created_at__gte=since)
    if until is not None:
        logs = logs.filter(created_at__lt=until)
    if request_id := (query.get("request_id") or "").strip():
        logs = logs.filter(request_id=request_id)
    if model := (query.get("model") or "").strip():
        logs = logs.filter(model=model)
    if status := (query.get("status") or "").strip():
        if status not in RequestStatus.values:
            raise filters.FilterError(f"status: {status!r} is not one of {', '.join(RequestStatus.values)}")
        logs = logs.filter(status=status)
    if key := (query.get("key") or "").strip():
        if not (key.isascii() and key.isdigit()):
            raise filters.FilterError(f"key: {key!r} is not one of this tenant's keys")
        if not ApiKey.objects.filter(tenant=tenant, pk=int(key)).exists():
            # Another tenant's key id finds nothing, without making the database look through this tenant's rows.
            return logs.none()
        logs = logs.filter(api_key_id=int(key))
    return logs


def page(tenant: Tenant, query: Mapping[str, str], size: int = PAGE_SIZE) -> LogPage:
    """One page (one query): ``size`` rows after the cursor, and the cursor of the next."""
    try:
        logs = filtered(tenant, query)
        position = filters.cursor(query)
    except filters.FilterError as error:
        return LogPage(error=str(error))
    rows = list(filters.after(logs, position).order_by("-created_at", "-id").values(*SHOWN)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return LogPage(rows, filters.cursor_text(rows[-1]["created_at"], rows[-1]["id"]) if more else None)


def detail(tenant: Tenant, request_id: str) -> dict | None:
    return tenant_logs(tenant).filter(request_id=request_id).values(*SHOWN).first()


def tenant_keys(tenant: Tenant) -> list[ApiKey]:
    """For the key filter's choices."""
    return list(ApiKey.objects.filter(tenant=tenant).only("id", "prefix", "label").order_by("-created_at"))

