"""A credential kept until shortly before it expires (C3, C4): however many
requests find it stale at once, one refresh runs and all of them wait for
it; a failed refresh fails those requests and the next one tries again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
# Fetches a fresh value and says until when (time.monotonic()) it may be used.
Fetch = Callable[[], Awaitable[tuple[T, float]]]


class Refreshed(Generic[T]):
    def __init__(self, fetch: Fetch[T]) -> None:
        self._fetch = fetch
        self._value: T | None = None
        self._until = 0.0
        self._running: asyncio.Future[T] | None = None
        self.refreshes = 0  # how many fetches ran (tests count them)

    async def get(self) -> T:
        if self._value is not None and time.monotonic() < self._until:
            return self._value
        running = self._running
        if running is None:
            running = self._running = asyncio.get_running_loop().create_task(self._refresh())
        # shield: one waiter cancelled (its client gone) must not cancel the
        # refresh the others wait for.
        return await asyncio.shield(running)

    async def _refresh(self) -> T:
        self.refreshes += 1
        try:
            value, until = await self._fetch()
        finally:
            self._running = None
        self._value, self._until = value, until
        return value

    def invalidate(self) -> None:
        """The provider refused what is kept: the next request fetches anew."""
        self._value, self._until = None, 0.0
