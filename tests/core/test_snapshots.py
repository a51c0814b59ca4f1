"""The hot path's database reads through an outage (D3): the last value
known is served while the database does not answer, up to
HOPBASE_STALE_MAX_AGE; nothing waits on it longer than the deadline; a
database that failed is left alone for a moment, then probed once at a time."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import OperationalError, connection

from core import dependencies, snapshots
from core.errors import DatabaseUnavailable, ErrorKind
from core.snapshots import Snapshot, database_call


@pytest.fixture(autouse=True)
def database_up():
    dependencies.database.reset()
    yield
    dependencies.database.reset()


@pytest.fixture
def quick(settings, monkeypatch):
    """A short TTL, deadline and pause, so that each step takes milliseconds."""
    settings.HOPBASE_CONFIG_TTL = 0.05
    settings.HOPBASE_STALE_MAX_AGE = 60
    monkeypatch.setattr(snapshots, "DEADLINE", 0.3)
    monkeypatch.setattr(dependencies.database, "pause", 0.2)


class Database:
    """A loader whose database can go down (refusing) or silent (hanging)."""

    def __init__(self, value: object = "v1") -> None:
        self.value = value
        self.state = "up"
        self.calls = 0
        self.threads: set[str] = set()
        self.released = threading.Event()

    def __call__(self) -> object:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.state == "down":
            raise OperationalError("connection refused")
        if self.state == "silent":
            self.released.wait(10)
            raise OperationalError("server closed the connection unexpectedly")
        return self.value


def get(snapshot: Snapshot) -> object:
    return async_to_sync(snapshot.get)()


def test_the_last_value_is_served_while_the_database_is_down(quick, caplog):
    database = Database()
    snapshot = Snapshot(database)

    async def scenario() -> None:
        assert await snapshot.get() == "v1"
        database.state, database.value = "down", "v2"
        await asyncio.sleep(0.06)
        for _ in range(20):
            assert await snapshot.get() == "v1"
        assert not dependencies.database.up
        database.state = "up"
        await asyncio.sleep(0.25)  # the pause
        deadline = time.monotonic() + 2
        while await snapshot.get() != "v2":  # refreshed in the background by the next probe
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert dependencies.database.up
    outage_lines = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(outage_lines) == 1  # once per outage, not per call
    assert "answers again" in caplog.text


def test_a_database_that_failed_is_left_alone_then_probed_once_at_a_time(quick):
    database = Database()
    several = [Snapshot(database) for _ in range(5)]

    async def scenario() -> list[int]:
        for snapshot in several:
            await snapshot.get()
        database.state = "down"
        await asyncio.sleep(0.06)
        calls = [database.calls]
        await several[0].get()  # this one finds the database down
        calls.append(database.calls)
        for _ in range(10):
            for snapshot in several:
                assert await snapshot.get() == "v1"
        calls.append(database.calls)  # nobody asks during the pause
        await asyncio.sleep(0.25)
        for snapshot in several:
            await snapshot.get()
        await asyncio.sleep(0.05)
        calls.append(database.calls)  # one probe, not one per snapshot
        return calls

    before, first, paused, probed = asyncio.run(scenario())
    assert (first, paused, probed) == (before + 1, before + 1, before + 2)


def test_a_silent_database_costs_a_request_the_deadline_at_most(quick):
    database = Database()
    snapshot = Snapshot(database)
    get(snapshot)
    database.state = "silent"
    time.sleep(0.06)
    try:
        started = time.monotonic()
        assert get(snapshot) == "v1"
        assert time.monotonic() - started < 0.6
        started = time.monotonic()
        assert get(snapshot) == "v1"  # known to be down: at once
        assert time.monotonic() - started < 0.05
    finally:
        database.released.set()
    # Loads run on the gateway's own database threads, never the loop's executor.
    assert database.threads and all(name.startswith("hopbase-db") for name in database.threads)


def test_nothing_known_and_no_database_is_a_503_not_an_exception_of_the_database(quick):
    database = Database()
    database.state = "down"
    with pytest.raises(DatabaseUnavailable) as raised:
        get(Snapshot(database))
    assert raised.value.kind is ErrorKind.UNAVAILABLE
    assert raised.value.retry_after and raised.value.retry_after > 0


def test_the_last_value_is_served_up_to_the_stale_max_age(quick, settings):
    settings.HOPBASE_STALE_MAX_AGE = 0.3
    database = Database()
    snapshot = Snapshot(database)
    get(snapshot)
    database.state = "down"
    time.sleep(0.1)
    assert get(snapshot) == "v1"
    time.sleep(0.3)
    with pytest.raises(DatabaseUnavailable):
        get(snapshot)


def test_a_bug_in_a_loader_does_not_count_as_an_outage(quick, caplog):
    answers = iter(["v1", RuntimeError("a bug")])

    def loader():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    snapshot = Snapshot(loader)
    get(snapshot)
    time.sleep(0.06)
    assert get(snapshot) == "v1"
    assert "could not refresh" in caplog.text
    assert dependencies.database.up


def test_stuck_database_threads_are_bounded_and_calls_beyond_them_are_dropped(quick):
    """A database that stopped answering holds at most the pool's threads;
    calls queued behind them give up at the deadline and never run."""
    release = threading.Event()
    ran = []

    def hang():
        ran.append(threading.current_thread().name)
        release.wait(10)

    async def many() -> list[BaseException | None]:
        async def one() -> BaseException | None:
            try:
                await database_call(hang)
            except DatabaseUnavailable as error:
                return error
            return None

        return await asyncio.gather(*(one() for _ in range(snapshots.THREADS * 3)))

    started = time.monotonic()
    try:
        outcomes = asyncio.run(many())
        took = time.monotonic() - started
        stuck = [t for t in threading.enumerate() if t.name.startswith("hopbase-db")]
    finally:
        release.set()
    assert all(isinstance(outcome, DatabaseUnavailable) for outcome in outcomes)
    assert took < 1.0
    assert len(ran) <= snapshots.THREADS and len(stuck) <= snapshots.THREADS


@pytest.mark.django_db
def test_statements_on_the_pool_have_the_deadline_server_side():
    if connection.vendor != "postgresql":
        pytest.skip("statement_timeout is PostgreSQL's")

    def show() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            return cursor.fetchone()[0]

    def show_and_close() -> str:
        try:
            return show()
        finally:
            connection.close()  # the test database is dropped at the end of the run

    assert snapshots.DEADLINE == 2
    assert async_to_sync(database_call)(show_and_close) == "2s"
    assert show() == "0"  # elsewhere (sweeps, exports, migrations) as long as they need


def test_callers_that_find_nothing_loaded_wait_together_for_one_load(quick, monkeypatch):
    monkeypatch.setattr(snapshots, "DEADLINE", 5)  # the slow load below is not an outage
    database = Database()
    loaded = threading.Event()

    def slow_load() -> object:
        loaded.wait(0.1)
        return database()

    snapshot = Snapshot(slow_load)

    async def burst() -> list:
        return await asyncio.gather(*(snapshot.get() for _ in range(100)))

    assert asyncio.run(burst()) == ["v1"] * 100
    assert database.calls == 1
    assert asyncio.run(burst()) == ["v1"] * 100  # loaded: from memory, in another event loop too
    assert database.calls == 1


def test_a_failed_shared_load_fails_every_caller_waiting_on_it(quick):
    database = Database()
    database.state = "down"
    snapshot = Snapshot(database)

    async def burst() -> list:
        return await asyncio.gather(*(snapshot.get() for _ in range(20)), return_exceptions=True)

    outcomes = asyncio.run(burst())
    assert all(isinstance(outcome, DatabaseUnavailable) for outcome in outcomes)
    assert database.calls == 1


def test_while_one_caller_refreshes_a_stale_value_the_others_get_it_at_once_even_in_the_same_pass(quick, monkeypatch):
    monkeypatch.setattr(snapshots, "DEADLINE", 5)  # the slow refresh below is not an outage
    database = Database()
    snapshot = Snapshot(database)
    get(snapshot)
    time.sleep(0.06)  # past the TTL
    database.value = "v2"
    slow = threading.Event()
    loader = snapshot._loader
    snapshot._loader = lambda: (slow.wait(0.3), loader())[1]

    async def burst() -> list[tuple[object, float]]:
        async def timed() -> tuple[object, float]:
            started = time.monotonic()
            return await snapshot.get(), time.monotonic() - started

        return await asyncio.gather(*(timed() for _ in range(10)))

    outcomes = asyncio.run(burst())
    assert outcomes[0][0] == "v2"  # the one that refreshed it
    assert [value for value, _ in outcomes[1:]] == ["v1"] * 9
    assert all(waited < 0.1 for _, waited in outcomes[1:])
