"""Rate and concurrency limits (F8): a key's requests per minute and open
requests, and a channel's open requests.

A request may wait up to HOPBASE_CAPACITY_WAIT seconds for capacity before
it is refused (key limits: 429 in the caller's format with ``retry-after``)
or, for channels, before the next channel is tried.

With REDIS_URL the counts are shared by every gateway process (a key's
limit is the limit across the fleet); without it they are this process's.
In Redis, requests per minute are counted in fixed one-minute windows, and
open-request counters expire an hour after their last change so that a
crashed process cannot hold capacity for ever. Limits cost nothing for keys
and channels that have none.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from django.conf import settings

from hopbase.errors import ErrorKind, GatewayError

POLL_SECONDS = 0.05
WINDOW_SECONDS = 60
COUNTER_TTL_SECONDS = 3600


class LocalCounters:
    """This process's counts."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._starts: dict[str, deque[float]] = {}

    async def take_slot(self, name: str, limit: int) -> bool:
        if self._open.get(name, 0) >= limit:
            return False
        self._open[name] = self._open.get(name, 0) + 1
        return True

    def give_back_slot(self, name: str) -> None:
        self._open[name] = max(0, self._open.get(name, 0) - 1)

    async def take_start(self, name: str, per_minute: int) -> float:
        """0 when a request may start now, else seconds until one may."""
        now = time.monotonic()
        starts = self._starts.setdefault(name, deque())
        while starts and starts[0] <= now - WINDOW_SECONDS:
            starts.popleft()
        if len(starts) >= per_minute:
            return starts[0] + WINDOW_SECONDS - now
        starts.append(now)
        return 0.0


class RedisCounters:
    """Counts shared through Redis by every gateway process."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._clients: dict[int, object] = {}
        self._pending: set[asyncio.Task] = set()

    def _redis(self):
        from redis import asyncio as aioredis

        loop_id = id(asyncio.get_running_loop())
        client = self._clients.get(loop_id)
        if client is None:
            client = aioredis.Redis.from_url(self._url, socket_timeout=1, socket_connect_timeout=1)
            self._clients[loop_id] = client
        return client

    async def take_slot(self, name: str, limit: int) -> bool:
        redis = self._redis()
        key = "hopbase:open:" + name
        async with redis.pipeline(transaction=True) as pipe:
            count, _ = await pipe.incr(key).expire(key, COUNTER_TTL_SECONDS).execute()
        if count > limit:
            await redis.decr(key)
            return False
        return True

    def give_back_slot(self, name: str) -> None:
        # Called from a request's last moments, maybe while it is cancelled:
        # the decrement runs as a task of its own.
        task = asyncio.get_running_loop().create_task(self._redis().decr("hopbase:open:" + name))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def take_start(self, name: str, per_minute: int) -> float:
        now = time.time()
        window = int(now // WINDOW_SECONDS)
        key = f"hopbase:rpm:{name}:{window}"
        redis = self._redis()
        async with redis.pipeline(transaction=True) as pipe:
            count, _ = await pipe.incr(key).expire(key, WINDOW_SECONDS * 2).execute()
        if count > per_minute:
            await redis.decr(key)
            return (window + 1) * WINDOW_SECONDS - now
        return 0.0


class Limits:
    def __init__(self) -> None:
        self._counters: LocalCounters | RedisCounters | None = None

    @property
    def counters(self) -> LocalCounters | RedisCounters:
        if self._counters is None:
            self._counters = RedisCounters(settings.REDIS_URL) if settings.REDIS_URL else LocalCounters()
        return self._counters

    async def admit_key(self, key_id: int, rpm: int | None, concurrency: int | None) -> None:
        """Wait for the key's capacity, or raise RATE_LIMIT. On success the
        caller owes a ``release_key`` when the request ends (if concurrency)."""
        if rpm is None and concurrency is None:
            return
        deadline = time.monotonic() + settings.HOPBASE_CAPACITY_WAIT
        name = f"key:{key_id}"
        if rpm is not None:
            while (wait := await self.counters.take_start(name, rpm)) > 0:
                if time.monotonic() + wait > deadline:
                    raise GatewayError(ErrorKind.RATE_LIMIT, retry_after=max(1, round(wait)))
                await asyncio.sleep(wait)
        if concurrency is not None:
            while not await self.counters.take_slot(name, concurrency):
                if time.monotonic() + POLL_SECONDS > deadline:
                    raise GatewayError(
                        ErrorKind.RATE_LIMIT, "Too many requests in flight for this API key.", retry_after=1
                    )
                await asyncio.sleep(POLL_SECONDS)

    def release_key(self, key_id: int, concurrency: int | None) -> None:
        if concurrency is not None:
            self.counters.give_back_slot(f"key:{key_id}")

    async def take_channel(self, channel_id: int, max_concurrency: int | None) -> bool:
        if max_concurrency is None:
            return True
        return await self.counters.take_slot(f"channel:{channel_id}", max_concurrency)

    def release_channel(self, channel_id: int, max_concurrency: int | None) -> None:
        if max_concurrency is not None:
            self.counters.give_back_slot(f"channel:{channel_id}")


limits = Limits()
