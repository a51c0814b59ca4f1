"""A channel's streamed answer as the relay reads it (-> ``Attempt.next``):
in the relay's own task, each read all that has arrived, with a wait that a
deadline or the relay's word ends early without losing a byte.

For the gateway's own transport the body is aiohttp's reader itself, and
the relay's task waits on it directly: one wake-up per upstream read. (A
reading task of its own cost a second wake-up and a hand-over for every
event, a third of what HopBase added to a paced stream.) A wait is ended
early the way ``asyncio.timeout`` ends one, by cancelling the waiting task
at that await, which aiohttp's reader survives with its bytes in place; but
one timer serves many waits. Any other httpx stream (the tests' fakes) is
fed into a ``FedBody`` by the attempt's task.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import httpx

from channels_pool.http_client import UpstreamResponseStream

T = TypeVar("T")


class Body(Protocol):
    async def readany(self) -> bytes:
        """All that has arrived and was not read yet, waiting for some if
        nothing has; ``b""`` at the body's end; raises what cut it.
        Cancelling the wait loses nothing."""


def direct_body(response: httpx.Response) -> Body | None:
    """The reader of a response from the gateway's own transport (aiohttp's);
    None for any other httpx stream."""
    stream = response.stream
    if isinstance(stream, UpstreamResponseStream):
        return stream._aiohttp_response.content
    return None


class FedBody:
    """A body another task reads from an httpx stream and feeds in, holding
    at most about ``limit`` bytes: past it, feeding waits for the reader."""

    def __init__(self, limit: int) -> None:
        self._chunks: deque[bytes] = deque()
        self.size = 0
        self._limit = limit
        self._eof = False
        self._error: BaseException | None = None
        self._arrived: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None

    async def read_from(self, read: Callable[[], Awaitable[bytes]], cuts: tuple[type[BaseException], ...]) -> None:
        """Feed what ``read`` returns, to its end (``b""``) or to one of
        ``cuts``, which the body's reader then meets."""
        try:
            while chunk := await read():
                self._chunks.append(chunk)
                self.size += len(chunk)
                self._wake_reader()
                if self.size > self._limit:
                    self._room = asyncio.get_running_loop().create_future()
                    await self._room
        except cuts as error:
            self._error = error
        self._eof = True
        self._wake_reader()

    async def readany(self) -> bytes:
        while not self._chunks and not self._eof:
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                await self._arrived
            finally:
                self._arrived = None
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self.size = 0
            if self._room is not None and not self._room.done():
                self._room.set_result(None)
            return data
        if self._error is not None:
            raise self._error
        return b""

    def _wake_reader(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)


class TimedOut(Exception):
    """A wait reached its deadline, or was ended early by ``wake()``."""


class Waits:
    """Waits in the caller's task that end at a deadline or at ``wake()``.
    The deadlines of a reader move later with every event, so a timer due
    no later than the one asked for is kept: an early end is one more the
    reader allows for (it looks at its clocks and waits again), rather
    than a timer made and cancelled per read."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: asyncio.Task | None = None
        self._ended = False

    async def until(self, deadline: float, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, or ``TimedOut``. It must lose nothing when
        cancelled (a future of the caller's, aiohttp's ``readany``)."""
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._timer_fired)
        task = self._waiting = asyncio.current_task()
        try:
            return await awaitable
        except asyncio.CancelledError:
            if not self._ended:
                raise
            self._ended = False
            if task.uncancel() > 0:  # cancelled from outside as well
                raise
            raise TimedOut() from None
        finally:
            self._waiting = None

    def wake(self) -> None:
        """End the wait under way, if there is one."""
        waiting = self._waiting
        if waiting is not None and not self._ended:
            self._ended = True
            waiting.cancel()

    def _timer_fired(self) -> None:
        self._timer = None
        self.wake()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
