"""Tokens per minute (G5): a key's input plus output tokens in a sliding
minute, shared by every gateway process, with the capacity wait of F8.

Admission counts a request's estimate (its input and its output cap) before
it runs; when it ends, the estimate is replaced with the tokens it really
used. A request that does not fit waits for room up to HOPBASE_CAPACITY_WAIT,
then is refused (429 with ``retry-after``); one larger than the whole limit
can never fit and is refused at once.

The minute is sixty one-second buckets: tokens counted at second ``s`` count
until second ``s + 60`` begins (59 to 60 seconds, never less). In Redis each
key has one hash, second -> tokens, read and written by one Lua script per
admission that takes the time from Redis's own clock (the gateways' clocks
do not matter), deletes the buckets that left the minute, and either counts
the request in the current second or says how long until enough has left for
it. A hash rather than a sorted set of requests: its size is bounded by the
sixty seconds, not by the key's traffic, so the script's work is too; and a
correction is one HINCRBY on the bucket the request was counted in (which
this process remembers per request; a bucket that already left the minute is
not touched, so a late correction changes nothing).

Room is freed by the minute sliding, which a waiter knows the time of, and by
corrections (estimates hold the whole output cap, so requests ending free the
most). A correction made by this process wakes the key's waiters once it is
applied; one made by another process is seen at the next look, every
RECHECK_SECONDS while waiting.

Without REDIS_URL the counts are this process's, with the same semantics.
During a Redis outage (``core.dependencies.redis``) requests are let through
uncounted, as ``gateway.governance.limits`` does, and corrections wait for Redis to answer
again (or for their bucket to leave the minute). A count whose answer was lost
(the script ran, the reply timed out) cannot be corrected, since its bucket is
unknown: it overcounts for the rest of its minute, never undercounts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import NamedTuple

from django.conf import settings

from core import loggers
from core.dependencies import LoopRedis
from core.errors import RETRY_AFTER_CAP, ErrorKind, GatewayError
from gateway.governance.limits import STORE_ERRORS

log = logging.getLogger(loggers.TOKEN_LIMITS)

WINDOW_SECONDS = 60
PREFIX = "hopbase:tpm:"
# While waiting on the shared store, how often it is looked at again for room
# freed by other processes' corrections (this process's own wake waiters).
RECHECK_SECONDS = 0.2
# Corrections waiting for Redis to answer again; past this the oldest are
# dropped (an estimate left counted for at most a minute).
MAX_PENDING_CORRECTIONS = 10_000
CORRECTIONS_PER_CALL = 500
# While Redis is away, how long waiting corrections wait before another try,
# unless another call finds Redis answering first.
CORRECTION_RETRY_SECONDS = 1.0


class Take(NamedTuple):
    bucket: int | None  # the second the tokens were counted in; None: no room
    wait: float  # when refused: seconds until enough has left the minute


class Wakeups:
    """Waiters by name, woken by what this process does (a correction
    applied, Redis answering)."""

    def __init__(self) -> None:
        self._waiters: dict[Hashable, set[asyncio.Future]] = {}

    async def wait(self, name: Hashable, timeout: float) -> None:
        """Until ``wake(name)`` or ``timeout`` seconds, whichever is first."""
        waiter = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(name, set())
        waiters.add(waiter)
        try:
            await asyncio.wait([waiter], timeout=timeout)
        finally:
            waiters.discard(waiter)
            if not waiters and self._waiters.get(name) is waiters:
                del self._waiters[name]

    def wake(self, name: Hashable) -> None:
        for waiter in self._waiters.pop(name, ()):
            # Thread-safe: the waiter may belong to another thread's loop.
            waiter.get_loop().call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class LocalTokens:
    """This process's counts; the clock is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[int, dict[int, int]] = {}  # key -> second -> tokens
        self.wakeups = Wakeups()

    async def take(self, key_id: int, limit: int, tokens: int) -> Take:
        now = self._clock()
        second = math.floor(now)
        buckets = self._buckets.setdefault(key_id, {})
        for old in [s for s in buckets if s <= second - WINDOW_SECONDS]:
            del buckets[old]
        used = sum(buckets.values())
        if used + tokens <= limit:
            buckets[second] = buckets.get(second, 0) + tokens
            return Take(second, 0.0)
        over = used + tokens - limit
        for counted_at in sorted(buckets):
            over -= buckets[counted_at]
            if over <= 0:
                return Take(None, counted_at + WINDOW_SECONDS - now)
        return Take(None, float(WINDOW_SECONDS))  # larger than the limit: admission refuses those first

    def correct(self, key_id: int, bucket: int, delta: int) -> None:
        buckets = self._buckets.get(key_id)
        if buckets is None or bucket not in buckets or bucket <= math.floor(self._clock()) - WINDOW_SECONDS:
            return  # left the minute: nothing to correct
        buckets[bucket] += delta
        if buckets[bucket] <= 0:
            del buckets[bucket]
        if delta < 0:
            self.wakeups.wake(key_id)


