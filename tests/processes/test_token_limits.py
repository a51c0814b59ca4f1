"""Tokens per minute (G5): a sliding minute of input plus output tokens per
key, shared by every gateway process; a short wait for room (F8), then a 429
with retry-after; estimates corrected when requests end."""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import redis
from django.conf import settings as django_settings

from bench.tcp_proxy import TcpProxy
from core import dependencies
from core.errors import ErrorKind, GatewayError
from gateway.governance import token_limits as token_limits_module
from gateway.governance.token_limits import PREFIX, LocalTokens, RedisTokens, Take, TokenLimits
from tests.support.processes import ROOT


@pytest.fixture(autouse=True)
def redis_up():
    """Every test starts with Redis taken to be up (the breaker is the process's)."""
    dependencies.redis.reset()
    yield
    dependencies.redis.reset()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_key() -> int:
    return uuid.uuid4().int % 10**9


def refused(error: pytest.ExceptionInfo[GatewayError]) -> GatewayError:
    assert error.value.kind is ErrorKind.RATE_LIMIT
    return error.value


# -- The sliding minute, in this process -------------------------------------------


def test_tokens_count_for_the_rest_of_their_second_and_59_more() -> None:
    clock = Clock(1000.5)
    store = LocalTokens(clock)

    async def take(tokens: int) -> Take:
        return await store.take(1, 100, tokens)

    async def scenario() -> None:
        assert await take(60) == Take(1000, 0.0)
        clock.now = 1030.2
        assert await take(40) == Take(1030, 0.0)
        clock.now = 1059.9
        bucket, wait = await take(1)  # full: the first 60 leave when second 1060 begins
        assert bucket is None and wait == pytest.approx(0.1)
        clock.now = 1060.0
        assert await take(60) == Take(1060, 0.0)  # they left: 40 + 60
        bucket, wait = await take(1)
        assert bucket is None and wait == pytest.approx(30.0)  # the 40 of second 1030 leave at 1090

    asyncio.run(scenario())


def test_a_refusal_waits_for_as_much_of_the_minute_as_must_leave() -> None:
    clock = Clock(0.0)
    store = LocalTokens(clock)

    async def scenario() -> Take:
        for second, tokens in ((0, 10), (1, 10), (2, 80)):
            clock.now = second + 0.5
            assert (await store.take(1, 100, tokens)).bucket == second
        clock.now = 3.25
        return await store.take(1, 100, 15)  # 15 must leave: seconds 0 and 1

    bucket, wait = asyncio.run(scenario())
    assert bucket is None and wait == pytest.approx(1 + 60 - 3.25)


def test_a_correction_frees_room_unless_its_bucket_left_the_minute() -> None:
    clock = Clock(0.0)
    store = LocalTokens(clock)

    async def scenario() -> list[int | None]:
        full = await store.take(1, 100, 100)
        store.correct(1, full.bucket, -70)  # used 30 of its estimate of 100
        room = await store.take(1, 100, 70)
        clock.now = 59.5
        later = await store.take(1, 100, 1)
        clock.now = 60.0
        store.correct(1, full.bucket, 50)  # used more, but ended after its second left the minute
        return [full.bucket, room.bucket, later.bucket, (await store.take(1, 100, 100)).bucket]

    assert asyncio.run(scenario()) == [0, 0, None, 60]


def test_keys_are_counted_apart() -> None:
    store = LocalTokens(Clock(5.0))

    async def scenario() -> list[int | None]:
        return [(await store.take(key, 100, 100)).bucket for key in (1, 2, 1)]

    assert asyncio.run(scenario()) == [5, 5, None]


# -- Admission: the wait for room, the 429 -----------------------------------------


@pytest.fixture
def local(settings) -> TokenLimits:
    settings.REDIS_URL = None
    settings.HOPBASE_CAPACITY_WAIT = 0.3
    return TokenLimits()


def test_without_redis_the_counts_are_this_processs(local) -> None:
    assert isinstance(local.store, LocalTokens)


def test_a_request_that_does_not_fit_waits_the_capacity_wait_then_gets_429_with_retry_after(local) -> None:
    async def scenario() -> tuple[float, GatewayError]:
        await local.admit(1, 100, 95, "a")
        started = time.monotonic()
        with pytest.raises(GatewayError) as error:
            await local.admit(1, 100, 10, "b")
        return time.monotonic() - started, refused(error)

    took, error = asyncio.run(scenario())
    assert 0.3 <= took < 0.6
    assert 59 <= error.retry_after <= 60
    assert "100 tokens per minute" in error.message


def test_a_request_larger_than_the_whole_limit_is_refused_at_once(local) -> None:
    async def scenario() -> tuple[float, GatewayError]:
        started = time.monotonic()
        with pytest.raises(GatewayError) as error:
            await local.admit(1, 100, 101, "a")
        return time.monotonic() - started, refused(error)

    took, error = asyncio.run(scenario())
    assert took < 0.05
    assert "never fit" in error.message and "100 tokens per minute" in error.message
    assert error.retry_after == 60
    assert local._store is None  # not even counted: it could never be


