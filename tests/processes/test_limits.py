"""Rate and concurrency limits (F8): keys' requests per minute and open
requests, channels' open requests; a short wait for capacity, then a clear
429 in the caller's format."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from bench.tcp_proxy import TcpProxy
from core import dependencies
from core.errors import ErrorKind, GatewayError
from gateway.governance import limits as limits_module
from gateway.governance.limits import SLOTS_PREFIX, WINDOW_SECONDS, Limits, LocalCounters, RedisCounters
from tests.support.wire import call, wait_for_log, wait_for_records


@pytest.fixture(autouse=True)
def redis_up():
    """Every test starts with Redis taken to be up (the breaker is the process's)."""
    dependencies.redis.reset()
    yield
    dependencies.redis.reset()


@pytest.fixture
def local_limits(settings) -> Limits:
    settings.REDIS_URL = None
    settings.HOPBASE_CAPACITY_WAIT = 0.2
    return Limits()


def test_concurrency_slots_are_taken_and_given_back() -> None:
    async def scenario() -> list[bool]:
        counters = LocalCounters()
        first = await counters.take_slot("k", 1)
        second = await counters.take_slot("k", 1)
        counters.give_back_slot("k")
        third = await counters.take_slot("k", 1)
        return [first, second, third]

    assert asyncio.run(scenario()) == [True, False, True]


def test_requests_per_minute_say_how_long_to_wait() -> None:
    async def scenario() -> list[float]:
        counters = LocalCounters()
        return [await counters.take_start("k", 2) for _ in range(3)]

    first, second, third = asyncio.run(scenario())
    assert first == second == 0
    assert 59 < third <= 60


def test_a_key_over_its_rate_is_refused_at_once_with_retry_after(local_limits) -> None:
    async def scenario() -> GatewayError:
        await local_limits.admit_key(1, rpm=1, concurrency=None)
        started = time.monotonic()
        with pytest.raises(GatewayError) as refused:
            await local_limits.admit_key(1, rpm=1, concurrency=None)
        assert time.monotonic() - started < 0.1  # no point waiting a minute
        return refused.value

    error = asyncio.run(scenario())
    assert error.kind is ErrorKind.RATE_LIMIT
    assert 1 <= error.retry_after <= 60


def test_a_key_waits_for_a_slot_that_frees_up(local_limits) -> None:
    async def scenario() -> None:
        await local_limits.admit_key(7, rpm=None, concurrency=1)
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, local_limits.release_key, 7)
        await local_limits.admit_key(7, rpm=None, concurrency=1)

    asyncio.run(scenario())


def test_keys_and_channels_without_limits_cost_nothing(local_limits) -> None:
    async def scenario() -> bool:
        for _ in range(1000):
            await local_limits.admit_key(3, rpm=None, concurrency=None)
        return await local_limits.take_channel(3, None)

    assert asyncio.run(scenario()) is True
    assert local_limits._counters is None


REDIS_FOR_TESTS = "redis://127.0.0.1:6379/7"


def test_a_request_cancelled_while_taking_a_shared_slot_leaves_none_taken() -> None:
    """The take is one Redis script; a caller cancelled while it runs gives
    back the slot the script took for it."""

    async def scenario() -> int:
        counters = RedisCounters(REDIS_FOR_TESTS)
        redis = counters._redis()
        name = f"test:{uuid.uuid4().hex}"
        taking = asyncio.ensure_future(counters.take_slot(name, 1))
        await asyncio.sleep(0)  # the script is on its way
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        deadline = time.monotonic() + 5
        while counters._pending or not await counters.take_slot(name, 1):
            assert time.monotonic() < deadline, "the cancelled take kept its slot"
            await asyncio.sleep(0.01)
        counters.give_back_slot(name)
        while counters._pending:
            await asyncio.sleep(0.01)
        return await redis.zcard(SLOTS_PREFIX + name)

    assert asyncio.run(scenario()) == 0


