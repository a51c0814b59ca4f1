"""Repeated failed authentications from one client address are slowed
(table E): after HOPBASE_AUTH_FAILURES failures in a
window, 429 in the caller's format with retry-after, another address
unaffected, keys already known to be live still served. Counts in this
process, and in Redis when there is one (failing open)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random

import httpx
import pytest

from core import dependencies
from gateway import auth_throttle
from gateway.auth_throttle import FailedAuthentications

# Addresses counted in Redis are this run's own: Redis outlives a run, and
# another run's failures in the same window would count against them.
RUN_BASE = ipaddress.ip_address("198.18.0.0") + random.randrange(2**17 - 256)  # RFC 2544's test range


def run_address(n: int) -> str:
    return str(RUN_BASE + n)


# -- the counts ---------------------------------------------------------------------


@pytest.fixture
def limits(settings):
    settings.HOPBASE_AUTH_FAILURES = 3
    settings.HOPBASE_AUTH_FAILURE_WINDOW = 60
    settings.REDIS_URL = None


def fail(counts: FailedAuthentications, address: str, times: int) -> None:
    async def scenario() -> None:
        for _ in range(times):
            await counts.failed(address)

    asyncio.run(scenario())


def test_an_address_is_held_back_after_its_limit_and_another_is_not(limits, monkeypatch):
    monkeypatch.setattr(auth_throttle.time, "time", lambda: 1_000_030.0)  # mid-window: no window ends between
    counts = FailedAuthentications()
    fail(counts, "203.0.113.1", 2)
    assert not counts.blocking() and counts.retry_after("203.0.113.1") is None
    fail(counts, "203.0.113.1", 1)
    assert counts.blocking()
    assert 1 <= counts.retry_after("203.0.113.1") <= 60
    assert counts.retry_after("203.0.113.2") is None


def test_the_hold_ends_with_the_window(limits, settings, monkeypatch):
    settings.HOPBASE_AUTH_FAILURE_WINDOW = 10
    now = [1_000_005.0]  # the middle of a window
    monkeypatch.setattr(auth_throttle.time, "time", lambda: now[0])
    counts = FailedAuthentications()
    fail(counts, "203.0.113.1", 3)
    assert counts.retry_after("203.0.113.1") == 5
    now[0] += 5
    assert counts.retry_after("203.0.113.1") is None and not counts.blocking()
    fail(counts, "203.0.113.1", 1)  # a new window: counted from one again
    assert counts.retry_after("203.0.113.1") is None


def test_the_table_of_addresses_is_bounded_least_recently_used_first_out(limits, monkeypatch):
    monkeypatch.setattr(auth_throttle, "MAX_ADDRESSES", 2)
    counts = FailedAuthentications()
    fail(counts, "a", 3)
    fail(counts, "b", 1)
    fail(counts, "a", 1)
    fail(counts, "c", 1)  # b goes
    assert list(counts._windows) == ["a", "c"]
    assert counts.retry_after("a") is not None


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis")
def test_the_fleets_count_comes_from_redis(limits, settings):
    settings.REDIS_URL = os.environ["REDIS_URL"]
    dependencies.redis.reset()
    address = run_address(77)
    one, other = FailedAuthentications(), FailedAuthentications()  # two gateway processes
    fail(one, address, 2)
    assert other.retry_after(address) is None
    fail(other, address, 1)  # its first failure here, the third in the fleet
    assert other.retry_after(address) is not None


def test_without_redis_each_process_counts_alone(limits, settings, monkeypatch):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    dependencies.redis.reset()
    counts = FailedAuthentications()
    try:
        fail(counts, "203.0.113.9", 3)
        assert counts.retry_after("203.0.113.9") is not None
    finally:
        dependencies.redis.reset()


# -- through a gateway behind a trusted proxy ------------------------------------------

LIMIT = 3
WINDOW = 3600


@pytest.fixture(scope="module")
def proxied_gateway(world):
    """A gateway of its own that believes X-Forwarded-For from 127.0.0.1
    (the tests play the proxy), with a small limit."""
    from django.conf import settings

    from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
    from tests.support.processes import start_gateway

    env = {
        **GATEWAY_TIMERS,
        "DATABASE_URL": database_url_for_subprocess(),
        "HOPBASE_AUTH_FAILURES": str(LIMIT),
        # Windows are fixed: an hour makes one ending amid a test's few calls all but impossible.
        "HOPBASE_AUTH_FAILURE_WINDOW": str(WINDOW),
        "HOPBASE_TRUSTED_PROXIES": "127.0.0.1",
    }
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    service = start_gateway(env)
    yield service
    service.stop()


THROTTLED = {
    "chat": (429, lambda body: body["error"]["code"] == "rate_limit_exceeded"),
    "messages": (429, lambda body: body["error"]["type"] == "rate_limit_error"),
    "gemini": (429, lambda body: body["error"]["status"] == "RESOURCE_EXHAUSTED"),
}
REFUSED = {"chat": 401, "messages": 401, "gemini": 400}


def ask(gateway, protocol: str, key: str, address: str) -> httpx.Response:
    from tests.support.wire import call

    request = call(protocol, key, "sim-model", "hi", stream=False)
    headers = {**request.headers, "x-forwarded-for": address}
    return httpx.post(gateway.url + request.path, json=request.body, headers=headers, timeout=10)


@pytest.mark.gateway
@pytest.mark.parametrize("protocol", ["chat", "messages", "gemini"])
def test_failed_keys_from_one_address_get_429_and_other_addresses_do_not(proxied_gateway, world, protocol):
    address = run_address(10 + list(THROTTLED).index(protocol))
    for _ in range(LIMIT):
        assert ask(proxied_gateway, protocol, "hb-guess", address).status_code == REFUSED[protocol]
    held = ask(proxied_gateway, protocol, "hb-guess", address)
    status, check = THROTTLED[protocol]
    assert held.status_code == status and check(held.json())
    assert 1 <= int(held.headers["retry-after"]) <= WINDOW
    assert "failed authentications" in held.text
    # A right key this gateway has not seen waits too: nothing is looked up for this address.
    assert ask(proxied_gateway, protocol, world.other_key, address).status_code == 429
    # Another address is unaffected.
    assert ask(proxied_gateway, protocol, "hb-guess", run_address(200)).status_code == REFUSED[protocol]


@pytest.mark.gateway
def test_a_key_already_known_is_served_from_a_held_back_address(proxied_gateway, world):
    address = run_address(50)
    assert ask(proxied_gateway, "chat", world.key, run_address(1)).status_code == 200  # now known here
    for _ in range(LIMIT):
        ask(proxied_gateway, "chat", "hb-guess", address)
    assert ask(proxied_gateway, "chat", "hb-guess", address).status_code == 429
    assert ask(proxied_gateway, "chat", world.key, address).status_code == 200
