"""A process that holds as many requests as it can refuses the excess at
once, with the capacity error of table E in the caller's format, instead of
letting requests wait minutes and fail (overload)."""

from __future__ import annotations

import resource
import time

import httpx
import pytest

from core.errors import ErrorKind, GatewayError
from gateway.governance.capacity import FD_HEADROOM, FairShare, derived_limit
from tests.support.drain_harness import (
    FULL,
    WITHIN,
    InFlight,
    assert_table_e,
    readyz,
    send,
    start_daphne,
    stop_for_good,
    tagged,
)
from tests.support.wire import PROTOCOLS, wait_for_log

LIMIT = 2
LONG = "tokens=200 pace=0.05"  # about 10 s


def test_the_limit_is_two_sockets_a_request_after_a_headroom():
    assert derived_limit(1024, 2000) == (1024 - FD_HEADROOM - 51) // 2
    assert derived_limit(20_000, 2000) == 2000  # the upstream pool is the smaller
    assert derived_limit(resource.RLIM_INFINITY, 2000) == 2000
    assert derived_limit(16, 2000) == 1


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
def test_a_full_gateway_refuses_the_excess_at_once(world):
    gateway = start_daphne(HOPBASE_MAX_OPEN_REQUESTS=str(LIMIT))
    try:
        # A burst of long streams: the first LIMIT are served, the rest refused.
        burst = [InFlight(gateway.url, "chat", world.key, tagged(LONG)) for _ in range(LIMIT + 3)]
        for stream in burst:
            assert stream.started.wait(WITHIN) and stream.error is None
        served = [stream for stream in burst if stream.status == 200]
        refused = [stream for stream in burst if stream.status != 200]
        assert len(served) == LIMIT
        for stream in refused:
            stream.wait()
            assert_table_e(httpx.Response(stream.status, headers=stream.headers, content=stream.body), "chat", FULL)

        for protocol in PROTOCOLS:
            started = time.monotonic()
            response = send(gateway.url, protocol, world.key)
            assert time.monotonic() - started < 1
            assert_table_e(response, protocol, FULL)

        # The probes still answer, and say how full the process is.
        assert httpx.get(gateway.url + "/healthz", timeout=WITHIN).status_code == 200
        status, body = readyz(gateway.url)
        assert status == 200
        assert body["open_requests"] == LIMIT + 1  # the streams and this probe
        assert body["max_open_requests"] == LIMIT
        assert body["refused"]["full"] == len(refused) + len(PROTOCOLS)

        # Room again once a stream has ended.
        served[0].hang_up()
        served[0].wait()
        deadline = time.monotonic() + WITHIN
        while readyz(gateway.url)[1]["open_requests"] > LIMIT:
            assert time.monotonic() < deadline, "the hung-up stream is still counted"
            time.sleep(0.05)
        assert send(gateway.url, "messages", world.key).status_code == 200
    finally:
        stop_for_good(gateway)


def test_a_tenant_alone_holds_all_but_a_tenth_and_shares_with_the_next():
    share = FairShare(lambda: 10)
    for _ in range(9):
        share.admit(1)
    with pytest.raises(GatewayError) as refused:
        share.admit(1)  # the tenth is kept for others
    assert (refused.value.kind, refused.value.retry_after) == (ErrorKind.RATE_LIMIT, 1)
    share.admit(2)  # another tenant gets in; now each holds at most 5
    with pytest.raises(GatewayError):
        share.admit(1)
    for _ in range(4):
        share.admit(2)
    with pytest.raises(GatewayError):
        share.admit(2)
    for _ in range(5):
        share.release(2)
    assert share.share(1) == 9  # alone again
    share.release(1)
    share.admit(1)
    assert FairShare(lambda: 1).share(7) == 1  # a capacity of one is still one


@pytest.mark.gateway
@pytest.mark.usefixtures("world", "committed_db")
def test_one_tenants_burst_is_refused_its_excess_not_everyones(world):
    gateway = start_daphne(HOPBASE_MAX_OPEN_REQUESTS="10")
    try:
        burst = [InFlight(gateway.url, "chat", world.key, tagged(LONG)) for _ in range(9)]
        for stream in burst:
            assert stream.started.wait(WITHIN) and stream.error is None
        assert [stream.status for stream in burst] == [200] * 9
        # A tenth of its own is its excess: the last tenth of the process is kept for others.
        excess = send(gateway.url, "chat", world.key)
        assert excess.status_code == 429 and excess.headers["retry-after"] == "1"
        assert "share of HopBase's capacity" in excess.json()["error"]["message"]
        assert wait_for_log(excess.headers["x-hopbase-request-id"]).status == "rejected"
        # Another tenant still gets in while the first holds its nine.
        assert send(gateway.url, "messages", world.other_key).status_code == 200
        for stream in burst:
            stream.hang_up()
    finally:
        stop_for_good(gateway)
