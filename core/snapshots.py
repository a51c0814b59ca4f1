"""A value loaded from the database in one query and trusted for
HOPBASE_CONFIG_TTL seconds: the shape of the hot path's price and balance
caches (billing.pricing.PriceBook, billing.balances.BalanceBook).

The load runs in a worker thread (``sync_to_async``, not thread-sensitive:
a per-request thread would open a database connection per request). While
one caller refreshes a stale value the others keep the stale one rather than
queue behind the database; if the refresh fails, the stale value is kept for
another TTL (a first load that fails raises). There is no asyncio lock, so a snapshot works
from any event loop (tests run several).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connection

T = TypeVar("T")
log = logging.getLogger("hopbase.billing")


def refresh_connection() -> None:
    """Drop this thread's database connection if it is broken or past its
    age, as Django does at each request: pool threads never see a request
    signal. Never inside a transaction (a test's), which closing would end."""
    if not connection.in_atomic_block:
        close_old_connections()


class Snapshot(Generic[T]):
    def __init__(self, loader: Callable[[], T]) -> None:
        def load() -> T:
            refresh_connection()
            return loader()

        self._load = sync_to_async(load, thread_sensitive=False)
        self._name = getattr(loader, "__name__", "snapshot")
        self._value: T | None = None
        self._loaded = False
        self._expires = 0.0
        self._loading = False

    async def get(self) -> T:
        if self._loaded and (time.monotonic() < self._expires or self._loading):
            return self._value  # type: ignore[return-value]
        self._loading = True
        try:
            value = await self._load()
        except Exception:
            if not self._loaded:
                raise
            # A database blip must not refuse every request: keep the last
            # value for another TTL and say so.
            log.exception("could not refresh %s; keeping the previous value", self._name)
            self._expires = time.monotonic() + settings.HOPBASE_CONFIG_TTL
            return self._value  # type: ignore[return-value]
        finally:
            self._loading = False
        self._value, self._loaded = value, True
        self._expires = time.monotonic() + settings.HOPBASE_CONFIG_TTL
        return value

    def clear(self) -> None:
        self._value, self._loaded, self._expires = None, False, 0.0
