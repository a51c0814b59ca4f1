"""The gateway process's life as a server: serving, then draining (rule D1).

Under uvicorn (``manage.py serve``'s default), hopbase.uvicorn_web's
server begins the drain on SIGTERM (or SIGINT) and awaits ``shut_down``
before uvicorn stops listening. Under Daphne, this module hooks Twisted.

Daphne runs on Twisted's asyncio reactor. On SIGTERM (or SIGINT) the
reactor fires its ``shutdown`` system event in phases:

- ``before``: its triggers are called in the order they were added, and the
  shutdown waits for the Deferreds they return. Daphne 4.2.3 adds one
  (``Server.kill_all_applications``) that cancels every application task;
- ``during``: Twisted stops listening, drops every client socket and stops
  the loop; Daphne returns and the process exits 0.

Until ``during`` the listening socket and the clients' sockets stay open.
So a graceful drain takes two pieces, both here:

1. ``install()``, called when hopbase.asgi is imported (before Daphne's
   ``Server.run`` adds its own trigger, so ours runs first), adds a
   ``before`` trigger that starts the drain and returns a Deferred for
   ``Lifecycle.drained()``: every request ended (those still open
   ``GRACE`` seconds after the deadline are cancelled), the request logs
   flushed, and what Twisted still had to send written out.
2. ``Lifecycle.see_through()`` runs each API request's work as a task of
   its own and hands Daphne a ``SeenThrough`` future for it, whose
   cancellation, while draining, does not reach the work.

Meanwhile a new request is refused (hopbase.admission), ``/readyz`` says
503 (hopbase.readiness), and a request's own work reads ``is_draining()``
and ``drain_deadline()``: hopbase.delivery ends a stream still open at the
deadline with its protocol's interruption event, and a held answer with
table E's 503.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from django.conf import settings

from billing.recorder import recorder
from core import loggers
from hopbase import worker_group
from hopbase.limits import limits
from hopbase.spend import spend

log = logging.getLogger(loggers.LIFECYCLE)
T = TypeVar("T")

# After the deadline, how long a request may take to end itself (with its
# interruption event) before it is cancelled, and how long a cancelled one
# may take to unwind (release, record).
GRACE = 1.0
UNWIND = 1.0
# The longest wait for the request logs to be written, and for Twisted to
# send what the last requests wrote.
FLUSH_TIMEOUT = 10.0
LIMITS_FLUSH_TIMEOUT = 2.0
WRITE_OUT_TIMEOUT = 2.0


class Lifecycle:
    """One process's drain state and the API requests it has open."""

    def __init__(self, drain_timeout: float | None = None) -> None:
        self._drain_timeout = drain_timeout  # None: HOPBASE_DRAIN_TIMEOUT
        # time.monotonic(), which is also every asyncio loop's time().
        self.deadline: float | None = None
        self._open: set[asyncio.Task[None]] = set()
        self._signals: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = weakref.WeakKeyDictionary()
        # What to close once drained, on the loop that made it (hopbase.gateway's HTTP clients).
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
        # Slots given back while Redis was away: removed now if it answers,
        # rather than left counted until they lapse.
        await limits.flush(LIMITS_FLUSH_TIMEOUT)
        await spend.flush(LIMITS_FLUSH_TIMEOUT)  # charges Redis has not taken yet
        if not await asyncio.wrap_future(daemon_call(recorder.flush, FLUSH_TIMEOUT)):
            log.error("drain: request logs not all written within %.0f s", FLUSH_TIMEOUT)
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


_installed = False


def install(lifecycle: Lifecycle = process) -> None:
    """Drain on the reactor's shutdown, once, when Daphne's Twisted reactor
    is installed (daphne.server does that on import, before the application
    is imported); elsewhere (tests, commands) nothing to do."""
    global _installed
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or _installed:
        return
    from twisted.internet.defer import Deferred

    def before_shutdown() -> Deferred[None]:
        lifecycle.begin_drain()
        return Deferred.fromFuture(asyncio.ensure_future(shut_down(lifecycle, lambda: written_out(reactor))))

    reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
    _installed = True


async def shut_down(lifecycle: Lifecycle, written_out: Callable[[], Awaitable[None]] | None = None) -> None:
    """The drain, once begun, to its end: every request ended and recorded,
    what the server still had to send written out, the upstream clients
    closed, and (under ``manage.py serve``) every peer worker drained too
    (hopbase.worker_group). Then the server may stop listening."""
    try:
        await lifecycle.drained()
        if written_out is not None:
            await written_out()
        await lifecycle.close_all()
        await worker_group.drained_with_peers()
    except Exception:
        log.exception("drain failed")


async def written_out(reactor: Any) -> None:
    """Wait (a little) until Twisted has sent every buffered byte: its
    ``during`` phase drops sockets with what is still in their buffers, and
    the last thing a drained stream wrote is its ending. Twisted keeps a
    socket among its writers exactly while it has bytes to send, and has no
    event for it, so this polls."""
    deadline = time.monotonic() + WRITE_OUT_TIMEOUT
    while reactor.getWriters() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
