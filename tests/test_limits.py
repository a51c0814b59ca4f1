"""Rate and concurrency limits (F8): keys' requests per minute and open
requests, channels' open requests; a short wait for capacity, then a clear
429 in the caller's format."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from core.errors import ErrorKind, GatewayError
from hopbase.limits import Limits, LocalCounters, RedisCounters
from tests.wire import call, wait_for_log, wait_for_records


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

    async def scenario() -> bytes | None:
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
        return await redis.get("hopbase:open:" + name)

    assert asyncio.run(scenario()) in (b"0", None)


def test_limits_let_requests_through_when_the_shared_store_is_down(settings) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    limits = Limits()

    async def scenario() -> tuple[bool, bool]:
        return await limits.admit_key(1, rpm=5, concurrency=1), await limits.take_channel(1, 1)

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
