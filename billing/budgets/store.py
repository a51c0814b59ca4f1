"""Budgets' running spend and open reservations (rule G2), shared by every
gateway process through Redis, or kept in the process without it.

Per budget and window, a Redis hash ``hopbase:budget:{id}:{window}``:

    spent          charges of the window's finished requests, in units of
                   10^-10 USD (the ledger's precision); seeded from the
                   database's settled charges the first time the window is used
    reserved       the sum of the open reservations
    r:<request>    one open reservation
    alerted:<type> set once the window raised that alert (G4)

and a sorted set ``…:leases`` (request id -> when its reservation lapses).
A reservation lapses unless its process renews it, so a killed process's
reservations free their budgets within the lease. Every script runs on
Redis's own clock, and ``reserve`` checks and reserves across all of a
request's budgets in one step: concurrent requests on every process
together never reserve past a limit.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from django.conf import settings

from billing.budgets.windows import Window
from core import loggers
from core.dependencies import REDIS_TIMEOUT, LoopRedis, sync_redis

UNIT = Decimal("1E-10")
PREFIX = "hopbase:budget:"
# How long a finished window's numbers stay in Redis (its alerts' flags with them).
KEEP_AFTER_END = 86_400


def to_units(amount: Decimal) -> int:
    """USD as whole units, rounded up (a reservation never falls short)."""
    return int((amount / UNIT).to_integral_value(ROUND_CEILING))


def from_units(units: int) -> Decimal:
    return (Decimal(units) * UNIT).quantize(UNIT)


@dataclass(frozen=True)
class Line:
    """One budget's part in a request: its window, limit and alert threshold, in units."""

    budget_id: int
    window: Window
    limit: int
    threshold: int | None = None

    @property
    def book(self) -> str:
        return f"{PREFIX}{self.budget_id}:{self.window.key()}"

    @property
    def leases(self) -> str:
        return self.book + ":leases"

    @property
    def settled(self) -> str:
        """The requests settled lately, so a settlement sent again adds nothing."""
        return self.book + ":settled"

    def ttl(self, now: float) -> int:
        """Seconds the window's keys live; 0: for ever (``total``)."""
        return 0 if self.window.end is None else max(1, int(self.window.end.timestamp() - now)) + KEEP_AFTER_END


@dataclass(frozen=True)
class Admission:
    """A reservation's outcome: taken, or the index of the first line with
    no room (``first_refusal``: no request of the window was refused for it
    before), or of a line whose window must first be seeded."""

    refused: int | None = None
    needs_seed: int | None = None
    first_refusal: bool = False


@dataclass(frozen=True)
class Settled:
    """A line's spend once a request's charge is in, and the alerts it is
    the first to call for."""

    line: Line
    spent: int
    threshold_crossed: bool = False
    exhausted: bool = False


# KEYS: per line its book and its leases. ARGV: request, amount, lease ms,
# then per line: limit, ttl s (0: none), seed (-1: none known).
# Returns {0} when reserved, {i, first} when line i has no room, {-i} when
# line i's window has no spend yet and needs a seed.
RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid, amount, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n = #KEYS / 2
for i = 1, n do
  local book, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local limit, seed = tonumber(ARGV[4 + 3 * (i - 1)]), tonumber(ARGV[6 + 3 * (i - 1)])
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
    local held = redis.call('HGET', book, 'r:' .. gone)
    if held then
      redis.call('HINCRBY', book, 'reserved', -tonumber(held))
      redis.call('HDEL', book, 'r:' .. gone)
    end
    redis.call('ZREM', leases, gone)
  end
  local spent = redis.call('HGET', book, 'spent')
  if not spent then
    if seed < 0 then return {-i} end
    redis.call('HSET', book, 'spent', seed)
    spent = seed
  end
  local reserved = tonumber(redis.call('HGET', book, 'reserved') or '0')
  if tonumber(spent) + reserved + amount > limit then
    return {i, redis.call('HSETNX', book, 'alerted:budget.exhausted', 1)}
  end
end
for i = 1, n do
  local book, leases = KEYS[2 * i - 1], KEYS[2 * i]
  local ttl = tonumber(ARGV[5 + 3 * (i - 1)])
  redis.call('HINCRBY', book, 'reserved', amount)
  redis.call('HSET', book, 'r:' .. rid, amount)
  redis.call('ZADD', leases, now + lease, rid)
  if ttl > 0 then
    redis.call('EXPIRE', book, ttl)
    redis.call('EXPIRE', leases, ttl)
  end