# Count ARGV[2] tokens under the limit ARGV[1] in a minute of ARGV[3]
# seconds: {1, second counted in}, or {0, milliseconds until they would fit}.
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1])
local window = tonumber(ARGV[3])
local used = 0
local live = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local second = tonumber(flat[i])
  if second <= now - window then
    redis.call('HDEL', KEYS[1], flat[i])
  else
    used = used + tonumber(flat[i + 1])
    table.insert(live, {second, tonumber(flat[i + 1])})
  end
end
local over = used + tonumber(ARGV[2]) - tonumber(ARGV[1])
if over <= 0 then
  redis.call('HINCRBY', KEYS[1], t[1], ARGV[2])
  redis.call('EXPIRE', KEYS[1], window)
  return {1, now}
end
table.sort(live, function(a, b) return a[1] < b[1] end)
local ms = math.floor(tonumber(t[2]) / 1000)
for _, bucket in ipairs(live) do
  over = over - bucket[2]
  if over <= 0 then
    return {0, (bucket[1] + window - now) * 1000 - ms}
  end
end
return {0, window * 1000}
"""
# Add ARGV[2] to the bucket ARGV[1] if it is still in the minute of ARGV[3] seconds.
CORRECT = """
local now = tonumber(redis.call('TIME')[1])
if tonumber(ARGV[1]) <= now - tonumber(ARGV[3]) or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2]) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""


@dataclass(frozen=True)
class Correction:
    key_id: int
    bucket: int
    delta: int
    at: float  # monotonic, when made: a minute later it can change nothing


class RedisTokens:
    """Counts shared through Redis by every gateway process."""

    def __init__(self, url: str) -> None:
        self._clients = LoopRedis(url)
        self.wakeups = Wakeups()
        self._answered = Wakeups()  # one name, None: a call found Redis answering
        self._corrections: deque[Correction] = deque(maxlen=MAX_PENDING_CORRECTIONS)
        self._flusher: asyncio.Task | None = None

    @property
    def _flushing(self) -> bool:
        # A task is done the moment its coroutine returns: a correction made
        # after the flush's last look at the queue starts the next one.
        return self._flusher is not None and not self._flusher.done()

    async def _call(self, command):
        """One Redis call, through the breaker (``LoopRedis.call``)."""
        result = await self._clients.call(command)
        if self._corrections:
            if self._flushing:
                self._answered.wake(None)  # a flush waiting to retry: now
            else:
                self._start_flush()
        return result

    async def take(self, key_id: int, limit: int, tokens: int) -> Take:
        command = self._clients.client().eval(TAKE, 1, f"{PREFIX}{key_id}", limit, tokens, WINDOW_SECONDS)
        taking = asyncio.ensure_future(self._call(command))
        try:
            counted, value = await asyncio.shield(taking)
        except asyncio.CancelledError:
            # The caller is gone; if the tokens were counted anyway, take them back.
            taking.add_done_callback(lambda done: self._give_back_if_counted(done, key_id, tokens))
            raise
        return Take(int(value), 0.0) if counted else Take(None, int(value) / 1000)

    def _give_back_if_counted(self, done: asyncio.Future, key_id: int, tokens: int) -> None:
        if not done.cancelled() and done.exception() is None and done.result()[0]:
            self.correct(key_id, int(done.result()[1]), -tokens)

    def correct(self, key_id: int, bucket: int, delta: int) -> None:
        """Never blocks: the correction goes to Redis from a task of its own."""
        self._corrections.append(Correction(key_id, bucket, delta, time.monotonic()))
        if not self._flushing:
            self._start_flush()

    def _start_flush(self) -> None:
        try:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        except RuntimeError:
            pass  # no event loop here: the next call that reaches Redis starts it

    async def _flush(self) -> None:
        """Apply the waiting corrections, retrying while Redis is away until
        none wait or they can change nothing (a minute old)."""
        while self._corrections:
            batch = [self._corrections.popleft() for _ in range(min(len(self._corrections), CORRECTIONS_PER_CALL))]
            pipe = self._clients.client().pipeline(transaction=False)
            for c in batch:
                pipe.eval(CORRECT, 1, f"{PREFIX}{c.key_id}", c.bucket, c.delta, WINDOW_SECONDS)
            try:
                await self._call(pipe.execute())
            except STORE_ERRORS:
                now = time.monotonic()
                self._corrections.extendleft(reversed([c for c in batch if now - c.at < WINDOW_SECONDS]))
                await self._answered.wait(None, CORRECTION_RETRY_SECONDS)
                continue
            for key_id in {c.key_id for c in batch if c.delta < 0}:
                self.wakeups.wake(key_id)


