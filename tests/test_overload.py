"""A process that holds as many requests as it can refuses the excess at
once, with the capacity error of table E in the caller's format, instead of
letting requests wait minutes and fail (issue 9, overload)."""

from __future__ import annotations

import resource
import time

import httpx
import pytest

from hopbase.admission import FD_HEADROOM, derived_limit
from tests.drain_harness import (
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
from tests.wire import PROTOCOLS

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