def test_limits_let_requests_through_when_the_shared_store_is_down(settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    limits = Limits()

    async def scenario() -> tuple[bool, bool]:
        return await limits.admit_key(1, rpm=5, concurrency=1), await limits.take_channel(1, 1)

    assert asyncio.run(scenario()) == (False, True)


# -- Redis outages (D3) ------------------------------------------------------------


@pytest.fixture
def redis_proxy():
    host, port = redis.Redis.from_url(REDIS_FOR_TESTS).connection_pool.connection_kwargs["host"], 6379
    with TcpProxy(host, port) as proxy:
        yield proxy


def through(proxy: TcpProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/7"


def slot_count(name: str) -> int:
    return redis.Redis.from_url(REDIS_FOR_TESTS).zcard(SLOTS_PREFIX + name)


@pytest.mark.parametrize("outage", ["refuse", "silence"])
def test_a_redis_outage_costs_one_short_timeout_then_nothing_and_one_warning(redis_proxy, outage, caplog) -> None:
    limits = Limits(RedisCounters(through(redis_proxy)))
    caplog.set_level(logging.WARNING, logger="hopbase.dependencies")

    key, channel = uuid.uuid4().int % 10**9, uuid.uuid4().int % 10**9

    async def scenario() -> list[float]:
        assert await limits.admit_key(key, rpm=1000, concurrency=10)  # connected while Redis answers
        limits.release_key(key)
        getattr(redis_proxy, outage)()
        took = []
        for _ in range(20):
            started = time.monotonic()
            assert await limits.admit_key(key, rpm=1000, concurrency=10) is False  # let through, holding nothing
            assert await limits.take_channel(channel, 10) is True
            took.append(time.monotonic() - started)
        return took

    took = asyncio.run(scenario())
    assert took[0] < 0.5, took  # one short socket timeout at most
    assert max(took[1:]) < 0.02, took  # then Redis is not even tried
    assert not dependencies.redis.up
    warnings = [r for r in caplog.records if "redis unreachable" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]


def test_redis_is_tried_again_after_the_pause_and_then_counts_again(redis_proxy, monkeypatch) -> None:
    monkeypatch.setattr(dependencies.redis, "pause", 0.2)
    counters = RedisCounters(through(redis_proxy))
    limits = Limits(counters)
    name = uuid.uuid4().int % 10**9

    async def scenario() -> tuple[bool, bool]:
        redis_proxy.refuse()
        await limits.take_channel(name, 1)  # let through
        redis_proxy.restore()
        await asyncio.sleep(0.25)
        first = await limits.take_channel(name, 1)  # counted in Redis again
        second = await limits.take_channel(name, 1)  # full: the one let through is not in the count, this one is
        return first, second

    assert asyncio.run(scenario()) == (True, False)
    assert dependencies.redis.up


def test_a_slot_let_through_during_an_outage_is_never_taken_from_the_shared_count(redis_proxy, monkeypatch) -> None:
    """No release without a matching take: the counts in Redis come back to
    zero, never below, whatever the outage did in between."""
    monkeypatch.setattr(dependencies.redis, "pause", 0.2)
    counters = RedisCounters(through(redis_proxy))
    limits = Limits(counters)
    channel = uuid.uuid4().int % 10**9
    name = f"channel:{channel}"

    async def scenario() -> None:
        assert await limits.take_channel(channel, 5)  # a lease in Redis
        redis_proxy.refuse()
        assert await limits.take_channel(channel, 5)  # let through
        assert await limits.take_channel(channel, 5)  # let through
        assert counters.open_slots(name) == 3
        limits.release_channel(channel, 5)
        limits.release_channel(channel, 5)  # the two let through go first: Redis untouched
        assert slot_count(name) == 1
        limits.release_channel(channel, 5)  # the lease: its removal waits for Redis
        limits.release_channel(channel, 5)  # one release too many: nothing to give back
        assert counters.open_slots(name) == 0
        redis_proxy.restore()
        await asyncio.sleep(0.25)
        assert await limits.take_channel(channel, 5)  # Redis answers: the waiting removal goes through
        limits.release_channel(channel, 5)
        deadline = time.monotonic() + 5
        while slot_count(name):
            assert time.monotonic() < deadline, "a lease was never removed"
            await asyncio.sleep(0.02)

    asyncio.run(scenario())
    assert slot_count(name) == 0


def test_a_slot_given_back_during_an_outage_leaves_redis_once_it_answers(redis_proxy, monkeypatch) -> None:
    """Without another request to carry it: the waiting release is retried on
    its own, so nothing stays counted until its lease lapses."""
    monkeypatch.setattr(dependencies.redis, "pause", 0.2)
    monkeypatch.setattr(limits_module, "RELEASE_RETRY_SECONDS", 0.05)
    limits = Limits(RedisCounters(through(redis_proxy)))
    key = uuid.uuid4().int % 10**9

    async def scenario() -> None:
        assert await limits.admit_key(key, None, 5)
        redis_proxy.refuse()
        limits.release_key(key)  # Redis cannot take it now
        await asyncio.sleep(0.1)
        assert slot_count(f"key:{key}") == 1
        redis_proxy.restore()
        deadline = time.monotonic() + 5
        while slot_count(f"key:{key}"):
            assert time.monotonic() < deadline, "the release never reached Redis"
            await asyncio.sleep(0.02)

    asyncio.run(scenario())


def test_a_drain_hands_redis_the_releases_still_waiting(redis_proxy, monkeypatch) -> None:
    monkeypatch.setattr(dependencies.redis, "pause", 0.05)
    monkeypatch.setattr(limits_module, "RELEASE_RETRY_SECONDS", 10)  # only the drain's flush can do it in time
    limits = Limits(RedisCounters(through(redis_proxy)))
    key = uuid.uuid4().int % 10**9

    async def scenario() -> None:
        assert await limits.admit_key(key, None, 5)
        redis_proxy.refuse()
        limits.release_key(key)
        await asyncio.sleep(0.1)
        redis_proxy.restore()
        await asyncio.sleep(0.1)  # the breaker's pause is over
        await limits.flush(timeout=2)

    asyncio.run(scenario())
    assert slot_count(f"key:{key}") == 0


def test_a_full_release_queue_lets_the_oldest_lapse_and_keeps_the_newest(redis_proxy, monkeypatch) -> None:
    """Releases wait for Redis in a bounded queue. A batch Redis could not
    take goes back in front of the releases given back meanwhile; when that
    overfills the queue the oldest are dropped (their leases lapse anyway),
    never the newest."""
    monkeypatch.setattr(limits_module, "MAX_PENDING_RELEASES", 4)
    monkeypatch.setattr(limits_module, "RELEASE_RETRY_SECONDS", 30)  # no second try during the test
    counters = RedisCounters(through(redis_proxy))
    released = [("key:1", f"lease-{i}") for i in range(7)]

    async def scenario() -> list[tuple[str, str]]:
        redis_proxy.silence()  # the flush's call hangs until its socket timeout
        for name, lease in released[:4]:
            counters._release(name, lease)
        deadline = time.monotonic() + 5
        while counters._releases:  # the flush took its batch and waits for Redis
            assert time.monotonic() < deadline, "the flush never took its batch"
            await asyncio.sleep(0.001)
        assert counters._flushing
        for name, lease in released[4:]:
            counters._release(name, lease)  # given back while the batch is out
        while counters._retry_now is None:  # the batch failed and was put back
            assert time.monotonic() < deadline, "the flush never failed"
            await asyncio.sleep(0.01)
        return list(counters._releases)

    assert asyncio.run(scenario()) == released[3:]


BUSY_FOR = """
local start = redis.call('TIME')
local t0 = start[1] * 1000000 + start[2]
repeat local now = redis.call('TIME') until now[1] * 1000000 + now[2] - t0 > tonumber(ARGV[1])
"""


def test_a_take_whose_answer_came_too_late_leaves_no_lease_behind() -> None:
    """Redis ran the take but answered after the client's timeout: the
    request was let through holding nothing, so the lease must go too."""
    limits = Limits(RedisCounters(REDIS_FOR_TESTS))
    key = uuid.uuid4().int % 10**9
    busy = redis.Redis.from_url(REDIS_FOR_TESTS)

    async def scenario() -> bool:
        assert await limits.admit_key(key, None, 5)  # connected
        limits.release_key(key)
        blocker = asyncio.get_running_loop().run_in_executor(None, lambda: busy.eval(BUSY_FOR, 0, 400_000))
        await asyncio.sleep(0.05)
        taken = await limits.admit_key(key, None, 5)  # times out while Redis is busy
        await blocker
        dependencies.redis.reset()
        deadline = time.monotonic() + 5
        while slot_count(f"key:{key}"):
            assert time.monotonic() < deadline, "the late lease was never removed"
            await asyncio.sleep(0.05)
        return taken

    assert asyncio.run(scenario()) is False


def test_a_take_left_by_its_caller_and_answered_too_late_leaves_no_lease_behind() -> None:
    limits = Limits(RedisCounters(REDIS_FOR_TESTS))
    key = uuid.uuid4().int % 10**9
    busy = redis.Redis.from_url(REDIS_FOR_TESTS)

    async def scenario() -> None:
        assert await limits.admit_key(key, None, 5)  # connected
        limits.release_key(key)
        blocker = asyncio.get_running_loop().run_in_executor(None, lambda: busy.eval(BUSY_FOR, 0, 400_000))
        await asyncio.sleep(0.05)
        taking = asyncio.create_task(limits.admit_key(key, None, 5))
        await asyncio.sleep(0.02)
        taking.cancel()  # the client left while the take was on its way
        await blocker
        dependencies.redis.reset()
        deadline = time.monotonic() + 5
        while slot_count(f"key:{key}"):
            assert time.monotonic() < deadline, "the late lease was never removed"
            await asyncio.sleep(0.05)

    asyncio.run(scenario())


def test_a_crashed_holders_slots_lapse(monkeypatch) -> None:
    monkeypatch.setattr(limits_module, "LEASE_SECONDS", 0.3)
    name = f"test:{uuid.uuid4().hex}"

    async def scenario() -> tuple[bool, bool]:
        crashed = RedisCounters(REDIS_FOR_TESTS)
        assert await crashed.take_slot(name, 1)
        crashed._held.clear()  # it dies: nobody renews its lease or gives it back
        other = RedisCounters(REDIS_FOR_TESTS)
        refused = await other.take_slot(name, 1)
        await asyncio.sleep(0.4)
        return refused, await other.take_slot(name, 1)

    assert asyncio.run(scenario()) == (False, True)


def test_a_living_holder_keeps_its_slots_by_renewing_them(monkeypatch) -> None:
    monkeypatch.setattr(limits_module, "LEASE_SECONDS", 0.3)
    monkeypatch.setattr(limits_module, "RENEW_SECONDS", 0.1)
    name = f"test:{uuid.uuid4().hex}"

    async def scenario() -> tuple[bool, bool]:
        holder, other = RedisCounters(REDIS_FOR_TESTS), RedisCounters(REDIS_FOR_TESTS)
        assert await holder.take_slot(name, 1)
        await asyncio.sleep(0.7)  # two lease lengths
        while_held = await other.take_slot(name, 1)
        holder.give_back_slot(name)
        while holder._pending:
            await asyncio.sleep(0.01)
        return while_held, await other.take_slot(name, 1)

    assert asyncio.run(scenario()) == (False, True)


def slow_request(gateway, key: str, model: str, directives: str) -> httpx.Response:
    if "tag=" not in directives:
        directives += f" tag={uuid.uuid4().hex[:8]}"
    request = call("chat", key, model, f"hi [sim {directives}]", stream=False)
    return httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=20)


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_second_request_on_a_one_at_a_time_key_waits_then_gets_429(gateway, world):
    tag = uuid.uuid4().hex[:8]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(slow_request, gateway, world.one_at_a_time_key, "sim-model", f"tag={tag} tokens=2 first_delay=2")
        wait_for_records(world.simulator.url, tag)  # the first holds the key's only slot
        second = slow_request(gateway, world.one_at_a_time_key, "sim-model", "tokens=2")
        assert first.result().status_code == 200
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(second.headers["retry-after"]) <= 60
    assert wait_for_log(second.headers["x-hopbase-request-id"]).status == "rejected"
    # The slot came back with the first request's end.
    assert slow_request(gateway, world.one_at_a_time_key, "sim-model", "tokens=1").status_code == 200


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_key_over_its_requests_per_minute_gets_429(gateway, world):
    # Minutes are fixed windows, and a request over the limit waits up to the
    # capacity wait (1 s here) for the next one: three requests begun in the
    # last seconds of a minute would all be served. Begin them in a fresh one.
    left = WINDOW_SECONDS - time.time() % WINDOW_SECONDS
    if left < 5:
        time.sleep(left + 0.1)
    statuses = [slow_request(gateway, world.two_a_minute_key, "sim-model", "tokens=1").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_full_channel_is_waited_for_then_reported_busy(gateway, world):
    tag = uuid.uuid4().hex[:8]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(slow_request, gateway, world.key, "narrow-model", f"tag={tag} tokens=2 first_delay=2.5")
        wait_for_records(world.simulator.url, tag)
        second = slow_request(gateway, world.key, "narrow-model", "tokens=1")
        assert first.result().status_code == 200
    assert second.status_code == 429
    assert "retry-after" in second.headers
    log = wait_for_log(second.headers["x-hopbase-request-id"])
    # Refused by a limit before any channel was tried.
    assert (log.status, log.attempts, log.error_kind) == ("rejected", 0, "capacity")


# -- affinity through a Redis outage -------------------------------------------------


def test_affinity_lookups_fail_open_fast_and_its_writes_wait_in_a_bounded_queue(redis_proxy, settings, monkeypatch, caplog) -> None:
    from channels_pool import affinity as affinity_module
    from channels_pool.provider_state import StateOwners

    settings.REDIS_URL = through(redis_proxy)
    monkeypatch.setattr(dependencies.redis, "pause", 0.2)
    monkeypatch.setattr(affinity_module, "MAX_QUEUED_WRITES", 5)
    # Owners from no database: this is about Redis (channels_pool.provider_state has its own tests).
    writer, reader = (affinity_module.Affinity(StateOwners(load=lambda state_id: None)) for _ in range(2))
    prefix = uuid.uuid4().hex

    async def lookup(state_id: str) -> tuple[int | None, float]:
        started = time.monotonic()
        return await reader.channel_for(state_id, 7), time.monotonic() - started

    def wait_for(state_id: str, channel_id: int | None) -> None:
        deadline = time.monotonic() + 5
        while asyncio.run(lookup(state_id))[0] != channel_id:
            assert time.monotonic() < deadline, f"{state_id} never reached Redis"
            time.sleep(0.05)

    writer.remember(f"{prefix}-before", 7, 3)
    wait_for(f"{prefix}-before", 3)  # another process follows it through Redis
    redis_proxy.silence()
    timings = [asyncio.run(lookup(f"{prefix}-unknown-{i}")) for i in range(10)]
    assert all(found is None for found, _ in timings)
    assert timings[0][1] < 0.5 and max(took for _, took in timings[1:]) < 0.05, timings
    for i in range(20):
        writer.remember(f"{prefix}-during-{i}", 7, 4)
    assert asyncio.run(writer.channel_for(f"{prefix}-during-19", 7)) == 4  # remembered here all the same
    assert writer.dropped >= 14 and writer.pending_writes() <= 5
    assert len([r for r in caplog.records if "dropped so far" in r.getMessage()]) == 1
    redis_proxy.restore()
    deadline = time.monotonic() + 5
    while writer.pending_writes():
        assert time.monotonic() < deadline, "queued writes never reached Redis"
        time.sleep(0.05)
    wait_for(f"{prefix}-during-0", 4)  # queued through the outage, written after it
    assert asyncio.run(lookup(f"{prefix}-during-19"))[0] is None  # dropped
