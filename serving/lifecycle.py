"""The gateway process's drain under its server (rule D1); the drain's
state is core.lifecycle's.

Under uvicorn (``manage.py serve``'s default), serving.uvicorn_web's
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
So a graceful drain takes two pieces:

1. ``install()``, called when hopbase.asgi is imported (before Daphne's
   ``Server.run`` adds its own trigger, so ours runs first), adds a
   ``before`` trigger that starts the drain and returns a Deferred for
   ``Lifecycle.drained()``: every request ended (those still open
   ``GRACE`` seconds after the deadline are cancelled), the request logs
   flushed, and what Twisted still had to send written out.
2. ``Lifecycle.see_through()`` (core.lifecycle) runs each API request's
   work as a task of its own and hands Daphne a ``SeenThrough`` future for
   it, whose cancellation, while draining, does not reach the work.

Meanwhile a new request is refused (serving.admission) and ``/readyz``
says 503 (serving.readiness).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from core import loggers
from core.lifecycle import Lifecycle, process
from serving import worker_group

log = logging.getLogger(loggers.LIFECYCLE)

# The longest wait for Twisted to send what the last requests wrote.
WRITE_OUT_TIMEOUT = 2.0

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
    (serving.worker_group). Then the server may stop listening."""
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
