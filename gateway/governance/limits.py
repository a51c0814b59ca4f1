"""Rate and concurrency limits (F8): a key's requests per minute and open
requests, and a channel's open requests.

A request may wait up to HOPBASE_CAPACITY_WAIT seconds for capacity before
it is refused (key limits: 429 in the caller's format with ``retry-after``)
or, for channels, before the next channel is tried.

With REDIS_URL the counts are shared by every gateway process (a key's
limit is the limit across the fleet); without it they are this process's.
In Redis, requests per minute are counted in fixed one-minute windows, and
each open request holds a *lease* of its own: a member of a sorted set per
key or channel, scored with the moment it lapses. The holder renews its
leases while it holds them, so a crashed process's lapse within
LEASE_SECONDS; a release removes the holder's own lease, so a count never
goes below zero and never drifts. Limits cost nothing for keys and channels
that have none.

A Redis outage (D3) costs a request at most one short timeout: calls use
short socket timeouts and no retries, and after a failure Redis is left
alone for a few seconds (``core.dependencies.redis``, one warning per
outage). Meanwhile limits fail open: a request is let through uncounted,
and a channel slot let through so is known to be held here alone, so its
release never touches Redis. A release Redis could not take is retried
when it answers again (or its lease lapses).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from django.conf import settings
from redis.exceptions import RedisError

from core import lifecycle, loggers
from core.dependencies import LoopRedis, StoreDown
from core.errors import ErrorKind, GatewayError

log = logging.getLogger(loggers.LIMITS)

POLL_SECONDS = 0.05
WINDOW_SECONDS = 60
LEASE_SECONDS = 300
RENEW_SECONDS = 60
SLOTS_PREFIX = "hopbase:slots:"
# Releases waiting for Redis to answer again; past this the oldest are left
# to lapse (dropped from the queue, never the newest).
MAX_PENDING_RELEASES = 10_000
# While releases wait, how often Redis is asked again (the breaker decides
# whether a call is even tried), and how long a drain waits for them.
RELEASE_RETRY_SECONDS = 1.0
# The longest a drain waits for Redis to take the slots given back while it was away.
FLUSH_TIMEOUT = 2.0


STORE_ERRORS = (OSError, RedisError, StoreDown)


class LocalCounters:
    """This process's counts."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._starts: dict[str, deque[float]] = {}

    async def take_slot(self, name: str, limit: int) -> bool:
        if self._open.get(name, 0) >= limit:
            return False
        self._open[name] = self._open.get(name, 0) + 1
        return True

    def give_back_slot(self, name: str) -> None:
        self._open[name] = max(0, self._open.get(name, 0) - 1)

    def let_through(self, name: str) -> None:
        """Never called: local counts cannot fail."""

    async def take_start(self, name: str, per_minute: int) -> float:
        """0 when a request may start now, else seconds until one may."""
        now = time.monotonic()
        starts = self._starts.setdefault(name, deque())
        while starts and starts[0] <= now - WINDOW_SECONDS:
            starts.popleft()
        if len(starts) >= per_minute:
            return starts[0] + WINDOW_SECONDS - now
        starts.append(now)
        return 0.0


