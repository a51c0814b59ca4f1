"""What the relay sees of a graceful drain (rule D1): its deadline and its
signal, core.lifecycle's (gateway.assembly hands them over); the server
begins the drain (serving.lifecycle, serving.uvicorn_web)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

from channels_pool.upstream import Attempt


class Drain:
    """What the relay sees of a graceful drain (core.lifecycle): when the
    requests still open are to end, and a wake-up, when the drain begins,
    for every attempt that is waiting on its channel."""

    def __init__(self, deadline: Callable[[], float | None], signal: Callable[[], asyncio.Event]) -> None:
        self.deadline = deadline
        self._signal = signal
        # The attempts waiting in the event loop that last watched one (a
        # process has one loop; tests run one after another).
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._waiting: set[Attempt] = set()

    @classmethod
    def never(cls) -> Drain:
        """For a relay that is never drained (tests, tools)."""
        return cls(lambda: None, asyncio.Event)

    def watch(self, attempt: Attempt) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop() is not loop:
            self._loop, self._waiting = weakref.ref(loop), set()
            loop.create_task(self._wake_on_drain(self._signal(), self._waiting))
        self._waiting.add(attempt)

    def unwatch(self, attempt: Attempt) -> None:
        self._waiting.discard(attempt)

    @staticmethod
    async def _wake_on_drain(signal: asyncio.Event, attempts: set[Attempt]) -> None:
        await signal.wait()
        for attempt in list(attempts):
            attempt.wake()
