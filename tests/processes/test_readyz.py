"""GET /readyz: 200 while the process can serve, 503 while it starts or
drains (the drain in test_drain.py), each dependency's state in the body; a
database or Redis outage keeps it 200, and never makes it slow."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings
from django.db import connection

from bench.tcp_proxy import TcpProxy
from core import lifecycle
from serving import readiness
from serving.readiness import Probe
from tests.support.drain_harness import WITHIN, gateway_env, readyz, start_daphne, stop_for_good
from tests.support.processes import BIN, ROOT, free_port

# A probe is waited for at most a second; a reply within two is not hung.
PROMPT_REPLY = 2.0


# -- the probes -------------------------------------------------------------


def test_a_probe_asks_once_for_a_while():
    calls = []
    probe = Probe(lambda: calls.append(1))

    async def main() -> None:
        assert await probe.up()
        assert await probe.up()

    asyncio.run(main())
    assert calls == [1]


def test_a_failing_probe_says_down():
    def check() -> None:
        raise ConnectionRefusedError

    assert asyncio.run(Probe(check).up()) is False


def test_a_probe_stuck_on_a_silent_host_is_waited_for_once(monkeypatch):
    monkeypatch.setattr(readiness, "PROBE_TIMEOUT", 0.2)
    monkeypatch.setattr(readiness, "FRESH_FOR", 0.0)
    release = threading.Event()
    calls = []

    def hang() -> None:
        calls.append(1)
        release.wait(WITHIN)

    probe = Probe(hang)

    async def main() -> list[float]:
        took = []
        for _ in range(3):
            started = time.monotonic()
            assert await probe.up() is False
            took.append(time.monotonic() - started)
        return took

    try:
        first, *later = asyncio.run(main())
    finally:
        release.set()
    assert 0.15 < first < 1
    assert all(t < 0.1 for t in later)  # still down, not asked again
    assert calls == [1]


class FakeSpool:
    def __init__(self, size: int, full: bool) -> None:
        self.size, self.full = size, full


class FakeRecorder:
    def __init__(self, spool: FakeSpool) -> None:
        self.spool = spool


@pytest.mark.parametrize(
    ("draining", "started", "spool", "status", "code"),
    [
        (False, True, FakeSpool(0, False), "ready", 200),
        (False, False, FakeSpool(0, False), "starting", 503),
        (True, True, FakeSpool(0, False), "draining", 503),
        (False, True, FakeSpool(70_000, True), "spool_full", 503),
    ],
)
def test_the_status_says_whether_the_process_can_serve(monkeypatch, draining, started, spool, status, code):
    life = lifecycle.Lifecycle(drain_timeout=5)
    if draining:
        life.begin_drain()
    monkeypatch.setattr(lifecycle, "process", life)
    monkeypatch.setattr(readiness, "database", Probe(lambda: None))
    monkeypatch.setattr(readiness, "redis_probe", Probe(lambda: None))
    monkeypatch.setattr(readiness, "recorder", FakeRecorder(spool))

    async def is_started() -> bool:
        return started

    monkeypatch.setattr(readiness, "started", is_started)
    got_code, body = asyncio.run(readiness.report())
    assert (got_code, body["status"]) == (code, status)
    assert body["spool_bytes"] == spool.size
    assert body["dependencies"]["database"] == "up"


# -- a gateway's -----------------------------------------------------------


@pytest.mark.gateway
def test_a_serving_gateway_is_ready(gateway):
    status, body = readyz(gateway.url)
    assert status == 200
    assert body["status"] == "ready"
    assert body["dependencies"] == {"database": "up", "redis": "up" if settings.REDIS_URL else "absent"}
    assert body["open_requests"] >= 1  # itself
    assert body["max_open_requests"] >= 1
    assert body["refused"] == {"draining": 0, "full": 0}
    assert body["spool_bytes"] >= 0
    assert httpx.get(gateway.url + "/readyz").headers["cache-control"] == "no-store"


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
def test_a_redis_outage_keeps_it_ready():
    if not settings.REDIS_URL:
        pytest.skip("no Redis in this run")
    with TcpProxy("127.0.0.1", redis_port()) as proxy:
        assert_outage_ridden_out(proxy, "redis", REDIS_URL=f"redis://127.0.0.1:{proxy.port}/{redis_db()}")


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
def test_a_database_outage_keeps_it_ready():
    if connection.vendor != "postgresql":
        pytest.skip("a SQLite database is a file: it has no outage to ride out")
    with TcpProxy("127.0.0.1", int(connection.settings_dict["PORT"] or 5432)) as proxy:
        assert_outage_ridden_out(proxy, "database", DATABASE_URL=database_url_via(proxy.port))


def assert_outage_ridden_out(proxy: TcpProxy, dependency: str, **env: str) -> None:
    """A gateway reaching ``dependency`` through ``proxy`` stays ready while
    it is refused, then silent, then back."""
    gateway = start_daphne(**env)
    try:
        assert_rides_it_out(gateway.url, ready_with(**{dependency: "up"}))
        for go_down in (proxy.refuse, proxy.silence):
            go_down()
            assert_rides_it_out(gateway.url, ready_with(**{dependency: "down"}))
        proxy.restore()
        assert_rides_it_out(gateway.url, ready_with(**{dependency: "up"}))
    finally:
        stop_for_good(gateway)


@pytest.mark.gateway
def test_a_gateway_that_never_reached_its_database_is_starting(tmp_path):
    # A database it cannot open: SQLite in a folder that is not there.
    missing = f"sqlite:///{tmp_path}/missing/hb.sqlite3"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = subprocess.Popen(
        [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "hopbase.asgi:application"],
        cwd=ROOT, env={**gateway_env(DATABASE_URL=missing)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        status, body = first_answer(url, gateway)
        assert status == 503
        assert body["status"] == "starting"
        assert body["dependencies"]["database"] == "down"
    finally:
        gateway.kill()
        gateway.wait()


def ready_with(**states: str) -> dict:
    return {"database": "up", "redis": "up" if settings.REDIS_URL else "absent", **states}


def assert_rides_it_out(base_url: str, dependencies: dict) -> None:
    """/readyz stays 200, answers promptly, and soon shows the change
    (answers are kept for two seconds)."""
    deadline = time.monotonic() + WITHIN
    while True:
        started = time.monotonic()
        status, body = readyz(base_url)
        assert time.monotonic() - started < PROMPT_REPLY
        assert status == 200 and body["status"] == "ready", body
        if body["dependencies"] == dependencies:
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def first_answer(url: str, process: subprocess.Popen) -> tuple[int, dict]:
    deadline = time.monotonic() + WITHIN
    while True:
        assert process.poll() is None, "the gateway exited"
        try:
            return readyz(url)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the gateway never answered"
            time.sleep(0.05)


def redis_port() -> int:
    return urlsplit(settings.REDIS_URL).port or 6379


def redis_db() -> str:
    return urlsplit(settings.REDIS_URL).path.lstrip("/") or "0"


def database_url_via(port: int) -> str:
    db = connection.settings_dict
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{credentials}@127.0.0.1:{port}/{db['NAME']}"
