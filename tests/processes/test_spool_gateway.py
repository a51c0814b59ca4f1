"""No loss on SIGKILL (D2), through real gateway processes: a gateway killed
right after it answered, and while streams are in flight, leaves its
records in its spool; the next gateway on the same host writes them all,
answered requests as they ended and streams as interrupted requests billed
for at least their last progress."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from billing.finished import Finished
from billing.models import RequestLog
from billing.spool import read_segment
from core.usage import estimate_tokens
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.processes import SERVERS, start_gateway
from tests.support.wire import PROTOCOLS, call, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


def gateway_env(spool_dir, **overrides) -> dict[str, str]:
    from django.conf import settings

    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess(), "HOPBASE_SPOOL_DIR": str(spool_dir)}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    return {**env, **overrides}


def kill(service) -> None:
    service.kill()
    service._log.close()


class OpenStream(threading.Thread):
    """A client reading a long stream until the test says stop (or it breaks)."""

    def __init__(self, url: str, protocol: str, key: str) -> None:
        super().__init__(daemon=True)
        self.request = call(protocol, key, "sim-model", "count [sim tokens=400 pace=0.05]", stream=True)
        self.url = url
        self.request_id: str | None = None
        self.received = 0
        self.content_seen = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + self.request.path, json=self.request.body,
                              headers=self.request.headers, timeout=30) as response:
                self.request_id = response.headers["x-hopbase-request-id"]
                for chunk in response.iter_raw():
                    self.received += len(chunk)
                    self.content_seen.set()
        except httpx.HTTPError:
            pass  # the gateway was killed under it


def wait_for_progress(spool_dir, request_ids: list[str], min_chars: int, timeout: float = 15) -> dict[str, Finished]:
    """The streams' latest progress records, once each shows ``min_chars``
    sent (the gateway journals a stream every couple of seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        latest = {item.request_id: item for path in sorted(spool_dir.glob("*.spool")) for item in read_segment(path)}
        if all(rid in latest and latest[rid].sent_chars >= min_chars for rid in request_ids):
            return latest
        assert time.monotonic() < deadline, "no progress journalled"
        time.sleep(0.1)


@pytest.mark.parametrize("server", SERVERS)
def test_answered_requests_survive_a_kill_before_they_reach_the_database(world, tmp_path, server):
    # A long flush interval: the rows are still in the recorder's queue when
    # the process dies.
    first = start_gateway(gateway_env(tmp_path, HOPBASE_LOG_FLUSH_INTERVAL="60"), server)
    request_ids = []
    for protocol in PROTOCOLS:
        request = call(protocol, world.key, "sim-model", "hello [sim tokens=3]", stream=False)
        response = httpx.post(first.url + request.path, json=request.body, headers=request.headers, timeout=30)
        assert response.status_code == 200
        request_ids.append(response.headers["x-hopbase-request-id"])
    kill(first)
    assert not RequestLog.objects.filter(request_id__in=request_ids).exists()
    second = start_gateway(gateway_env(tmp_path))
    try:
        logs = [wait_for_log(request_id, timeout=15) for request_id in request_ids]
        assert all(log is not None for log in logs), logs
        assert {(log.status, log.output_tokens) for log in logs} == {("completed", 3)}
    finally:
        second.stop()
    assert list(tmp_path.glob("*.spool")) == [] or all(p.stat().st_size == 0 for p in tmp_path.glob("*.spool"))


@pytest.mark.parametrize("server", SERVERS)
def test_streams_in_flight_become_interrupted_rows_after_a_kill(world, tmp_path, server):
    first = start_gateway(gateway_env(tmp_path), server)
    streams = [OpenStream(first.url, protocol, world.key) for protocol in PROTOCOLS]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.content_seen.wait(15)
    journalled = wait_for_progress(tmp_path, [stream.request_id for stream in streams], min_chars=40)
    kill(first)
    for stream in streams:
        stream.join(10)
    second = start_gateway(gateway_env(tmp_path))
    try:
        logs = [wait_for_log(stream.request_id, timeout=15) for stream in streams]
        assert all(log is not None for log in logs), logs
        for log in logs:
            assert (log.status, log.error_kind, log.usage_estimated) == ("interrupted", "gateway_died", True)
            # Billed for at least what its last progress record says was sent.
            assert log.output_tokens >= estimate_tokens(journalled[log.request_id].sent_chars) > 0
    finally:
        second.stop()


UNAVAILABLE = {"chat": "server_error", "responses": "server_error", "messages": "api_error", "gemini": "UNAVAILABLE"}


def error_type(protocol: str, body: dict) -> str:
    return body["error"]["status"] if protocol == "gemini" else body["error"]["type"]


def test_a_full_spool_refuses_new_requests_in_the_callers_format(world, tmp_path):
    # Nothing reaches the database for a minute, and the spool holds 2 KiB.
    gateway = start_gateway(gateway_env(tmp_path, HOPBASE_LOG_FLUSH_INTERVAL="60", HOPBASE_SPOOL_MAX_BYTES="2048"))
    try:
        statuses = []
        for _ in range(20):
            request = call("chat", world.key, "sim-model", "hello [sim tokens=2]", stream=False)
            response = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=30)
            statuses.append(response.status_code)
            if response.status_code != 200:
                break
        assert statuses[0] == 200 and statuses[-1] == 503, statuses
        for protocol in PROTOCOLS:
            request = call(protocol, world.key, "sim-model", "hello [sim tokens=2]")
            response = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=30)
            assert response.status_code == 503
            assert int(response.headers["retry-after"]) > 0
            assert error_type(protocol, response.json()) == UNAVAILABLE[protocol]
    finally:
        kill(gateway)  # its records stay in its spool: nothing to wait for