end
return {0}
"""
# KEYS: per line its book, its leases and its settled requests. ARGV:
# request, charge, how long a settlement is remembered (ms), then per line:
# limit, threshold (-1: none). The reservation goes and the charge is added
# to spend, once: a request settled already (its answer lost on the way
# back, and sent again) adds nothing. Per line {spent, threshold first
# crossed, first exhausted}.
SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid, charge, remember = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 1, #KEYS / 3 do
  local book, leases, settled = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local limit, threshold = tonumber(ARGV[4 + 2 * (i - 1)]), tonumber(ARGV[5 + 2 * (i - 1)])
  local held = redis.call('HGET', book, 'r:' .. rid)
  if held then
    redis.call('HINCRBY', book, 'reserved', -tonumber(held))
    redis.call('HDEL', book, 'r:' .. rid)
  end
  redis.call('ZREM', leases, rid)
  local again = redis.call('ZADD', settled, 'NX', now, rid) == 0
  redis.call('ZREMRANGEBYSCORE', settled, '-inf', now - remember)
  redis.call('PEXPIRE', settled, remember)
  local spent = 0
  if redis.call('HEXISTS', book, 'spent') == 1 then
    if again then
      spent = tonumber(redis.call('HGET', book, 'spent'))
    else
      spent = redis.call('HINCRBY', book, 'spent', charge)
    end
  end
  local crossed, exhausted = 0, 0
  if threshold >= 0 and spent >= threshold then
    crossed = redis.call('HSETNX', book, 'alerted:budget.threshold', 1)
  end
  if spent >= limit then
    exhausted = redis.call('HSETNX', book, 'alerted:budget.exhausted', 1)
  end
  table.insert(out, {spent, crossed, exhausted})
end
return out
"""
# KEYS: leases sets. ARGV: lease ms, then the requests whose reservations go on.
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, leases in ipairs(KEYS) do
  for i = 2, #ARGV do
    redis.call('ZADD', leases, 'XX', now + tonumber(ARGV[1]), ARGV[i])
  end
end
return 1
"""
# KEYS: a book and its leases. The open reservations that have not lapsed.
READ_RESERVED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = 0
for _, rid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf')) do
  total = total + tonumber(redis.call('HGET', KEYS[1], 'r:' .. rid) or '0')
end
return total
"""


def lease_ms() -> int:
    return int(settings.HOPBASE_RESERVATION_LEASE * 1000)


# How long a settled request is remembered, so that one sent again (its
# answer lost) is not counted twice: longer than the settler's retries.
SETTLED_MEMORY_MS = 3_600_000
log = logging.getLogger(loggers.BUDGETS)
# A budget fails closed (no answer, no admission): its calls get longer than
# the limits' fail-open 0.1 s before a busy Redis is taken for a dead one.
STORE_TIMEOUT = 1.0


class RedisBudgetStore:
    def __init__(self, url: str) -> None:
        self._clients = LoopRedis(url, STORE_TIMEOUT)

    async def reserve(self, lines: list[Line], request_id: str, amount: int, seeds: dict[int, int]) -> Admission:
        keys = [name for line in lines for name in (line.book, line.leases)]
        now = time.time()
        args: list[object] = [request_id, amount, lease_ms()]
        for line in lines:
            args += [line.limit, line.ttl(now), seeds.get(line.budget_id, -1)]
        found = await self._clients.client().eval(RESERVE, len(keys), *keys, *args)
        code = int(found[0])
        if code > 0:
            return Admission(refused=code - 1, first_refusal=bool(int(found[1])))
        if code < 0:
            return Admission(needs_seed=-code - 1)
        return Admission()

    async def settle(self, lines: list[Line], request_id: str, charge: int) -> list[Settled]:
        return (await self.settle_many([(lines, request_id, charge)]))[0]

    async def settle_many(self, charges: list[tuple[list[Line], str, int]]) -> list[list[Settled]]:
        """Several requests' charges, in one round trip (a pipeline, not a
        transaction: each script is atomic on its own)."""
        pipe = self._clients.client().pipeline(transaction=False)
        for lines, request_id, charge in charges:
            keys = [name for line in lines for name in (line.book, line.leases, line.settled)]
            args: list[object] = [request_id, charge, SETTLED_MEMORY_MS]
            for line in lines:
                args += [line.limit, -1 if line.threshold is None else line.threshold]
            pipe.eval(SETTLE, len(keys), *keys, *args)
        # A connection lost or a reply late raises, and the batch is sent
        # again (each request adds its charge once); one script's own error
        # (a key of the wrong type, say) is that charge's alone.
        answers = await pipe.execute(raise_on_error=False)
        settled = []
        for (lines, request_id, _), found in zip(charges, answers, strict=True):
            if isinstance(found, Exception):
                log.error("budgets: the charge of %s could not be settled: %s", request_id, found)
                settled.append([])
                continue
            settled.append([Settled(line, int(spent), bool(int(crossed)), bool(int(exhausted)))
                            for line, (spent, crossed, exhausted) in zip(lines, found, strict=True)])
        return settled

    async def renew(self, lines: list[Line], request_ids: list[str]) -> None:
        if lines and request_ids:
            keys = sorted({line.leases for line in lines})
            await self._clients.client().eval(RENEW, len(keys), *keys, lease_ms(), *request_ids)

    def drop_idle_connections(self) -> None:
        self._clients.drop_idle_connections()


