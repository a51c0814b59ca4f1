"""Key revocations told to every gateway process at once, through Redis (D3).

Each gateway process keeps the keys it has seen for HOPBASE_CONFIG_TTL
seconds (gateway.auth), and while the database is unreachable serves them
from that copy for up to HOPBASE_STALE_MAX_AGE: left at that, a key revoked
just before an outage would be served that long. So whatever can make a key
refused (``ApiKey.revoke``, the admin's revoke action, a key's expiry set or
changed: tenants.models) is announced when its transaction commits, in one
Redis call that writes two things:

- a message on ``channel_name()`` (one channel per Redis database): every
  gateway process's ``Subscriber`` (a thread of its own, started with the
  background jobs) marks the key refused in its cache at once, so its next
  request is refused (401 in the caller's format) even while the database
  is down, and even within the cache's TTL;
- a marker, ``MARKER_PREFIX`` + the key's hash, holding the moment the key
  is refused from, kept HOPBASE_STALE_MAX_AGE (plus a margin): a process
  that was cut off from Redis when the message went out asks for it, one
  GET, whenever it answers a key from stale state because the database is
  down (``refused_since``), and never on the normal path.

What goes through Redis is the key's hash (what the database stores) and a
time, never the secret. An announcement only ever brings a key's refusal
earlier, in the marker and in each cache: two announcements crossing each
other can never bring a revoked key back. A later expiry (or none) is learnt
from the database, within HOPBASE_CONFIG_TTL.

Publishing waits at most ``PUBLISH_TIMEOUT`` to connect and as long for the
answer, and never raises: the change is committed already, and where Redis
did not take it each process still refuses the key within
HOPBASE_CONFIG_TTL once it reaches the database. With Redis down as well as
the database, a revoked key may be served until HOPBASE_STALE_MAX_AGE.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from redis.connection import parse_url
from redis.exceptions import RedisError

from core import loggers
from core.dependencies import LoopRedis, describe, sync_redis
from core.periodic import BackgroundThread
from core.snapshots import stale_max_age

log = logging.getLogger(loggers.REVOCATIONS)

CHANNEL_PREFIX = "hopbase:key-refusals:"
MARKER_PREFIX = "hopbase:key-refused:"
# The admin's request (or a command) waits at most this to connect, and as
# long for Redis's answer: a revocation must not hang on a Redis outage.
PUBLISH_TIMEOUT = 0.5
# Markers outlive the oldest stale copy a process may still serve by this much
# (the announcement's own delay, clocks a little apart).
MARKER_MARGIN = 60
# Keys per Redis call: a bulk revocation is a few calls, never one huge one.
BATCH = 500
KEY_HASH = re.compile(r"[0-9a-f]{64}")

# Keeps the earliest moment in each marker (a later announcement never
# postpones a refusal), renews its expiry, and publishes the batch: one round
# trip. KEYS: the markers; ARGV: seconds to keep them, then each key's moment
# (as KEYS), then the channel and the message.
ANNOUNCE = """
local ttl = ARGV[1]
for i, marker in ipairs(KEYS) do
  local at = ARGV[i + 1]
  local known = tonumber(redis.call('GET', marker) or '')
  if known == nil or tonumber(at) < known then
    redis.call('SET', marker, at, 'EX', ttl)
  else
    redis.call('EXPIRE', marker, ttl)
  end