def test_a_waiting_request_is_let_in_by_a_correction_at_once(local, settings) -> None:
    settings.HOPBASE_CAPACITY_WAIT = 5

    async def scenario() -> float:
        await local.admit(1, 100, 100, "a")
        asyncio.get_running_loop().call_later(0.05, local.correct, 1, "a", 40)
        started = time.monotonic()
        await local.admit(1, 100, 60, "b")
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 0.5  # woken by the correction, not the minute


def test_a_waiting_request_is_let_in_when_the_minute_slides(local, settings, monkeypatch) -> None:
    monkeypatch.setattr(token_limits_module, "WINDOW_SECONDS", 1)
    settings.HOPBASE_CAPACITY_WAIT = 3

    async def scenario() -> float:
        await local.admit(1, 100, 100, "a")
        started = time.monotonic()
        await local.admit(1, 100, 10, "b")
        return time.monotonic() - started

    assert asyncio.run(scenario()) <= 1.5


def test_a_correction_counts_what_was_used_once_and_only_for_its_own_request(local) -> None:
    async def scenario() -> None:
        await local.admit(1, 100, 100, "a")
        local.correct(2, "a", 0)  # another key's request of the same id: not this one
        local.correct(1, "nobody", 0)
        with pytest.raises(GatewayError):
            await local.admit(1, 100, 1, "b")
        local.correct(1, "a", 0)  # failed: it used nothing
        local.correct(1, "a", 0)  # once only
        await local.admit(1, 100, 100, "c")
        local.correct(1, "c", 120)  # used more than estimated: the real count stands
        with pytest.raises(GatewayError):
            await local.admit(1, 120, 1, "d")

    asyncio.run(scenario())


# -- Shared through Redis ----------------------------------------------------------


@pytest.fixture
def redis_url() -> str:
    if not django_settings.REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    return django_settings.REDIS_URL


def buckets(url: str, key_id: int) -> dict[int, int]:
    return {int(s): int(n) for s, n in redis.Redis.from_url(url).hgetall(f"{PREFIX}{key_id}").items()}


def test_redis_counts_in_seconds_of_its_own_clock(redis_url) -> None:
    store = RedisTokens(redis_url)
    key = new_key()

    async def scenario() -> tuple[Take, Take, Take]:
        return await store.take(key, 100, 60), await store.take(key, 100, 40), await store.take(key, 100, 1)

    before = redis.Redis.from_url(redis_url).time()[0]
    first, second, third = asyncio.run(scenario())
    after = redis.Redis.from_url(redis_url).time()[0]
    assert before <= first.bucket <= second.bucket <= after
    assert third.bucket is None and 59 < third.wait <= 60
    assert sum(buckets(redis_url, key).values()) == 100
    assert 0 < redis.Redis.from_url(redis_url).ttl(f"{PREFIX}{key}") <= 60


def test_redis_forgets_seconds_that_left_the_minute_and_their_corrections(redis_url) -> None:
    store = RedisTokens(redis_url)
    key = new_key()
    shared = redis.Redis.from_url(redis_url)
    now = shared.time()[0]
    shared.hset(f"{PREFIX}{key}", mapping={now - 60: 90, now - 59: 5})

    async def scenario() -> Take:
        store.correct(key, now - 60, 10)  # its second left: nothing changes
        await asyncio.wait([store._flusher], timeout=5)
        assert not store._corrections and buckets(redis_url, key)[now - 60] == 90
        return await store.take(key, 100, 95)

    take = asyncio.run(scenario())
    assert take.bucket is not None  # the 90 no longer count; the 5 do
    assert now - 60 not in buckets(redis_url, key)  # and are gone


def test_a_correction_through_redis_lets_a_waiting_request_in(redis_url, settings) -> None:
    settings.HOPBASE_CAPACITY_WAIT = 5
    limits = TokenLimits(RedisTokens(redis_url))
    key = new_key()

    async def scenario() -> float:
        await limits.admit(key, 100, 100, "a")
        asyncio.get_running_loop().call_later(0.05, limits.correct, key, "a", 30)
        started = time.monotonic()
        await limits.admit(key, 100, 70, "b")
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1
    assert sum(buckets(redis_url, key).values()) == 100


def test_a_request_cancelled_while_being_counted_leaves_nothing_counted(redis_url, settings) -> None:
    settings.HOPBASE_CAPACITY_WAIT = 5
    limits = TokenLimits(RedisTokens(redis_url))
    key = new_key()

    async def scenario() -> None:
        admitting = asyncio.ensure_future(limits.admit(key, 100, 100, "a"))
        await asyncio.sleep(0)  # the script is on its way
        admitting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admitting
        await limits.admit(key, 100, 100, "b")  # the whole minute: only once the first is given back

    asyncio.run(scenario())
    assert sum(buckets(redis_url, key).values()) == 100


