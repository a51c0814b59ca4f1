"""The gateway's background jobs: started once per process by the first API
request, never by merely importing the gateway."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import async_to_sync

from serving import background

WAIT = 10


class FakeJob:
    def __init__(self, name: str) -> None:
        self.name = name
        self.started = threading.Event()
        self.stopped = threading.Event()

    def start(self) -> FakeJob:
        assert not self.started.is_set(), "started twice"
        self.started.set()
        return self

    def request_stop(self) -> None:
        self.stopped.set()

    def stop(self, timeout: float = 10) -> bool:
        self.stopped.set()
        return True

    @property
    def running(self) -> bool:
        return self.started.is_set() and not self.stopped.is_set()


@pytest.fixture
def fake_jobs(monkeypatch):
    made: list[FakeJob] = []

    def factory(name: str | None):
        def make() -> FakeJob | None:
            if name is None:
                return None  # e.g. the sweep with REDIS_URL set
            made.append(FakeJob(name))
            return made[-1]

        return make

    background.stop(WAIT)
    monkeypatch.setattr(background, "JOBS", (factory("a"), factory(None), factory("b")))
    yield made
    background.stop(WAIT)


def test_nothing_runs_until_the_first_request():
    assert background.running() == []


def test_ensure_started_starts_each_job_once_even_from_several_threads(fake_jobs):
    threads = [threading.Thread(target=background.ensure_started) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    background.ensure_started()
    assert [job.name for job in fake_jobs] == ["a", "b"]
    assert background.running() == ["a", "b"]
    background.stop(WAIT)
    assert all(job.stopped.is_set() for job in fake_jobs)
    assert background.running() == []


def test_the_real_jobs_are_the_gateways(settings):
    def names() -> list[str]:
        jobs = [make() for make in background.JOBS]
        return [job.name for job in jobs if job is not None]

    settings.REDIS_URL = None
    assert names() == ["channel-health", "provider-state", "api-key-last-used", "settlement-sweep", "spool-replay"]
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    # Beat sweeps; revocations come through Redis.
    assert names() == ["channel-health", "provider-state", "api-key-last-used", "spool-replay", "key-revocations"]


def test_an_api_request_starts_them(fake_jobs):
    from serving import handler

    async def client_gone() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        raise AssertionError("nothing is sent to a client that left")

    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": [], "query_string": b""}
    async def served() -> None:
        await handler.api(scope, client_gone, send)  # what Daphne awaits

    async_to_sync(served)()
    assert background.running() == ["a", "b"]