@dataclass
class Book:
    """One budget window in the process (``LocalBudgetStore``)."""

    spent: int | None = None
    reserved: dict[str, tuple[int, float]] = field(default_factory=dict)  # request -> amount, lapses at
    alerted: set[str] = field(default_factory=set)

    def lapse(self, now: float) -> None:
        for request_id in [r for r, (_, until) in self.reserved.items() if until <= now]:
            del self.reserved[request_id]

    def flag(self, alert: str) -> bool:
        first = alert not in self.alerted
        self.alerted.add(alert)
        return first


class LocalBudgetStore:
    """The same, for one process (no REDIS_URL): nothing to share."""

    def __init__(self, clock=time.monotonic) -> None:
        self._books: dict[str, Book] = {}
        self._clock = clock

    def _book(self, line: Line) -> Book:
        return self._books.setdefault(line.book, Book())

    async def reserve(self, lines: list[Line], request_id: str, amount: int, seeds: dict[int, int]) -> Admission:
        now = self._clock()
        for index, line in enumerate(lines):
            book = self._book(line)
            book.lapse(now)
            if book.spent is None:
                if line.budget_id not in seeds:
                    return Admission(needs_seed=index)
                book.spent = seeds[line.budget_id]
            if book.spent + sum(a for a, _ in book.reserved.values()) + amount > line.limit:
                return Admission(refused=index, first_refusal=book.flag("budget.exhausted"))
        until = now + settings.HOPBASE_RESERVATION_LEASE
        for line in lines:
            self._book(line).reserved[request_id] = (amount, until)
        return Admission()

    async def settle(self, lines: list[Line], request_id: str, charge: int) -> list[Settled]:
        found = []
        for line in lines:
            book = self._book(line)
            book.reserved.pop(request_id, None)
            if book.spent is not None:
                book.spent += charge
            spent = book.spent or 0
            crossed = line.threshold is not None and spent >= line.threshold and book.flag("budget.threshold")
            exhausted = spent >= line.limit and book.flag("budget.exhausted")
            found.append(Settled(line, spent, crossed, exhausted))
        return found

    async def settle_many(self, charges: list[tuple[list[Line], str, int]]) -> list[list[Settled]]:
        return [await self.settle(lines, request_id, charge) for lines, request_id, charge in charges]

    async def renew(self, lines: list[Line], request_ids: list[str]) -> None:
        until = self._clock() + settings.HOPBASE_RESERVATION_LEASE
        for line in lines:
            book = self._book(line)
            for request_id in request_ids:
                if request_id in book.reserved:
                    book.reserved[request_id] = (book.reserved[request_id][0], until)

    def reserved(self, line: Line) -> int:
        book = self._book(line)
        book.lapse(self._clock())
        return sum(amount for amount, _ in book.reserved.values())

    def drop_idle_connections(self) -> None:
        """Nothing to drop: no connections."""


def reserved_usd(budget_id: int, window: Window) -> Decimal:
    """What the gateway processes hold reserved against a budget's window now
    (for the admin, ``budgets`` and ``/v1/usage``); without Redis each process
    keeps its own, out of sight: 0."""
    if not settings.REDIS_URL:
        return Decimal(0)
    line = Line(budget_id, window, 0)
    return from_units(int(_reader(settings.REDIS_URL).eval(READ_RESERVED, 2, line.book, line.leases)))


@functools.cache
def _reader(url: str) -> Any:
    """One blocking client per Redis URL, its pool shared by the threads
    that read standings (a page lists many budgets: one connection, not one each)."""
    return sync_redis(url, REDIS_TIMEOUT * 10)