class Unanswering:
    """A port where Redis should be: each connection is accepted, counted and
    closed at once, so a client fails as it would against a dead Redis."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self.listener.close()


def test_requests_are_let_through_uncounted_while_redis_is_unreachable(settings) -> None:
    settings.HOPBASE_CAPACITY_WAIT = 1
    redis_away = Unanswering()
    store = RedisTokens(redis_away.url)
    limits = TokenLimits(store)
    tried: list[int] = []

    async def scenario() -> float:
        started = time.monotonic()
        for n in range(5):
            await limits.admit(1, 100, 100, f"r{n}")  # each would fill the minute
            tried.append(redis_away.connections)
            limits.correct(1, f"r{n}", 50)
        return time.monotonic() - started

    try:
        took = asyncio.run(scenario())
    finally:
        redis_away.close()
    assert tried[0] >= 1 and tried[1:] == [tried[0]] * 4, tried  # after the first failure, Redis is not even tried
    assert took < settings.HOPBASE_CAPACITY_WAIT  # no request waited for capacity that cannot be counted
    assert not dependencies.redis.up
    assert not limits._counted and not store._corrections  # nothing counted, nothing to correct


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


def test_a_correction_made_while_redis_is_away_reaches_it_when_it_answers(redis_url, settings, monkeypatch) -> None:
    monkeypatch.setattr(dependencies.redis, "pause", 0.1)
    # Only Redis answering another call can have the correction retried in time.
    monkeypatch.setattr(token_limits_module, "CORRECTION_RETRY_SECONDS", 10)
    settings.HOPBASE_CAPACITY_WAIT = 5
    address = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    key = new_key()
    with TcpProxy(address.get("host", "127.0.0.1"), address.get("port", 6379)) as proxy:
        limits = TokenLimits(RedisTokens(f"redis://127.0.0.1:{proxy.port}/{address.get('db', 0)}"))

        async def scenario() -> float:
            await limits.admit(key, 100, 100, "a")
            proxy.refuse()
            limits.correct(key, "a", 10)  # used 10: cannot reach Redis now
            await until(lambda: not dependencies.redis.up)
            assert sum(buckets(redis_url, key).values()) == 100
            proxy.restore()
            await until(dependencies.redis.due)  # the breaker's pause is over
            started = time.monotonic()
            await limits.admit(key, 100, 90, "b")  # finds Redis answering: the correction lands, then room
            return time.monotonic() - started

        assert asyncio.run(scenario()) < 1
    assert sum(buckets(redis_url, key).values()) == 100


# -- Shared across processes -------------------------------------------------------

# One gateway process's worth: `count` concurrent admissions of `tokens` each
# against a limit, once told to go; prints how many were admitted and refused.
ADMISSIONS = """
import asyncio, json, sys
import django
django.setup()
from core.errors import GatewayError
from gateway.governance.token_limits import token_limits

key, limit, count, tokens = (int(a) for a in sys.argv[1:])

async def one(n):
    try:
        await token_limits.admit(key, limit, tokens, f"{n}")
        return "admitted"
    except GatewayError as error:
        return f"{error.kind.value}:{error.retry_after}"

async def main():
    await token_limits.admit(key + 1, limit, 1, "warm-up")  # connected before the start
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(await asyncio.gather(*(one(n) for n in range(count)))), flush=True)

asyncio.run(main())
"""


def start_admitting(redis_url: str, key: int) -> subprocess.Popen:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "REDIS_URL": redis_url,
           "HOPBASE_CAPACITY_WAIT": "0.3"}
    return subprocess.Popen([sys.executable, "-c", ADMISSIONS, str(key), "100", "10", "10"], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_line(process: subprocess.Popen, deadline: float) -> str:
    while not select.select([process.stdout], [], [], 0.1)[0]:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"no line from the process: {process.communicate()[1][-2000:]}")
    return process.stdout.readline().strip()


def test_two_processes_together_stay_within_the_limit(redis_url) -> None:
    key = new_key()
    processes = [start_admitting(redis_url, key) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        assert [read_line(p, deadline) for p in processes] == ["ready", "ready"]
        for process in processes:  # both at once
            process.stdin.write("go\n")
            process.stdin.flush()
        outcomes = [json.loads(read_line(p, deadline)) for p in processes]
    finally:
        for process in processes:
            process.kill()
            process.communicate()
    everything = outcomes[0] + outcomes[1]
    assert everything.count("admitted") == 10, outcomes
    assert all(o == "admitted" or o in ("rate_limit:59", "rate_limit:60") for o in everything), outcomes
    assert sum(buckets(redis_url, key).values()) == 100
