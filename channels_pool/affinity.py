"""Which channel holds a piece of provider-side state (P9): a Responses id
that a later ``previous_response_id`` names, or a Gemini cached content.

Kept in process memory (bounded), and in the shared cache when Redis is
configured so that every gateway process can follow it.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.cache import cache

MAX_LOCAL = 100_000
TTL_SECONDS = 30 * 24 * 3600


def _cache_key(state_id: str) -> str:
    return "hopbase:affinity:" + state_id


class Affinity:
    def __init__(self) -> None:
        # state id -> (tenant id, channel id): a tenant can only follow its own state.
        self._local: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopbase-affinity")

    def remember(self, state_id: str, tenant_id: int, channel_id: int) -> None:
        self._local[state_id] = (tenant_id, channel_id)
        self._local.move_to_end(state_id)
        if len(self._local) > MAX_LOCAL:
            self._local.popitem(last=False)
        if settings.REDIS_URL:
            self._writer.submit(cache.set, _cache_key(state_id), (tenant_id, channel_id), TTL_SECONDS)

    async def channel_for(self, state_id: str, tenant_id: int) -> int | None:
        """The channel that created the tenant's state; None when unknown or
        another tenant's (then any channel may try, and the provider answers
        whether it knows the id)."""
        owner = self._local.get(state_id)
        if owner is None and settings.REDIS_URL:
            try:
                owner = await cache.aget(_cache_key(state_id))
            except Exception:
                owner = None
        if owner is None or tuple(owner)[0] != tenant_id:
            return None
        return tuple(owner)[1]


affinity = Affinity()
