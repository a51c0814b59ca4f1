"""The services HopBase leans on and may lose for a while: the database and
Redis (D3). Each is a ``Dependency``, a small circuit breaker:

- up: every call is tried;
- after a call fails it is down: calls are not tried for ``pause`` seconds
  (each caller falls back at once: the last known state for the database,
  failing open for Redis), then one call at a time is tried again as a
  probe, until one succeeds and it is up again.

One warning when an outage starts and one line when it ends, never one per
request. ``up`` is what a readiness check or a gauge reports.

Redis clients for the hot path come from ``async_redis``: short socket
timeouts and no retries, so a call to an unreachable Redis costs tens of
milliseconds, once per pause.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from redis.exceptions import RedisError

from core import loggers

log = logging.getLogger(loggers.DEPENDENCIES)
T = TypeVar("T")


class Dependency:
    def __init__(self, name: str, pause: float, consequence: str) -> None:
        self.name = name
        self.pause = pause
        self._consequence = consequence  # what HopBase does meanwhile, for the warning
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._probing = False
        self.failures = 0  # calls failed since the process started

    @property
    def up(self) -> bool:
        return self._down_since is None

    def attempt(self) -> bool:
        """May a call be made now? While down, True for one caller at a
        time once the pause is over: that caller must report back with
        ``succeeded``, ``failed`` or ``abandoned``."""
        if self._down_since is None:
            return True
        with self._lock:
            if self._down_since is None:
                return True
            if self._probing or time.monotonic() < self._retry_at:
                return False
            self._probing = True
            return True

    def due(self) -> bool:
        """Whether ``attempt`` would let a call through now (without claiming it)."""
        return self._down_since is None or not (self._probing or time.monotonic() < self._retry_at)

    def succeeded(self) -> None:
        if self._down_since is None:
            return
        with self._lock:
            since, self._down_since, self._probing = self._down_since, None, False
        if since is not None:
            log.warning("%s answers again, after %.1f s", self.name, time.monotonic() - since)

    def failed(self, error: BaseException | str) -> None:
        now = time.monotonic()
        with self._lock:
            self.failures += 1
            starting = self._down_since is None
            if starting:
                self._down_since = now
            self._retry_at = now + self.pause
            self._probing = False
        if starting:
            log.warning("%s unreachable (%s): %s until it answers", self.name, describe(error), self._consequence)

    def abandoned(self) -> None:
        """The call was given up for a reason of the caller's own (it was
        cancelled, or a bug): it proves nothing either way."""
        with self._lock:
            self._probing = False

    def reset(self) -> None:
        """Up, as at start-up (tests)."""
        with self._lock:
            self._down_since, self._retry_at, self._probing = None, 0.0, False


def describe(error: BaseException | str) -> str:
    if isinstance(error, str):
        return error
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# After a failure the database is left alone for a second and a half: a key,
# channel or price is answered from the last known state meanwhile.
database = Dependency(
    "database", pause=1.5, consequence="keys, channels and prices are served from the last known state"
)
# Redis is skipped for a few seconds after a failure: limits and affinity fail open.
redis = Dependency("redis", pause=3.0, consequence="rate and concurrency limits and affinity lookups fail open")


# Connect and read timeouts of a hot-path Redis call (seconds).
REDIS_TIMEOUT = 0.1


class StoreDown(Exception):
    """Redis is being left alone after a failure: do not even try."""


def async_redis(url: str, timeout: float = REDIS_TIMEOUT) -> Any:
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


def sync_redis(url: str, timeout: float, **options: Any) -> Any:
    """A blocking client with ``timeout`` to connect and to read, and no
    retries; ``options`` go to redis-py (a client name, say)."""
    from redis import Redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0), **options
    )


class LoopRedis:
    """Hot-path Redis for one purpose: a client per event loop (a client's
    connection pool belongs to the loop it was made on), and a call through
    the ``redis`` breaker that fails open."""

    def __init__(self, url: str | None = None, timeout: float = REDIS_TIMEOUT) -> None:
        self._url = url  # None: settings.REDIS_URL, read when first used
        self._timeout = timeout
        self._clients: dict[int, Any] = {}

    def client(self) -> Any:
        loop_id = id(asyncio.get_running_loop())
        client = self._clients.get(loop_id)
        if client is None:
            from django.conf import settings

            client = self._clients[loop_id] = async_redis(self._url or settings.REDIS_URL, self._timeout)
        return client

    def drop_idle_connections(self) -> None:
        """After a failure: the pool's other connections likely died with it."""
        client = self._clients.get(id(asyncio.get_running_loop()))
        if client is not None:
            asyncio.get_running_loop().create_task(client.connection_pool.disconnect(inuse_connections=False))

    async def call(self, command: Coroutine[Any, Any, T]) -> T:
        """``await command`` (made on this loop's client) through the
        breaker: ``StoreDown`` while Redis is being left alone; a failure
        is counted, and raised."""
        if not redis.attempt():
            command.close()
            raise StoreDown()
        try:
            result = await command
        except (OSError, RedisError) as error:
            redis.failed(error)
            # The pool's other connections likely died with this one (Redis
            # went away): drop them, rather than fail once more on each of
            # them when Redis is back, reopening the breaker every time.
            self.drop_idle_connections()
            raise
        except BaseException:
            redis.abandoned()
            raise
        redis.succeeded()
        return result

    async def call_or_none(self, call: Callable[[Any], Awaitable[T]], what: str) -> T | None:
        """``await call(client)`` through the breaker; None while Redis is
        being left alone, or when the call fails (an unexpected error is
        logged as ``what`` failing)."""
        if not redis.attempt():
            return None
        try:
            result = await call(self.client())
        except (OSError, RedisError) as error:
            redis.failed(error)
            return None
        except Exception:
            redis.abandoned()
            log.exception("%s failed", what)
            return None
        except BaseException:
            redis.abandoned()
            raise
        redis.succeeded()
        return result
