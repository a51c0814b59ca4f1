"""``GET /readyz``: may a load balancer send this process requests?

200 while the process can serve; 503 while it is starting (its channel list
never loaded yet), draining (D1), or cannot serve because its spool is full
(D2: it refuses every new request then). A database or Redis outage keeps
it 200: the gateway rides those out (D3), and a balancer that pulled every
instance during one would turn it into a full outage. The body says why:

    {"status": "ready" | "starting" | "draining" | "spool_full",
     "dependencies": {"database": "up" | "down", "redis": "up" | "down" | "absent"},
     "open_requests": 12, "max_open_requests": 2000,
     "refused": {"draining": 0, "full": 0}, "spool_bytes": 0}

Each dependency is probed on a thread of its own (the drivers block), one
probe at a time, waited for at most ``PROBE_TIMEOUT`` (a probe stuck on a
silent host is not waited for again: the dependency is down until it
returns), and its answer kept for ``FRESH_FOR`` seconds, so a balancer
asking often costs the database and Redis next to nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections

from billing.recorder import recorder
from channels_pool.selection import directory
from core import lifecycle
from core.dependencies import sync_redis
from serving import admission

PROBE_TIMEOUT = 1.0
FRESH_FOR = 2.0


class Probe:
    """One dependency's state, from a cheap call made at most every
    ``FRESH_FOR`` seconds and waited for at most ``PROBE_TIMEOUT``."""

    def __init__(self, check: Callable[[], Any]) -> None:
        self._check = check
        self._running: concurrent.futures.Future[Any] | None = None
        self._started = 0.0
        self._up = False
        self._fresh_until = 0.0

    async def up(self) -> bool:
        now = time.monotonic()
        if now < self._fresh_until:
            return self._up
        if self._running is None or self._running.done():
            self._running, self._started = lifecycle.daemon_call(self._check), now
        running = self._running
        wait = self._started + PROBE_TIMEOUT - now
        if wait > 0 and not running.done():
            await asyncio.wait((asyncio.wrap_future(running),), timeout=wait)
        self._up = running.done() and running.exception() is None
        self._fresh_until = time.monotonic() + FRESH_FOR
        return self._up


def ping_database() -> None:
    # A connection of its own, not a pool thread's, closed at once.
    connection = connections.create_connection("default")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


def ping_redis() -> None:
    client = sync_redis(settings.REDIS_URL, PROBE_TIMEOUT)
    try:
        client.ping()
    finally:
        client.close()


database = Probe(ping_database)
redis_probe = Probe(ping_redis)
_started = False


async def started() -> bool:
    """The process has loaded its channel list once (what /healthz asks
    for): before that it cannot serve, whatever its dependencies say."""
    global _started
    if not _started:
        try:
            await asyncio.wait_for(directory.all(), PROBE_TIMEOUT)
            _started = True
        except Exception:
            pass
    return _started


def state(up: bool) -> str:
    return "up" if up else "down"


async def dependencies() -> dict[str, str]:
    if not settings.REDIS_URL:
        return {"database": state(await database.up()), "redis": "absent"}
    database_up, redis_up = await asyncio.gather(database.up(), redis_probe.up())
    return {"database": state(database_up), "redis": state(redis_up)}


async def report() -> tuple[int, dict[str, Any]]:
    """The /readyz status code and body."""
    states, is_started = await asyncio.gather(dependencies(), started())
    spool = recorder.spool
    if lifecycle.is_draining():
        status = "draining"
    elif not is_started:
        status = "starting"
    elif spool.full:
        status = "spool_full"
    else:
        status = "ready"
    return (200 if status == "ready" else 503), {
        "status": status,
        "dependencies": states,
        "open_requests": lifecycle.process.open_requests(),
        "max_open_requests": admission.max_open_requests(),
        "refused": dict(admission.refused),
        "spool_bytes": spool.size,
    }