end
return redis.call('PUBLISH', ARGV[#KEYS + 2], ARGV[#KEYS + 3])
"""


@dataclass(frozen=True)
class Refusal:
    """A key is refused from ``refused_from`` (Unix time) on."""

    key_hash: str
    refused_from: float
    prefix: str = ""  # for log lines only; never sent

    def __post_init__(self) -> None:
        if not KEY_HASH.fullmatch(self.key_hash):
            raise ValueError("not a key hash")
        if not math.isfinite(self.refused_from):
            raise ValueError("not a moment")


def channel_name(url: str) -> str:
    """Pub/sub channels are shared by all of a Redis server's databases: the
    database's number keeps two deployments (or test runs) on one server
    apart."""
    return f"{CHANNEL_PREFIX}{parse_url(url).get('db', 0)}"


def marker_ttl() -> int:
    return math.ceil(stale_max_age()) + MARKER_MARGIN


# -- announcing ----------------------------------------------------------------------


def announce(refusals: Sequence[Refusal]) -> None:
    """Publish ``refusals`` once the current transaction commits (at once
    outside one): a rolled-back revocation is never announced, and none is
    announced before other processes' databases can see it."""
    if refusals:
        transaction.on_commit(partial(publish, list(refusals)), robust=True)


def publish(refusals: Sequence[Refusal], url: str | None = None) -> bool:
    """Tell every gateway process, this one included (without Redis, only
    this one). True when Redis took every refusal; never raises."""
    refuse_here(refusals)
    url = url or settings.REDIS_URL
    if not refusals or not url:
        return not refusals
    client = sync_redis(url, PUBLISH_TIMEOUT)
    channel = channel_name(url)
    try:
        for start in range(0, len(refusals), BATCH):
            batch = refusals[start:start + BATCH]
            message = json.dumps([[r.key_hash, r.refused_from] for r in batch], separators=(",", ":"))
            client.eval(ANNOUNCE, len(batch), *(MARKER_PREFIX + r.key_hash for r in batch),
                        marker_ttl(), *(repr(r.refused_from) for r in batch), channel, message)
    except (RedisError, OSError) as error:
        # After the first failed batch nothing more is tried: each would cost the timeout again.
        log.warning(
            "could not tell the gateways through Redis that %d key(s) are refused (%s): %s; each process "
            "stops accepting them within HOPBASE_CONFIG_TTL once it reaches the database",
            len(refusals), ", ".join(r.prefix for r in refusals[:5] if r.prefix) or "-", describe(error),
        )
        return False
    finally:
        client.close()
    return True


# This process's caches of keys, told of every refusal: the request path's
# joins with ``keep_told`` when it is imported, so the domain announces
# without knowing who keeps copies of its keys.
_caches: list[Callable[[str, float], bool]] = []


def keep_told(refuse: Callable[[str, float], bool]) -> None:
    """Have ``refuse(key_hash, refused_from)`` called for every refusal this
    process learns of, announced here or received; it answers whether it held the key."""
    _caches.append(refuse)


def refuse_here(refusals: Iterable[Refusal]) -> int:
    """Mark ``refusals`` in this process's key caches; how many they held."""
    return sum(refuse(r.key_hash, r.refused_from) for r in refusals for refuse in _caches)


# -- the stale path ------------------------------------------------------------------

_redis = LoopRedis()


async def refused_since(key_hash: str) -> float | None:
    """The moment a marker says this key is refused from, or None (none, no
    Redis, or Redis not answering: the hot path's breaker, which fails open
    within its 100 ms timeout)."""
    if not settings.REDIS_URL:
        return None
    raw = await _redis.call_or_none(lambda client: client.get(MARKER_PREFIX + key_hash), "revocation look-up")
    try:
        moment = float(raw) if raw is not None else None
    except ValueError:
        return None
    return moment if moment is not None and math.isfinite(moment) else None


# -- listening -----------------------------------------------------------------------

# get_message waits this long at most, so that a stop is noticed that soon.
POLL = 0.5
# Nothing heard for this long: PING; no answer within PONG_TIMEOUT more: the
# subscription is taken for dead (a silent host cuts nothing) and made anew.
QUIET = 10.0
PONG_TIMEOUT = 5.0
# Waits between attempts to subscribe again: doubled from the first to the last.
RETRY_FIRST, RETRY_LAST = 0.5, 5.0
# Socket timeout for one reply on the subscription's connection.
READ_TIMEOUT = 5.0


class SubscriptionDead(ConnectionError):
    pass


class Subscriber(BackgroundThread):
    """This process's listener for refusals: one thread, one Redis
    connection (named ``hopbase-revocations-<pid>``, for ``CLIENT LIST``).
    The key cache is the process's, shared by every event loop, and so is
    its listener; a thread rather than a task, so that a busy event loop
    never delays a revocation and a Redis outage never touches a loop. The
    same thread's life as ``core.periodic.Periodic`` (serving.background)."""

    def __init__(self, url: str, refuse: Callable[[list[Refusal]], object] = refuse_here) -> None:
        super().__init__("key-revocations")
        self._url = url
        self._refuse = refuse
        # Set while subscribed, and while not: for whoever waits on either (tests).
        self.subscribed = threading.Event()
        self.lost = threading.Event()
        self.received = 0  # refusals received since start
        self._lost_at: float | None = None  # when the subscription was lost (None: it is not)
        self._wait = RETRY_FIRST

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except (RedisError, OSError) as error:
                self.subscribed.clear()
                self.lost.set()
                if self._lost_at is None:
                    # One warning per outage, not one per attempt.
                    self._lost_at = time.monotonic()
                    log.warning(
                        "key revocations: no Redis subscription (%s); until it is back, a process learns of a "
                        "revoked key from the database, or on the stale path from its marker", describe(error),
                    )
                self._stopping.wait(self._wait)
                self._wait = min(self._wait * 2, RETRY_LAST)

    def _listen(self) -> None:
        """Subscribed until asked to stop; raises when the subscription fails."""
        client = sync_redis(self._url, READ_TIMEOUT, client_name=f"hopbase-revocations-{os.getpid()}")
        pubsub = client.pubsub()
        try:
            pubsub.subscribe(channel_name(self._url))
            heard, pinged = time.monotonic(), None
            while not self._stopping.is_set():
                message = pubsub.get_message(timeout=POLL)
                now = time.monotonic()
                if message is not None:
                    heard, pinged = now, None
                    self._take(message)
                elif pinged is not None and now - pinged > PONG_TIMEOUT:
                    raise SubscriptionDead(f"no answer to PING within {PONG_TIMEOUT:g} s")
                elif pinged is None and now - heard > QUIET:
                    pubsub.ping()
                    pinged = now
        finally:
            self.subscribed.clear()
            try:
                pubsub.close()
            finally:
                client.close()

    def _take(self, message: dict[str, Any]) -> None:
        if message["type"] == "subscribe":
            if self._lost_at is not None:
                log.warning("key revocations: subscribed again, after %.1f s", time.monotonic() - self._lost_at)
            self._lost_at, self._wait = None, RETRY_FIRST
            self.lost.clear()
            self.subscribed.set()
        elif message["type"] == "message":
            refusals = parse(message["data"])
            self.received += len(refusals)
            self._refuse(refusals)


def parse(data: bytes | str) -> list[Refusal]:
    """A message's refusals; one that is not ours is dropped with a warning."""
    try:
        return [Refusal(key_hash, float(moment)) for key_hash, moment in json.loads(data)]
    except (ValueError, TypeError) as error:
        log.warning("key revocations: dropped a message that is not a list of [hash, time] pairs (%s)", error)
        return []


def listener() -> Subscriber | None:
    """The job listening for refusals (not started); none without Redis,
    where a revocation reaches the processes through the database alone."""
    return Subscriber(settings.REDIS_URL) if settings.REDIS_URL else None
