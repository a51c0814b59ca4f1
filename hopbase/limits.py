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
import logging
import time
from collections import deque

from django.conf import settings
from redis.exceptions import RedisError

from core.errors import ErrorKind, GatewayError

log = logging.getLogger("hopbase.limits")

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


# Count one more under a limit, or refuse, in one step: a request
# cancelled half-way can neither leave a slot counted that it does not know
# it holds, nor free one.
TAKE_UNDER_LIMIT = """
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if count > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  return 0
end
return 1
"""


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

    def _detach(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def take_slot(self, name: str, limit: int) -> bool:
        key = "hopbase:open:" + name
        taking = asyncio.ensure_future(self._redis().eval(TAKE_UNDER_LIMIT, 1, key, limit, COUNTER_TTL_SECONDS))
        try:
            return bool(await asyncio.shield(taking))
        except asyncio.CancelledError:
            # The caller is gone; if the slot was taken anyway, give it back.
            taking.add_done_callback(lambda done: self._give_back_if_taken(done, name))
            raise

    def _give_back_if_taken(self, done: asyncio.Future, name: str) -> None:
        if not done.cancelled() and done.exception() is None and done.result():
            self.give_back_slot(name)

    def give_back_slot(self, name: str) -> None:
        # Called from a request's last moments, maybe while it is cancelled:
        # the decrement runs as a task of its own.
        self._detach(self._redis().decr("hopbase:open:" + name))

    async def take_start(self, name: str, per_minute: int) -> float:
        now = time.time()
        window = int(now // WINDOW_SECONDS)
        key = f"hopbase:rpm:{name}:{window}"
        if await self._redis().eval(TAKE_UNDER_LIMIT, 1, key, per_minute, WINDOW_SECONDS * 2):
            return 0.0
        return (window + 1) * WINDOW_SECONDS - now


class Limits:
    def __init__(self, counters: LocalCounters | RedisCounters | None = None) -> None:
        # Chosen at first use unless given: settings may not be ready at import.
        self._counters = counters

    @property
    def counters(self) -> LocalCounters | RedisCounters:
        if self._counters is None:
            self._counters = RedisCounters(settings.REDIS_URL) if settings.REDIS_URL else LocalCounters()
        return self._counters

    async def admit_key(self, key_id: int, rpm: int | None, concurrency: int | None) -> bool:
        """Wait for the key's capacity, or raise RATE_LIMIT. True when a slot
        was taken, which the caller gives back with ``release_key``.

        If the shared store cannot be reached the request is let through:
        an outage of the limits store must not stop the gateway."""
        if rpm is None and concurrency is None:
            return False
        try:
            return await self._admit_key(key_id, rpm, concurrency)
        except (OSError, RedisError) as error:
            log.warning("limits store unavailable, key %s let through: %s", key_id, error)
            return False

    async def _admit_key(self, key_id: int, rpm: int | None, concurrency: int | None) -> bool:
        deadline = time.monotonic() + settings.HOPBASE_CAPACITY_WAIT
        name = f"key:{key_id}"
        if rpm is not None:
            while (wait := await self.counters.take_start(name, rpm)) > 0:
                if time.monotonic() + wait > deadline:
                    raise GatewayError(ErrorKind.RATE_LIMIT, retry_after=max(1, round(wait)))
                await asyncio.sleep(wait)
        if concurrency is None:
            return False
        while not await self.counters.take_slot(name, concurrency):
            if time.monotonic() + POLL_SECONDS > deadline:
                raise GatewayError(ErrorKind.RATE_LIMIT, "Too many requests in flight for this API key.", retry_after=1)
            await asyncio.sleep(POLL_SECONDS)
        return True

    def release_key(self, key_id: int) -> None:
        self.counters.give_back_slot(f"key:{key_id}")

    async def take_channel(self, channel_id: int, max_concurrency: int | None) -> bool:
        if max_concurrency is None:
            return True
        try:
            return await self.counters.take_slot(f"channel:{channel_id}", max_concurrency)
        except (OSError, RedisError) as error:
            log.warning("limits store unavailable, channel %s not limited: %s", channel_id, error)
            return True

    def release_channel(self, channel_id: int, max_concurrency: int | None) -> None:
        if max_concurrency is not None:
            self.counters.give_back_slot(f"channel:{channel_id}")


limits = Limits()
