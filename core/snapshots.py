"""What the hot path reads from the database, and how it rides out the
database being gone (D3).

``database_call`` runs one database call for a request: on a small pool of
threads of its own (``hopbase-db-*``), never the event loop's default
executor, and under a client-side deadline (``DEADLINE``). A database host
that stopped answering holds at most those few threads: the request is
answered from what is known, and a call that never started is dropped with
its deadline. A failed call marks the database down
(``core.dependencies.database``): for a second or two nothing is tried, then
one probe at a time.

``Snapshot`` is a value loaded in one query and trusted for
HOPBASE_CONFIG_TTL seconds: the shape of the hot path's channel, price and
balance caches (channels_pool.selection, billing.pricing, billing.balances).
While one caller refreshes a stale value the others keep the stale one
rather than queue behind the database, and callers that find nothing
loaded wait together for one load (``Flights``: a burst on a process just
started asks the database once, not once per request, whose queue would
pass the deadline and trip the breaker). While the database is unreachable
the last value loaded is served, for up to HOPBASE_STALE_MAX_AGE seconds,
and refreshed in the background when a probe is due; past that age, or with
nothing loaded yet, the caller gets ``DatabaseUnavailable`` (503 in its
format). A refresh that fails for any other reason keeps the last value for
another TTL; a first load that fails so raises. There is no asyncio lock,
and a load is shared only within its own event loop, so a snapshot works
from any event loop (tests run several).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.db.backends.signals import connection_created

from core import loggers
from core.dependencies import database
from core.errors import DatabaseUnavailable

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
log = logging.getLogger(loggers.SNAPSHOTS)

# The longest a request waits on the database for one call (seconds); the
# same bound holds statements server-side on the pool's connections.
DEADLINE = 2.0
THREADS = 8
THREAD_PREFIX = "hopbase-db"
# What an unreachable database raises (a call past its deadline raises TimeoutError).
OUTAGE_ERRORS = (OperationalError, InterfaceError, OSError, TimeoutError)

_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix=THREAD_PREFIX)
_background: set[asyncio.Task] = set()


def refresh_connection() -> None:
    """Drop this thread's database connection if it is broken or past its
    age, as Django does at each request: pool threads never see a request
    signal. Never inside a transaction (a test's), which closing would end."""
    if not connection.in_atomic_block:
        close_old_connections()


def _bound_statements(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A statement on the pool's connections ends server-side at the deadline
    too, so a slow but living server frees the thread. Only there: the
    settlement sweep, exports and migrations run for as long as they need."""
    if connection.vendor == "postgresql" and threading.current_thread().name.startswith(THREAD_PREFIX):
        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {int(DEADLINE * 1000)}")


connection_created.connect(_bound_statements, dispatch_uid="hopbase-bound-statements")


def _in_thread(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    refresh_connection()
    return fn(*args)


async def database_call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the database pool, within ``DEADLINE`` seconds.
    Raises ``DatabaseUnavailable`` when the database is down (at once while
    it is known to be) or did not answer in time; any other error of ``fn``
    as it is."""
    if not database.attempt():
        raise DatabaseUnavailable()
    running = asyncio.get_running_loop().run_in_executor(_executor, _in_thread, fn, args)
    try:
        result = await asyncio.wait_for(running, DEADLINE)
    except OUTAGE_ERRORS as error:
        database.failed(error if not isinstance(error, TimeoutError) else f"no answer within {DEADLINE:g} s")
        raise DatabaseUnavailable() from error
    except BaseException:
        database.abandoned()
        raise
    database.succeeded()
    return result


def in_background(coroutine: Any) -> None:
    """Run a refresh nobody waits for, keeping a reference until it ends."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _background.add(task)
    task.add_done_callback(_background.discard)


def stale_max_age() -> float:
    return max(settings.HOPBASE_STALE_MAX_AGE, settings.HOPBASE_CONFIG_TTL)


class Flights(Generic[K, T]):
    """Calls for the same key at the same time share one: the first starts
    it, the others wait for its result (or its error: the same exception
    object, raised in each). A caller that gives up (cancelled) leaves it
    running for the rest, and to its end when all of them give up."""

    def __init__(self) -> None:
        self._flying: dict[K, asyncio.Future[T]] = {}

    async def run(self, key: K, call: Callable[[], Awaitable[T]]) -> T:
        flight = self._flying.get(key)
        if not self._under_way(flight):
            flight = self._flying[key] = asyncio.ensure_future(call())
            flight.add_done_callback(functools.partial(self._landed, key))
        return await asyncio.shield(flight)

    def busy(self, key: K) -> bool:
        """Whether a call for ``key`` is under way on this event loop (from
        the moment it is asked for, before it has taken a step)."""
        return self._under_way(self._flying.get(key))

    @staticmethod
    def _under_way(flight: asyncio.Future[T] | None) -> bool:
        # One of a loop closed before it ended is never waited for.
        return flight is not None and not flight.done() and flight.get_loop() is asyncio.get_running_loop()

    def _landed(self, key: K, flight: asyncio.Future[T]) -> None:
        if self._flying.get(key) is flight:
            del self._flying[key]
        if not flight.cancelled():
            flight.exception()  # taken: every caller may have given up


class Snapshot(Generic[T]):
    def __init__(self, loader: Callable[[], T]) -> None:
        self._loader = loader
        self._flights: Flights[None, T] = Flights()
        self._name = getattr(loader, "__name__", "snapshot")
        self._value: T | None = None
        self._loaded = False
        self._loaded_at = 0.0
        self._expires = 0.0

    async def get(self) -> T:
        now = time.monotonic()
        if self._loaded:
            if now < self._expires:
                return self._value  # type: ignore[return-value]
            refreshing = self._flights.busy(None)
            if self._usable(now) and (refreshing or not database.up):
                # Another caller is refreshing it, or the database is down:
                # the last known value, at once.
                if not refreshing and database.due():
                    in_background(self._refresh_quietly())
                return self._value  # type: ignore[return-value]
        return await self._flights.run(None, self._refresh)

    async def _refresh(self) -> T:
        try:
            value = await database_call(self._loader)
        except DatabaseUnavailable:
            if not (self._loaded and self._usable(time.monotonic())):
                raise
            return self._value  # type: ignore[return-value]
        except Exception:
            if not self._loaded:
                raise
            # Not an outage (a bug, a bad row): keep the last value for
            # another TTL and say so.
            log.exception("could not refresh %s; keeping the previous value", self._name)
            self._expires = time.monotonic() + settings.HOPBASE_CONFIG_TTL
            return self._value  # type: ignore[return-value]
        self._value, self._loaded = value, True
        self._loaded_at = time.monotonic()
        self._expires = self._loaded_at + settings.HOPBASE_CONFIG_TTL
        return value

    async def _refresh_quietly(self) -> None:
        try:
            await self._flights.run(None, self._refresh)
        except Exception:
            pass  # the database is still down: the next probe tells

    def _usable(self, now: float) -> bool:
        """Young enough to be served while the database is unreachable."""
        return now - self._loaded_at <= stale_max_age()

    def peek(self) -> T | None:
        """The last value loaded, without asking the database (None before
        the first load)."""
        return self._value

    def clear(self) -> None:
        self._value, self._loaded, self._loaded_at, self._expires = None, False, 0.0, 0.0
