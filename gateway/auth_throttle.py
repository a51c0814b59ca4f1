"""Failed API authentications per client address (table E, "repeated failed
authentication from one address"): request -> *auth*.

Counted in fixed windows of HOPBASE_AUTH_FAILURE_WINDOW seconds, by the
address ``core.client_address`` gives (``X-Forwarded-For`` only from
HOPBASE_TRUSTED_PROXIES). Once an address has failed HOPBASE_AUTH_FAILURES
times in a window, a request from it is refused with 429 in its caller's
format, ``retry-after`` the rest of the window, before its key is looked up:
the database is not asked about guesses, and a guess learns nothing. A key
this process has already found live is still served, so one bad client
behind a shared address (a NAT, a proxy not listed as trusted) does not
lock out the others; a key it has not seen must wait for the window's end.

Counted in this process (a bounded table, least recently used addresses
first out) and, with REDIS_URL, in Redis as well, so that a fleet's count is
what counts: each failure adds one to the address's window there and keeps
the larger of the two counts. A request that authenticates never touches
Redis, and costs one comparison while no address is over its limit here.
A process learns that an address is over the limit from a failure of its
own, so across N processes an address may get N - 1 more tries. Redis
calls go through its breaker (``core.dependencies.redis``): while it is
unreachable, each process counts alone (failing open).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from core.dependencies import LoopRedis

MAX_ADDRESSES = 10_000
REDIS_PREFIX = "hopbase:authfail:"
THROTTLED_MESSAGE = "Too many failed authentications from this address. Please retry later."


@dataclass
class Window:
    index: int  # which window of HOPBASE_AUTH_FAILURE_WINDOW seconds since the epoch
    failures: int = 0


class FailedAuthentications:
    def __init__(self) -> None:
        self._windows: OrderedDict[str, Window] = OrderedDict()
        self._blocked_until = 0.0  # Unix time: until then some address may be over its limit
        self._redis = LoopRedis()

    @staticmethod
    def _now() -> tuple[int, float]:
        """The current window and the seconds left in it."""
        length = settings.HOPBASE_AUTH_FAILURE_WINDOW
        now = time.time()
        index = int(now // length)
        return index, (index + 1) * length - now

    def retry_after(self, address: str) -> int | None:
        """Seconds until ``address`` may try new keys again; None when it may now."""
        if time.time() >= self._blocked_until:
            return None  # no address is over its limit here
        window = self._windows.get(address)
        index, left = self._now()
        if window is None or window.index != index or window.failures < settings.HOPBASE_AUTH_FAILURES:
            return None
        return max(1, math.ceil(left))

    def blocking(self) -> bool:
        """Whether any address may be over its limit (the cheap test first)."""
        return time.time() < self._blocked_until

    async def failed(self, address: str) -> None:
        """One failed authentication from ``address``."""
        index, left = self._now()
        window = self._windows.get(address)
        if window is None or window.index != index:
            window = self._windows[address] = Window(index)
        window.failures += 1
        self._windows.move_to_end(address)
        while len(self._windows) > MAX_ADDRESSES:
            self._windows.popitem(last=False)
        if settings.REDIS_URL:
            shared = await self._count_shared(address, index, left)
            if shared is not None:
                window.failures = max(window.failures, shared)
        if window.failures >= settings.HOPBASE_AUTH_FAILURES:
            self._blocked_until = max(self._blocked_until, time.time() + left)

    async def _count_shared(self, address: str, index: int, left: float) -> int | None:
        """The fleet's count for this window, this failure included; None
        when Redis cannot say (then this process counts alone)."""
        key = f"{REDIS_PREFIX}{address}:{index}"

        async def count_this_one(client: Any) -> int:
            pipe = client.pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, max(1, math.ceil(left)) + 1)
            count, _ = await pipe.execute()
            return int(count)

        return await self._redis.call_or_none(count_this_one, "sharing the failed-authentication count")

    def clear(self) -> None:
        """Forget every count (tests)."""
        self._windows.clear()
        self._blocked_until = 0.0


failures = FailedAuthentications()
