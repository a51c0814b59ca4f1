"""Periodic jobs: each on its own thread, a failure logged and retried at the
next tick, never holding up another job; stopped on demand, closing the
thread's database connections."""

from __future__ import annotations

import threading

import pytest

from core import periodic
from core.periodic import Periodic

WAIT = 10  # every wait is bounded; none should come close


class Counter:
    """A job that counts its runs and sets ``done`` at the ``until``-th."""

    def __init__(self, until: int = 3, fail: bool = False) -> None:
        self.runs = 0
        self.until = until
        self.fail = fail
        self.done = threading.Event()
        self.threads: set[str] = set()

    def __call__(self) -> None:
        self.runs += 1
        self.threads.add(threading.current_thread().name)
        if self.runs >= self.until:
            self.done.set()
        if self.fail:
            raise RuntimeError(f"run {self.runs} failed")


@pytest.fixture
def jobs():
    started: list[Periodic] = []

    def start(*args, **kwargs) -> Periodic:
        job = Periodic(*args, **kwargs).start()
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop(WAIT)


def test_a_failing_job_is_logged_and_runs_again_at_its_next_tick(jobs, caplog):
    failing = Counter(until=3, fail=True)
    jobs("failing", failing, 0.01)
    assert failing.done.wait(WAIT)
    assert "periodic job failing failed" in caplog.text
    assert "RuntimeError: run 1 failed" in caplog.text  # the first failure with its traceback
    assert "failed again" in caplog.text


def test_a_slow_or_failing_job_does_not_hold_up_another(jobs):
    release, entered = threading.Event(), threading.Event()

    def slow() -> None:
        entered.set()
        release.wait(WAIT)

    failing, healthy = Counter(until=3, fail=True), Counter(until=5)
    jobs("slow", slow, 0.01, first_delay=0)
    assert entered.wait(WAIT)
    jobs("failing", failing, 0.01)
    jobs("healthy", healthy, 0.01)
    try:
        assert healthy.done.wait(WAIT)  # while "slow" is still inside its run
        assert failing.done.wait(WAIT)
        assert not release.is_set()
    finally:
        release.set()
    assert healthy.threads == {"hopbase-healthy"}
    assert failing.threads == {"hopbase-failing"}


def test_stop_ends_the_thread_between_runs_and_closes_its_connections(monkeypatch):
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(periodic, "refresh_connection", lambda: calls.append(("refresh", _thread())))
    monkeypatch.setattr(periodic.connections, "close_all", lambda: calls.append(("close", _thread())))
    job = Counter(until=1)
    runner = Periodic("once", job, 3600, first_delay=0).start()
    assert job.done.wait(WAIT)
    assert runner.running
    assert runner.stop(WAIT)  # does not wait out the hour
    assert not runner.running
    assert job.runs == 1
    assert calls == [("refresh", "hopbase-once"), ("close", "hopbase-once")]


def test_stopped_before_its_first_run_it_never_runs_unless_told_to_run_on_stop():
    quiet, final = Counter(until=1), Counter(until=1)
    runners = [Periodic("quiet", quiet, 3600).start(), Periodic("final", final, 3600, run_on_stop=True).start()]
    assert all(runner.stop(WAIT) for runner in runners)
    assert quiet.runs == 0
    assert final.runs == 1


def test_start_is_idempotent_and_stop_without_start_is_harmless():
    assert Periodic("never", Counter(), 3600).stop(WAIT)
    job = Counter(until=1)
    runner = Periodic("twice", job, 3600, first_delay=0)
    assert runner.start() is runner.start()
    assert job.done.wait(WAIT)
    assert [t.name for t in threading.enumerate()].count("hopbase-twice") == 1
    assert runner.stop(WAIT)
    assert job.runs == 1


def _thread() -> str:
    return threading.current_thread().name