# Count one more request this minute, or refuse, in one step.
TAKE_START = """
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if count > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  return 0
end
return 1
"""
# Lapsed leases go, then a lease for ARGV[3] if fewer than ARGV[1] are held;
# times are Redis's own, so the gateways' clocks do not matter.
TAKE_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# Push back the lapse of the leases ARGV[2..] that still hold; the ones that
# lapsed already are returned (they are not revived: their place may be taken).
RENEW_SLOTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lapsed = {}
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(lapsed, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return lapsed
"""


@dataclass
class Held:
    """The slots of one key or channel this process holds."""

    leases: list[str] = field(default_factory=list)  # in Redis
    let_through: int = 0  # while Redis was unreachable: in no count


class RedisCounters:
    """Counts shared through Redis by every gateway process."""

    def __init__(self, url: str) -> None:
        self._clients = LoopRedis(url)
        self._pending: set[asyncio.Task] = set()
        self._held: dict[str, Held] = {}
        self._releases: deque[tuple[str, str]] = deque()  # oldest first, bounded by _let_oldest_lapse
        self._renewers: dict[int, asyncio.Task] = {}
        self._flushing = False
        self._retry_now: asyncio.Event | None = None

    def _redis(self):
        return self._clients.client()

    async def _call(self, command):
        """One Redis call, through the breaker."""
        result = await self._clients.call(command)
        if self._releases:
            self._detach(self._flush_releases())
        return result

    def _detach(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def take_slot(self, name: str, limit: int) -> bool:
        lease = uuid.uuid4().hex
        command = self._redis().eval(TAKE_SLOT, 1, SLOTS_PREFIX + name, limit, int(LEASE_SECONDS * 1000), lease)
        taking = asyncio.ensure_future(self._call(command))
        try:
            taken = bool(await asyncio.shield(taking))
        except asyncio.CancelledError:
            # The caller is gone; if the lease was taken anyway, give it back.
            taking.add_done_callback(lambda done: self._give_back_if_taken(done, name, lease))
            raise
        except StoreDown:
            raise  # never sent: nothing taken
        except STORE_ERRORS:
            # Sent, but no answer came back in time: Redis may hold the lease.
            # Removing a lease that is not there is harmless, so remove it.
            self._release(name, lease)
            raise
        if taken:
            self._held.setdefault(name, Held()).leases.append(lease)
            self._keep_renewing()
        return taken

    def _give_back_if_taken(self, done: asyncio.Future, name: str, lease: str) -> None:
        if not done.cancelled() and (done.exception() is not None or done.result()):  # taken, or maybe taken
            self._release(name, lease)

    def let_through(self, name: str) -> None:
        """A slot let through uncounted while Redis was unreachable."""
        self._held.setdefault(name, Held()).let_through += 1

    def give_back_slot(self, name: str) -> None:
        """Called from a request's last moments, maybe while it is cancelled:
        a lease is removed by a task of its own. Slots let through are given
        back first (any of this process's slots of ``name`` will do), so
        Redis never counts more of them than are open here."""
        held = self._held.get(name)
        if held is None:
            return  # nothing taken, nothing to give back
        if held.let_through:
            held.let_through -= 1
        elif held.leases:
            self._release(name, held.leases.pop())
        if not held.let_through and not held.leases:
            del self._held[name]

    def _release(self, name: str, lease: str) -> None:
        self._releases.append((name, lease))
        self._let_oldest_lapse()
        try:
            self._detach(self._flush_releases())
        except RuntimeError:
            pass  # no event loop here: the next Redis call flushes it

    def _let_oldest_lapse(self) -> None:
        """Not a bounded deque's maxlen: extendleft would drop the newest."""
        while len(self._releases) > MAX_PENDING_RELEASES:
            self._releases.popleft()  # its lease lapses within LEASE_SECONDS

    async def _flush_releases(self) -> None:
        """Remove the leases given back, retrying every RELEASE_RETRY_SECONDS
        while Redis is away, until none wait (or they lapse)."""
        if self._flushing or not self._releases:
            return
        self._flushing = True
        try:
            while self._releases:
                batch = [self._releases.popleft() for _ in range(min(len(self._releases), 500))]
                try:
                    pipe = self._redis().pipeline(transaction=False)
                    for name, lease in batch:
                        pipe.zrem(SLOTS_PREFIX + name, lease)
                    await self._call(pipe.execute())
                except STORE_ERRORS:
                    self._releases.extendleft(reversed(batch))  # older than those given back since
                    self._let_oldest_lapse()
                    self._retry_now = asyncio.Event()
                    try:
                        await asyncio.wait_for(self._retry_now.wait(), RELEASE_RETRY_SECONDS)
                    except TimeoutError:
                        pass
        finally:
            self._flushing = False

    async def flush(self) -> None:
        """Give back every lease still waiting to be (a drain, before exit):
        a flush waiting to retry tries again at once."""
        if self._retry_now is not None:
            self._retry_now.set()
        await self._flush_releases()
        while self._flushing:
            await asyncio.sleep(0.01)

    def _keep_renewing(self) -> None:
        loop = asyncio.get_running_loop()
        renewer = self._renewers.get(id(loop))
        if renewer is None or renewer.done():
            self._renewers[id(loop)] = loop.create_task(self._renew_while_held())

    async def _renew_while_held(self) -> None:
        while self._held or self._releases:
            await asyncio.sleep(RENEW_SECONDS)
            try:
                await self._renew()
            except STORE_ERRORS:
                pass  # the leases lapse if Redis stays away; nothing is counted twice
            await self._flush_releases()

    async def _renew(self) -> None:
        names = [name for name, held in self._held.items() if held.leases]
        if not names:
            return
        pipe = self._redis().pipeline(transaction=False)
        for name in names:
            pipe.eval(RENEW_SLOTS, 1, SLOTS_PREFIX + name, int(LEASE_SECONDS * 1000), *self._held[name].leases)
        results = await self._call(pipe.execute())
        for name, lapsed in zip(names, results, strict=True):
            held = self._held.get(name)
            for lease in lapsed or ():
                lease = lease.decode() if isinstance(lease, bytes) else lease
                if held is not None and lease in held.leases:
                    # No longer counted in Redis: given back like a slot let through.
                    held.leases.remove(lease)
                    held.let_through += 1

    async def take_start(self, name: str, per_minute: int) -> float:
        now = time.time()
        window = int(now // WINDOW_SECONDS)
        key = f"hopbase:rpm:{name}:{window}"
        if await self._call(self._redis().eval(TAKE_START, 1, key, per_minute, WINDOW_SECONDS * 2)):
            return 0.0
        return (window + 1) * WINDOW_SECONDS - now

    def open_slots(self, name: str) -> int:
        """Slots of ``name`` this process holds (tests)."""
        return 0 if (held := self._held.get(name)) is None else held.let_through + len(held.leases)


class Limits:
    def __init__(self, counters: LocalCounters | RedisCounters | None = None) -> None:
        # Chosen at first use unless given: settings may not be ready at import.
        self._counters = counters

    @property
    def counters(self) -> LocalCounters | RedisCounters:
        if self._counters is None:
            self._counters = RedisCounters(settings.REDIS_URL) if settings.REDIS_URL else LocalCounters()
        return self._counters

    async def admit_key(self, key_id: int, rpm: int | None, concurrency: int | None) -> bool:
        """Wait for the key's capacity, or raise RATE_LIMIT. True when a slot
        was taken, which the caller gives back with ``release_key``.

        If the shared store cannot be reached the request is let through,
        holding nothing: an outage of the limits store must not stop the
        gateway."""
        if rpm is None and concurrency is None:
            return False
        try:
            return await self._admit_key(key_id, rpm, concurrency)
        except STORE_ERRORS as error:
            log.debug("limits store unavailable, key %s let through: %s", key_id, error)
            return False

    async def _admit_key(self, key_id: int, rpm: int | None, concurrency: int | None) -> bool:
        deadline = time.monotonic() + settings.HOPBASE_CAPACITY_WAIT
        name = f"key:{key_id}"
        if rpm is not None:
            while (wait := await self.counters.take_start(name, rpm)) > 0:
                if time.monotonic() + wait > deadline:
                    raise GatewayError(ErrorKind.RATE_LIMIT, retry_after=max(1, round(wait)))
                await asyncio.sleep(wait)
        if concurrency is None:
            return False
        while not await self.counters.take_slot(name, concurrency):
            if time.monotonic() + POLL_SECONDS > deadline:
                raise GatewayError(ErrorKind.RATE_LIMIT, "Too many requests in flight for this API key.", retry_after=1)
            await asyncio.sleep(POLL_SECONDS)
        return True

    async def flush(self, timeout: float) -> None:
        """Before the process exits: the releases Redis has not taken yet,
        waited for at most ``timeout`` seconds (the rest lapse)."""
        counters = self.counters
        if isinstance(counters, RedisCounters):
            try:
                await asyncio.wait_for(counters.flush(), timeout)
            except TimeoutError:
                log.warning("limits: some slots given back could not reach Redis; they lapse in %d s", LEASE_SECONDS)

    def release_key(self, key_id: int) -> None:
        self.counters.give_back_slot(f"key:{key_id}")

    async def take_channel(self, channel_id: int, max_concurrency: int | None) -> bool:
        """A slot under the channel's limit; True (and counted as held here
        alone) when the shared store cannot be reached."""
        if max_concurrency is None:
            return True
        name = f"channel:{channel_id}"
        try:
            return await self.counters.take_slot(name, max_concurrency)
        except STORE_ERRORS as error:
            log.debug("limits store unavailable, channel %s not limited: %s", channel_id, error)
            self.counters.let_through(name)
            return True

    def release_channel(self, channel_id: int, max_concurrency: int | None) -> None:
        if max_concurrency is not None:
            self.counters.give_back_slot(f"channel:{channel_id}")


limits = Limits()


async def slots_given_back() -> None:
    """Slots given back while Redis was away: removed at the end of a drain
    if it answers, rather than left counted until they lapse."""
    await limits.flush(FLUSH_TIMEOUT)


lifecycle.flush_when_drained(slots_given_back)
