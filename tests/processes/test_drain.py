"""Graceful drain on SIGTERM (D1): requests in flight finish, or end with
their protocol's interruption event at the drain's deadline; new requests
are refused in their caller's format; every request is recorded; the
process exits 0. First the mechanics in-process (core.lifecycle), then
real gateways: Daphne started the contract's way, and ``manage.py serve``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from billing import recorder as recorder_module
from billing.models import RequestLog
from core import lifecycle
from core.lifecycle import Lifecycle
from tests.support.drain_harness import (
    DRAIN_TIMEOUT,
    UNAVAILABLE,
    WITHIN,
    InFlight,
    ServeGroup,
    assert_table_e,
    send,
    start_under,
    stop_for_good,
    tag_of,
    tagged,
    wait_for_exit,
    wait_for_readyz,
)
from tests.support.processes import SERVERS
from tests.support.relay_checks import INTERRUPTED, TERMINALS, stream_errors
from tests.support.wire import PROTOCOLS, wait_for_records

SHORT = "tokens=12 pace=0.1"  # about 1.1 s: ends well within the drain
LONG = "tokens=200 pace=0.05"  # about 10 s: still open at the deadline


# -- the mechanics (core.lifecycle) -------------------------------------


class FakeRecorder:
    def __init__(self) -> None:
        self.flushes = 0

    def flush(self, timeout: float = 10) -> bool:
        self.flushes += 1
        return True


@pytest.fixture
def recorder(monkeypatch) -> FakeRecorder:
    fake = FakeRecorder()
    monkeypatch.setattr(recorder_module, "recorder", fake)  # what the drain's flush of the request logs calls
    return fake


def test_it_cancels_a_request_with_its_handler_while_serving():
    life = Lifecycle(drain_timeout=5)

    async def main() -> None:
        ended = asyncio.Event()

        async def work() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ended.set()

        handler = life.see_through(work())
        await asyncio.sleep(0)
        assert life.open_requests() == 1
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert ended.is_set()
        assert life.open_requests() == 0

    asyncio.run(main())


def test_while_draining_a_request_outlives_the_cancellation_of_its_handler():
    life = Lifecycle(drain_timeout=5)

    async def main() -> None:
        release = asyncio.Event()
        finished = []

        async def work() -> None:
            await release.wait()
            finished.append(True)

        handler = life.see_through(work())
        await asyncio.sleep(0)
        life.begin_drain()
        handler.cancel()  # what Daphne's shutdown does to every application
        await asyncio.sleep(0)
        assert not handler.done()
        release.set()
        await asyncio.wait_for(handler, WITHIN)
        assert finished == [True]

    asyncio.run(main())


def test_a_request_that_fails_fails_its_handler():
    life = Lifecycle(drain_timeout=5)

    async def work() -> None:
        raise ValueError("broken")

    async def main() -> None:
        await life.see_through(work())

    with pytest.raises(ValueError, match="broken"):
        asyncio.run(main())


def test_the_drain_waits_for_open_requests_then_flushes_the_request_logs(recorder):
    life = Lifecycle(drain_timeout=5)

    async def main() -> None:
        release = asyncio.Event()
        handler = life.see_through(release.wait())
        await asyncio.sleep(0)
        life.begin_drain()
        drained = asyncio.create_task(life.drained())
        await asyncio.sleep(0.05)
        assert not drained.done() and recorder.flushes == 0
        release.set()
        await asyncio.wait_for(drained, WITHIN)
        assert handler.done()
        assert recorder.flushes == 1

    asyncio.run(main())


def test_the_drain_cuts_what_is_still_open_a_grace_after_the_deadline(recorder, monkeypatch):
    monkeypatch.setattr(lifecycle, "GRACE", 0.1)
    life = Lifecycle(drain_timeout=0.2)

    async def main() -> None:
        cut = asyncio.Event()

        async def work() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cut.set()
                raise

        loop = asyncio.get_running_loop()
        handler = life.see_through(work())
        await asyncio.sleep(0)
        life.begin_drain()
        started = loop.time()
        handler.cancel()
        await asyncio.wait_for(life.drained(), WITHIN)
        assert cut.is_set()
        assert loop.time() - started >= 0.3 - 0.01
        await asyncio.wait_for(handler, WITHIN)  # ends quietly
        assert recorder.flushes == 1

    asyncio.run(main())


def test_the_drain_ends_at_once_when_nothing_is_open(recorder):
    life = Lifecycle(drain_timeout=30)
    life.begin_drain()
    started = time.monotonic()
    asyncio.run(life.drained())
    assert time.monotonic() - started < 1
    assert recorder.flushes == 1


def test_the_drain_state_is_what_run_reads(monkeypatch):
    monkeypatch.setattr(lifecycle, "process", Lifecycle(drain_timeout=7))

    async def main() -> None:
        signal = lifecycle.drain_signal()
        assert not lifecycle.is_draining() and lifecycle.drain_deadline() is None and not signal.is_set()
        lifecycle.process.begin_drain()
        await asyncio.wait_for(signal.wait(), WITHIN)
        deadline = lifecycle.drain_deadline()
        assert lifecycle.is_draining()
        assert deadline is not None and abs(deadline - (asyncio.get_running_loop().time() + 7)) < 0.5

    asyncio.run(main())


# -- a gateway told to stop --------------------------------------------------


def assert_refused_while_draining(base_url: str, key: str) -> None:
    body = wait_for_readyz(base_url, 503)
    assert body["status"] == "draining"
    assert httpx.get(base_url + "/healthz", timeout=WITHIN).status_code == 200
    for protocol in PROTOCOLS:
        assert_table_e(send(base_url, protocol, key), protocol, UNAVAILABLE)


def assert_finished(stream: InFlight) -> None:
    """A stream that ended within the drain: whole, and billed exactly."""
    stream.wait()
    assert stream.status == 200
    assert TERMINALS[stream.protocol] in stream.body
    assert not stream_errors(stream.body)
    log = RequestLog.objects.get(request_id=stream.request_id)
    assert log.status == "completed"
    assert not log.usage_estimated
    assert log.output_tokens == 12


def assert_interrupted(stream: InFlight, signalled: float) -> None:
    """A stream still open at the deadline: ended then with its protocol's
    interruption event, never a normal terminal event, and recorded."""
    stream.wait()
    assert stream.status == 200
    assert TERMINALS[stream.protocol] not in stream.body
    (error,) = stream_errors(stream.body)
    assert INTERRUPTED in json.dumps(error)
    assert DRAIN_TIMEOUT - 0.5 < stream.ended_at - signalled < DRAIN_TIMEOUT + 3
    log = RequestLog.objects.get(request_id=stream.request_id)
    assert log.status == "interrupted"
    assert log.output_tokens > 0


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_sigterm_drains_the_gateway(world, server):
    gateway = start_under(server, HOPBASE_DRAIN_TIMEOUT=str(DRAIN_TIMEOUT))
    try:
        short = [InFlight(gateway.url, protocol, world.key, tagged(SHORT)) for protocol in PROTOCOLS]
        long = [InFlight(gateway.url, protocol, world.key, tagged(LONG)) for protocol in PROTOCOLS]
        held_tags = {protocol: tagged(LONG) for protocol in ("chat", "messages", "gemini")}
        held = [InFlight(gateway.url, protocol, world.key, prompt, stream=False) for protocol, prompt in held_tags.items()]
        for stream in short + long:
            assert stream.started.wait(WITHIN) and stream.error is None
        for prompt in held_tags.values():
            assert wait_for_records(world.simulator.url, tag_of(prompt), timeout=WITHIN)

        signalled = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        assert_refused_while_draining(gateway.url, world.key)
        assert wait_for_exit(gateway.process) == 0
        assert time.monotonic() - signalled < DRAIN_TIMEOUT + 5

        # The drain flushed the request logs before the process exited.
        for stream in short:
            assert_finished(stream)
        for stream in long:
            assert_interrupted(stream, signalled)
        for answer in held:
            answer.wait()
            assert_table_e(httpx.Response(answer.status, headers=answer.headers, content=answer.body), answer.protocol, UNAVAILABLE)
            assert RequestLog.objects.filter(request_id=answer.request_id).exists()
    finally:
        stop_for_good(gateway)


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_sigterm_with_nothing_in_flight_exits_at_once(world, server):
    gateway = start_under(server, HOPBASE_DRAIN_TIMEOUT="30")
    try:
        assert send(gateway.url, "chat", world.key).status_code == 200
        signalled = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        assert wait_for_exit(gateway.process) == 0
        assert time.monotonic() - signalled < 5
        # The upstream client's aiohttp session was closed, not left to the exit.
        assert "Unclosed client session" not in gateway.log_path.read_text()
    finally:
        stop_for_good(gateway)


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_serve_passes_sigterm_on_and_exits_when_its_workers_have_drained(world, server):
    group = ServeGroup(workers=2, server=server, HOPBASE_DRAIN_TIMEOUT=str(DRAIN_TIMEOUT))
    try:
        assert len(group.workers) == 2
        short = [InFlight(group.url, protocol, world.key, tagged(SHORT)) for protocol in ("chat", "gemini")]
        long = [InFlight(group.url, protocol, world.key, tagged(LONG)) for protocol in ("responses", "messages")]
        for stream in short + long:
            assert stream.started.wait(WITHIN) and stream.error is None

        signalled = time.monotonic()
        group.process.send_signal(signal.SIGTERM)
        assert_refused_while_draining(group.url, world.key)
        assert wait_for_exit(group.process) == 0
        assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text() for pid in group.workers)

        for stream in short:
            assert_finished(stream)
        for stream in long:
            assert_interrupted(stream, signalled)
    finally:
        group.stop()