@dataclass(frozen=True)
class Counted:
    bucket: int
    tokens: int
    at: float  # monotonic, once counted: a minute later the bucket has left


class TokenLimits:
    def __init__(self, store: LocalTokens | RedisTokens | None = None) -> None:
        # Chosen at first use unless given: settings may not be ready at import.
        self._store = store
        # What each admitted request was counted as, by (key, request id), in
        # the order admitted: entries a minute old can change nothing and go.
        self._counted: dict[tuple[int, str], Counted] = {}

    @property
    def store(self) -> LocalTokens | RedisTokens:
        if self._store is None:
            self._store = RedisTokens(settings.REDIS_URL) if settings.REDIS_URL else LocalTokens()
        return self._store

    async def admit(self, key_id: int, tpm: int, tokens: int, request_id: str) -> None:
        """Count ``tokens`` (the request's estimated input plus its output
        cap) against the key's tokens per minute, waiting for room up to
        HOPBASE_CAPACITY_WAIT, else raise RATE_LIMIT with ``retry_after``.
        A request larger than the whole limit is refused at once. If the
        shared store cannot be reached the request is let through uncounted."""
        if tokens > tpm:
            raise GatewayError(
                ErrorKind.RATE_LIMIT,
                f"This request counts {tokens} tokens (its input and maximum output), more than this API key's"
                f" whole limit of {tpm} tokens per minute: it can never fit. Lower the maximum output or shorten"
                " the input.",
                retry_after=RETRY_AFTER_CAP,
            )
        try:
            await self._admit(key_id, tpm, tokens, request_id)
        except STORE_ERRORS as error:
            log.debug("token limits store unavailable, key %s let through: %s", key_id, error)

    async def _admit(self, key_id: int, tpm: int, tokens: int, request_id: str) -> None:
        store = self.store
        # Room freed by another process shows only when looked for.
        recheck = RECHECK_SECONDS if isinstance(store, RedisTokens) else math.inf
        deadline = time.monotonic() + settings.HOPBASE_CAPACITY_WAIT
        while (take := await store.take(key_id, tpm, tokens)).bucket is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GatewayError(
                    ErrorKind.RATE_LIMIT,
                    f"Rate limit reached for this API key: {tpm} tokens per minute (input plus output), and this"
                    f" request counts {tokens} (its input and maximum output). Please retry shortly.",
                    retry_after=min(RETRY_AFTER_CAP, max(1, math.ceil(take.wait))),
                )
            await store.wakeups.wait(key_id, min(take.wait, left, recheck))
        now = time.monotonic()
        while self._counted:
            oldest = next(iter(self._counted))
            if self._counted[oldest].at > now - WINDOW_SECONDS:
                break
            del self._counted[oldest]
        self._counted[(key_id, request_id)] = Counted(take.bucket, tokens, now)

    def correct(self, key_id: int, request_id: str, actual_tokens: int) -> None:
        """When the request ends, however it ends: its estimate becomes the
        tokens it really used (0 when it failed). Never blocks or raises; a
        request never counted (let through, refused) changes nothing."""
        counted = self._counted.pop((key_id, request_id), None)
        if counted is None or time.monotonic() - counted.at >= WINDOW_SECONDS:
            return
        delta = max(0, actual_tokens) - counted.tokens
        if delta:
            self.store.correct(key_id, counted.bucket, delta)


token_limits = TokenLimits()
