"""Which channel holds a piece of provider-side state (P9): a Responses id
that a later ``previous_response_id`` names, or a Gemini cached content.

Kept in process memory (bounded), and in Redis when it is configured so that
every gateway process can follow it. Which tenant owns the state is also
written durably (``channels_pool.provider_state``): a request naming state
another tenant owns is refused (``ForeignState``), whichever of the three
knows it. Writes to Redis go through a bounded
queue to one writer thread; past the bound a write is dropped and counted
(the process still remembers it). Lookups use short timeouts, and while
Redis is unreachable (``core.dependencies.redis``) they are not tried: the
state is then followed only where it is remembered locally, and elsewhere
any channel may try (the provider answers whether it knows the id).
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from collections import OrderedDict
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from channels_pool.provider_state import StateOwners
from channels_pool.provider_state import owners as state_owners
from core import loggers
from core.dependencies import LoopRedis, sync_redis
from core.dependencies import redis as redis_dependency

log = logging.getLogger(loggers.AFFINITY)

MAX_LOCAL = 100_000
MAX_QUEUED_WRITES = 10_000
TTL_SECONDS = 30 * 24 * 3600
WRITE_TIMEOUT = 0.5
DROP_WARNING_EVERY = 10.0  # seconds between warnings about dropped writes


def _cache_key(state_id: str) -> str:
    return "hopbase:affinity:" + state_id


def _legacy_key(state_id: str) -> str:
    """Where the previous version wrote it (Django's cache, key version 1)."""
    return ":1:hopbase:affinity:" + state_id


def _parse(raw: Any, legacy: Any) -> tuple[int, int] | None:
    try:
        if raw is not None:
            tenant_id, channel_id = raw.split(b":")
            return int(tenant_id), int(channel_id)
        if legacy is not None:
            tenant_id, channel_id = pickle.loads(legacy)
            return int(tenant_id), int(channel_id)
    except Exception:
        log.warning("unreadable affinity entry", exc_info=True)
    return None


class ForeignState(Exception):
    """The state a request names was created by another tenant."""


class Affinity:
    def __init__(self, owners: StateOwners | None = None) -> None:
        self.owners = state_owners if owners is None else owners
        # state id -> (tenant id, channel id): a tenant can only follow its own state.
        self._local: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._writes: queue.Queue[tuple[str, int, int]] = queue.Queue(MAX_QUEUED_WRITES)
        self._writer: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._redis = LoopRedis()
        self.dropped = 0  # writes dropped because the queue was full
        self._last_drop_warning = 0.0

    def remember(self, state_id: str, tenant_id: int, channel_id: int) -> None:
        self.owners.remember(state_id, tenant_id, channel_id)
        self._local[state_id] = (tenant_id, channel_id)
        self._local.move_to_end(state_id)
        if len(self._local) > MAX_LOCAL:
            self._local.popitem(last=False)
        if settings.REDIS_URL:
            self._start_writer()
            try:
                self._writes.put_nowait((state_id, tenant_id, channel_id))
            except queue.Full:
                self._dropped_one()

    def _dropped_one(self) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_warning >= DROP_WARNING_EVERY:
            self._last_drop_warning = now
            log.warning(
                "affinity writes to Redis are %d behind; %d dropped so far (followed in this process only)",
                self._writes.qsize(), self.dropped,
            )

    def _start_writer(self) -> None:
        if self._writer is not None and self._writer.is_alive():
            return
        with self._start_lock:
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_forever, name="hopbase-affinity", daemon=True)
                self._writer.start()

    def _write_forever(self) -> None:
        client = sync_redis(settings.REDIS_URL, WRITE_TIMEOUT)
        while True:
            state_id, tenant_id, channel_id = self._writes.get()
            # Held (up to the queue's bound) while Redis is away; one try per pause.
            while not redis_dependency.attempt():
                time.sleep(0.1)
            try:
                client.set(_cache_key(state_id), f"{tenant_id}:{channel_id}", ex=TTL_SECONDS)
            except (OSError, RedisError) as error:
                redis_dependency.failed(error)
                try:
                    self._writes.put_nowait((state_id, tenant_id, channel_id))  # try again later
                except queue.Full:
                    self._dropped_one()
            except Exception:
                redis_dependency.abandoned()
                log.exception("affinity write dropped")
            else:
                redis_dependency.succeeded()

    def pending_writes(self) -> int:
        return self._writes.qsize()

    async def channel_for(self, state_id: str, tenant_id: int) -> int | None:
        """The channel that created the tenant's state; None when HopBase
        does not know it (then any channel may try, and the provider answers
        whether it knows the id). Raises ``ForeignState`` when another tenant
        created it."""
        held = self._local.get(state_id)
        if held is not None:
            return self._own(held, tenant_id)
        owner = await self.owners.owner(state_id)
        if owner is not None and owner != tenant_id:
            raise ForeignState()
        held = await self._shared(state_id) if settings.REDIS_URL else None
        return None if held is None else self._own(held, tenant_id)

    @staticmethod
    def _own(held: tuple[int, int], tenant_id: int) -> int:
        if held[0] != tenant_id:
            raise ForeignState()
        return held[1]

    async def _shared(self, state_id: str) -> tuple[int, int] | None:
        found = await self._redis.call_or_none(
            lambda client: client.mget(_cache_key(state_id), _legacy_key(state_id)), "affinity lookup"
        )
        return None if found is None else _parse(*found)


affinity = Affinity()
