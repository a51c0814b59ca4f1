"""A process's life as a server, as its requests see it: serving, then
draining (rule D1), with the requests it has open.

The server's side (serving.lifecycle, serving.uvicorn_web) begins the
drain and awaits ``Lifecycle.drained()``; a request's own work reads
``is_draining()``, ``drain_deadline()`` and ``drain_signal()``
(gateway.relay.delivery ends a stream still open at the deadline with its
protocol's interruption event, and a held answer with table E's 503).

What must be written out once every request has ended joins with
``flush_when_drained`` when it is made, so the process's life knows
nothing of what it flushes: the key limits' slots and the budgets' charges
Redis has not taken yet (quick, 2 s at most each), then the request logs
(up to 10 s), last, so that a supervisor's SIGKILL during the longest wait
has lost nothing else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from django.conf import settings

from core import loggers

log = logging.getLogger(loggers.LIFECYCLE)
T = TypeVar("T")

# After the deadline, how long a request may take to end itself (with its
# interruption event) before it is cancelled, and how long a cancelled one
# may take to unwind (release, record).
GRACE = 1.0
UNWIND = 1.0

# Flushed once every request of a drain has ended: the quick ones in the
# order they joined, then those that asked to go last.
_flushes: list[Callable[[], Awaitable[None]]] = []
_last_flushes: list[Callable[[], Awaitable[None]]] = []


def flush_when_drained(flush: Callable[[], Awaitable[None]], *, last: bool = False) -> None:
    """Await ``flush()`` at the end of every drain, after the last request
    ended (it bounds its own wait; a failure is logged, not raised); with
    ``last``, after every other flush."""
    (_last_flushes if last else _flushes).append(flush)


class Lifecycle:
    """One process's drain state and the API requests it has open."""

    def __init__(self, drain_timeout: float | None = None) -> None:
        self._drain_timeout = drain_timeout  # None: HOPBASE_DRAIN_TIMEOUT
        # time.monotonic(), which is also every asyncio loop's time().
        self.deadline: float | None = None
        self._open: set[asyncio.Task[None]] = set()
        self._signals: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = weakref.WeakKeyDictionary()
        # What to close once drained, on the loop that made it (gateway.assembly's HTTP clients).
        self._closers: list[tuple[asyncio.AbstractEventLoop, Callable[[], Awaitable[None]]]] = []

    def close_when_drained(self, close: Callable[[], Awaitable[None]]) -> None:
        """Call ``close()`` at the end of the drain, on the running loop
        (an aiohttp session left open says so in the log at exit)."""
        self._closers.append((asyncio.get_running_loop(), close))

    async def close_all(self) -> None:
        loop = asyncio.get_running_loop()
        for owner, close in [item for item in self._closers if item[0] is loop]:
            try:
                await close()
            except Exception:
                log.exception("closing %r at the end of the drain failed", close)

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def open_requests(self) -> int:
        return len(self._open)

    def signal(self) -> asyncio.Event:
        """An event of the running loop, set once the drain has begun."""
        loop = asyncio.get_running_loop()
        event = self._signals.get(loop)
        if event is None:
            event = self._signals[loop] = asyncio.Event()
            if self.draining:
                event.set()
        return event

    def begin_drain(self) -> None:
        if self.deadline is not None:
            return
        timeout = settings.HOPBASE_DRAIN_TIMEOUT if self._drain_timeout is None else self._drain_timeout
        self.deadline = time.monotonic() + timeout
        log.warning("draining: %d requests open, ending them in at most %.1f s", len(self._open), timeout)
        for loop, event in list(self._signals.items()):
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    def see_through(self, work: Coroutine[Any, Any, None]) -> SeenThrough:
        """Run one request's work as a task of its own; what the server
        awaits, and cancels, is the ``SeenThrough`` returned."""
        task = asyncio.get_running_loop().create_task(work)
        self._open.add(task)
        task.add_done_callback(self._open.discard)
        return SeenThrough(self, task)

    async def drained(self) -> None:
        """Wait until every open request has ended, cancelling those still
        open ``GRACE`` seconds after the deadline; then flush the request
        logs. Returns early when nothing is open."""
        assert self.deadline is not None, "begin_drain() first"
        loop = asyncio.get_running_loop()
        cut_at: float | None = None
        while still_open := [task for task in self._open if task.get_loop() is loop and not task.done()]:
            if cut_at is None:
                wait = self.deadline + GRACE - loop.time()
                if wait <= 0:
                    log.warning("drain: cutting %d requests still open after the deadline", len(still_open))
                    for task in still_open:
                        task.cancel()
                    cut_at = loop.time()
                    continue
            else:
                wait = cut_at + UNWIND - loop.time()
                if wait <= 0:
                    log.error("drain: %d requests did not end when cut; exiting without them", len(still_open))
                    break
            await asyncio.wait(still_open, timeout=wait)
        for flush in (*_flushes, *_last_flushes):
            try:
                await flush()
            except Exception:
                log.exception("flushing %r at the end of the drain failed", flush)
        log.warning("drained")


class SeenThrough(asyncio.Future):
    """What the server holds for one request: done when the work is, with
    its outcome. A cancellation ends the work too, except while draining:
    Daphne's shutdown cancels every application, and the request goes on
    until it ends or ``drained()`` cuts it (then this ends quietly). A
    future, not a task awaiting the work: one task and one wait fewer per
    request."""

    def __init__(self, lifecycle: Lifecycle, work: asyncio.Task[None]) -> None:
        super().__init__(loop=work.get_loop())
        self._lifecycle = lifecycle
        self._work = work
        work.add_done_callback(self._work_ended)

    def cancel(self, msg: Any = None) -> bool:
        if self.done() or self._lifecycle.draining:
            return False
        # Done once the work has unwound (let go of its channel, recorded).
        return self._work.cancel(msg)

    def _work_ended(self, work: asyncio.Task[None]) -> None:
        if self.done():
            return
        if work.cancelled():
            if self._lifecycle.draining:
                self.set_result(None)
            else:
                super().cancel()
        elif (error := work.exception()) is not None:
            self.set_exception(error)  # the work's own failure, for Daphne to log
        else:
            self.set_result(None)


process = Lifecycle()


def is_draining() -> bool:
    return process.draining


def drain_deadline() -> float | None:
    """When requests still open are to be ended, in loop time (asyncio's
    ``loop.time()``, i.e. ``time.monotonic()``); None while serving."""
    return process.deadline


def drain_signal() -> asyncio.Event:
    """Set (on the running loop) when the drain begins: for a wait that
    should wake up to look at ``drain_deadline()``."""
    return process.signal()


def daemon_call(function: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
    """``function(*args)`` on a thread of its own that never holds up the
    process's exit (a pool thread stuck on a silent database host would:
    the executor joins its threads at exit)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(function(*args))
            except BaseException as error:
                future.set_exception(error)

    threading.Thread(target=run, name=f"hopbase-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return future
