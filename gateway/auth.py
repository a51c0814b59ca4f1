"""Who is calling: the key from whichever header the SDK sent (P7), mapped to
a tenant through a short-lived in-process cache so the hot path does not ask
the database for a key it has just seen.

A key past its expiry date (``ApiKey.expires_at``) is refused like a
revoked one, from that very moment: the cached copy carries the date. A
revocation reaches every process at once through Redis
(tenants.revocations: ``KeyCache.refuse`` marks the cached copy refused);
where that message is missed, a revoked key keeps working for at most
HOPBASE_CONFIG_TTL seconds (5 by default) in each process that had it
cached. Both caches (keys found, keys not found) are bounded and let the
least recently used entry go first.

While the database is unreachable (D3) a key is answered from what this
process last learnt of it, for up to HOPBASE_STALE_MAX_AGE seconds, unless
Redis remembers it was revoked since (one GET on that stale path only:
``revocations.refused_since``); a key it knows nothing of raises
``DatabaseUnavailable`` (503 in the caller's format, with retry-after),
never the "no such key" answer. With Redis down too, a key revoked during
the outage keeps working until HOPBASE_STALE_MAX_AGE.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings

from billing.finished import Finished
from core.dependencies import database
from core.errors import DatabaseUnavailable
from core.snapshots import Flights, database_call, in_background, stale_max_age
from core.vocabulary import ApiName, RequestStatus
from tenants import revocations
from tenants.models import KEY_PREFIX, ApiKey, hash_secret

# Bound the cache so a flood of random keys cannot grow it without limit;
# keys found to be unknown have a bound of their own, so that such a flood
# cannot push out the known keys a database outage is ridden out with.
MAX_CACHED_KEYS = 50_000
MAX_UNKNOWN_KEYS = 10_000


@dataclass(frozen=True)
class Caller:
    key_id: int
    key_prefix: str
    tenant_id: int
    tenant_name: str
    allowed_models: frozenset[str]
    rpm: int | None
    concurrency: int | None
    tpm: int | None = None  # tokens per minute (G5)
    price_multiplier: Decimal = Decimal("1")
    expires_at: float | None = None  # Unix time after which the key is refused; None: never
    extras: str = ""  # the request's priced surcharges (B10), in price_multiplier

    def allows(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def expired(self) -> bool:
        return self.expires_at is not None and time.time() >= self.expires_at

    def finished(self, request_id: str, api: ApiName, status: RequestStatus, **fields: Any) -> Finished:
        """The record of a request of this caller's that ends now (made now,
        unless ``created_at`` says when)."""
        if "created_at" not in fields:
            fields["created_at"] = datetime.now(UTC)
        return Finished(
            request_id=request_id,
            tenant_id=self.tenant_id,
            api_key_id=self.key_id,
            protocol=api,
            status=status,
            price_multiplier=self.price_multiplier,
            extras=self.extras,
            key_prefix=self.key_prefix,
            **fields,
        )


def key_from_request(headers: dict[str, str], query_key: str | None = None) -> str | None:
    """The key wherever an SDK sends it (P7). ``query_key`` is ``?key=``,
    which only Gemini's endpoints take (the caller passes it only there):
    elsewhere a key in the URL would end up in access logs."""
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or query_key or None


def _load(secret: str) -> Caller | None:
    key = ApiKey.objects.authenticate(secret)
    if key is None:
        return None
    digest = hash_secret(secret)
    refused_from = key.secret_refused_from(digest)  # a rotated key's previous secret ends with its grace
    return Caller(
        key_id=key.pk,
        key_prefix=key.secret_prefix(digest),
        tenant_id=key.tenant_id,
        tenant_name=key.tenant.name,
        allowed_models=frozenset(key.allowed_models or ()),
        rpm=key.rpm,
        concurrency=key.concurrency,
        tpm=key.tpm,
        price_multiplier=key.tenant.price_multiplier,
        expires_at=refused_from.timestamp() if refused_from is not None else None,
    )


@dataclass(frozen=True)
class Entry:
    caller: Caller | None  # None: no such key
    loaded_at: float
    expires: float


class KeyCache:
    def __init__(
        self,
        load: Callable[[str], Caller | None] = _load,
        refused_since: Callable[[str], Awaitable[float | None]] = revocations.refused_since,
    ) -> None:
        self._load = load
        self._refused_since = refused_since
        self._known: OrderedDict[str, Entry] = OrderedDict()  # least recently used first
        self._unknown: OrderedDict[str, Entry] = OrderedDict()
        # A key asked for by many requests at once is looked up once.
        self._lookups: Flights[str, Caller | None] = Flights()

    async def authenticate(self, secret: str) -> Caller | None:
        """The caller a secret belongs to, or None for no such key (or one
        past its expiry). Raises ``DatabaseUnavailable`` when the database
        cannot say and nothing known answers."""
        caller = await self._caller(secret)
        if caller is not None and caller.expired():
            return None
        return caller

    def knows(self, secret: str) -> bool:
        """Whether this process has found ``secret`` to be a live key (no I/O)."""
        if not secret.startswith(KEY_PREFIX):
            return False
        entry = self._known.get(hash_secret(secret))
        return entry is not None and entry.caller is not None and not entry.caller.expired()

    async def _caller(self, secret: str) -> Caller | None:
        if not secret.startswith(KEY_PREFIX):
            return None  # not a HopBase key: no need to ask
        digest = hash_secret(secret)
        now = time.monotonic()
        entry = self._entry(digest)
        if entry is not None:
            if now < entry.expires:
                return entry.caller
            usable = now - entry.loaded_at <= stale_max_age()
            refreshing = self._lookups.busy(digest)
            if usable and (refreshing or not database.up):
                # Being refreshed by another request, or the database is
                # down: what was last known, at once.
                if not refreshing and database.due():
                    in_background(self._refresh_quietly(secret, digest))
                return entry.caller if database.up else await self._stale(digest, entry)
        try:
            return await self._refresh(secret, digest)
        except DatabaseUnavailable:
            if entry is not None and time.monotonic() - entry.loaded_at <= stale_max_age():
                return await self._stale(digest, entry)
            raise

    async def _stale(self, digest: str, entry: Entry) -> Caller | None:
        """What was last known of a key while the database cannot say, unless
        Redis remembers the key was refused since: this process may have been
        cut off from Redis when that was announced. Asked only here, never on
        the normal path; a Redis that does not answer is not waited for (its
        breaker) and the copy is served."""
        caller = entry.caller
        if caller is None or caller.expired():
            return caller
        refused_from = await self._refused_since(digest)
        if refused_from is None or (caller.expires_at is not None and caller.expires_at <= refused_from):
            return caller
        self.refuse(digest, refused_from)  # the next request need not ask
        return replace(caller, expires_at=refused_from)

    def refuse(self, digest: str, refused_from: float) -> bool:
        """Mark the cached key with this hash refused from ``refused_from``
        (Unix time) on, if its copy says later or never; False when this
        process does not hold it (its next look-up asks the database).

        Called from the revocation listener's thread as well as the event
        loop: it only replaces the value of an entry (one assignment, atomic
        under the GIL), never moves or removes one, so the loop's own use of
        the cache is never disturbed. An entry dropped by the loop between
        the look-up and the assignment comes back refused: one entry past
        the bound until the next store, and never a key served wrongly. (A
        refresh that read the key just before its revocation committed may
        store the live copy again: served until its TTL, as without Redis.)"""
        entry = self._known.get(digest)
        if entry is None or entry.caller is None:
            return False
        expires_at = entry.caller.expires_at
        if expires_at is not None and expires_at <= refused_from:
            return False
        self._known[digest] = replace(entry, caller=replace(entry.caller, expires_at=refused_from))
        return True

    async def _refresh(self, secret: str, digest: str) -> Caller | None:
        return await self._lookups.run(digest, lambda: self._look_up(secret, digest))

    async def _look_up(self, secret: str, digest: str) -> Caller | None:
        caller = await database_call(self._load, secret)
        self._store(digest, caller)
        return caller

    async def _refresh_quietly(self, secret: str, digest: str) -> None:
        try:
            await self._refresh(secret, digest)
        except Exception:
            pass  # the database is still down: the next probe tells

    def _entry(self, digest: str) -> Entry | None:
        for cache in (self._known, self._unknown):
            entry = cache.get(digest)
            if entry is not None:
                cache.move_to_end(digest)  # most recently used: the last to go
                return entry
        return None

    def _store(self, digest: str, caller: Caller | None) -> None:
        now = time.monotonic()
        entry = Entry(caller, now, now + settings.HOPBASE_CONFIG_TTL)
        kept, other, bound = (
            (self._known, self._unknown, MAX_CACHED_KEYS) if caller else (self._unknown, self._known, MAX_UNKNOWN_KEYS)
        )
        other.pop(digest, None)  # a key revoked, or a key just made
        kept[digest] = entry
        kept.move_to_end(digest)
        while len(kept) > bound:
            kept.popitem(last=False)

    def clear(self) -> None:
        self._known.clear()
        self._unknown.clear()


keys = KeyCache()
revocations.keep_told(keys.refuse)
