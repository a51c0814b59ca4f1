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

_local: OrderedDict[str, int] = OrderedDict()
_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopbase-affinity")


def _cache_key(state_id: str) -> str:
    return "hopbase:affinity:" + state_id


def remember(state_id: str, channel_id: int) -> None:
    _local[state_id] = channel_id
    _local.move_to_end(state_id)
    if len(_local) > MAX_LOCAL:
        _local.popitem(last=False)
    if settings.REDIS_URL:
        _writer.submit(cache.set, _cache_key(state_id), channel_id, TTL_SECONDS)


async def channel_for(state_id: str) -> int | None:
    """The channel that created the state; None when unknown (then any
    channel may try, and the provider answers whether it knows the id)."""
    channel_id = _local.get(state_id)
    if channel_id is None and settings.REDIS_URL:
        try:
            channel_id = await cache.aget(_cache_key(state_id))
        except Exception:
            channel_id = None
    return channel_id
