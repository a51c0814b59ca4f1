"""Who is calling: the key from whichever header the SDK sent (P7), mapped to
a tenant through a short-lived in-process cache so the hot path does not ask
the database for a key it has just seen.

A revoked key keeps working for at most HOPBASE_CONFIG_TTL seconds (5 by
default) in each gateway process that had it cached.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from billing.recorder import Finished
from core.snapshots import refresh_connection
from core.vocabulary import ApiName, RequestStatus
from hopbase.models import ApiKey, hash_secret

# Bound the cache so a flood of random keys cannot grow it without limit.
MAX_CACHED_KEYS = 50_000


@dataclass(frozen=True)
class Caller:
    key_id: int
    key_prefix: str
    tenant_id: int
    tenant_name: str
    allowed_models: frozenset[str]
    rpm: int | None
    concurrency: int | None
    has_spend_limit: bool = False
    price_multiplier: Decimal = Decimal("1")

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def finished(self, request_id: str, api: ApiName, status: RequestStatus, **fields: Any) -> Finished:
        """The record of a request of this caller's that ends now (made now,
        unless ``created_at`` says when)."""
        fields.setdefault("created_at", timezone.now())
        return Finished(
            request_id=request_id,
            tenant_id=self.tenant_id,
            api_key_id=self.key_id,
            protocol=api,
            status=status,
            price_multiplier=self.price_multiplier,
            **fields,
        )


def key_from_request(headers: dict[str, str], query_key: str | None) -> str | None:
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or query_key or None


def _load(secret: str) -> Caller | None:
    refresh_connection()
    key = ApiKey.objects.authenticate(secret)
    if key is None:
        return None
    return Caller(
        key_id=key.pk,
        key_prefix=key.prefix,
        tenant_id=key.tenant_id,
        tenant_name=key.tenant.name,
        allowed_models=frozenset(key.allowed_models or ()),
        rpm=key.rpm,
        concurrency=key.concurrency,
        has_spend_limit=key.monthly_limit_usd is not None,
        price_multiplier=key.tenant.price_multiplier,
    )


class KeyCache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Caller | None]] = {}

    async def authenticate(self, secret: str) -> Caller | None:
        digest = hash_secret(secret)
        now = time.monotonic()
        hit = self._entries.get(digest)
        if hit is not None and hit[0] > now:
            return hit[1]
        caller = await sync_to_async(_load, thread_sensitive=False)(secret)
        if len(self._entries) >= MAX_CACHED_KEYS:
            self._entries.clear()
        self._entries[digest] = (now + settings.HOPBASE_CONFIG_TTL, caller)
        return caller

    def clear(self) -> None:
        self._entries.clear()


keys = KeyCache()
