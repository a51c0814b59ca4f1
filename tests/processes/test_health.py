"""Channel health: the circuit breaker (closed / open / half-open) and what
operators see of it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import httpx
import pytest

from channels_pool import jobs
from channels_pool.health import HealthBoard
from channels_pool.jobs import HEALTH_INTERVAL, HealthWriter, health_writer
from channels_pool.models import ChannelHealth
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.factories import make_channel
from tests.support.processes import start_gateway
from tests.support.wire import call, wait_for_log, wait_for_records


@dataclass(frozen=True)
class Fake:
    id: int


A, B, C = Fake(1), Fake(2), Fake(3)


@pytest.fixture
def quick_breaker(settings):
    settings.HOPBASE_BREAKER_FAILURES = 2
    settings.HOPBASE_BREAKER_COOLDOWN = 0.2
    settings.HOPBASE_BREAKER_MAX_COOLDOWN = 0.3


@pytest.mark.usefixtures("quick_breaker")
class TestBreaker:
    def test_it_keeps_order_while_channels_are_healthy(self):
        board = HealthBoard()
        board.failed(A.id, "http_500")
        assert board.arrange([A, B, C]) == [A, B, C]

    def test_failures_in_a_row_open_the_breaker_and_push_the_channel_last(self):
        board = HealthBoard()
        board.failed(A.id, "http_500")
        board.failed(A.id, "http_500")
        assert board.arrange([A, B, C]) == [B, C, A]
        (snap,) = board.changes()
        assert (snap.state, snap.failures, snap.last_error_kind) == ("open", 2, "http_500")

    def test_a_success_in_between_resets_the_count(self):
        board = HealthBoard()
        board.failed(A.id, "http_500")
        board.succeeded(A.id, 120)
        board.failed(A.id, "http_500")
        assert board.arrange([A, B]) == [A, B]

    def test_after_the_cooldown_one_trial_is_allowed(self):
        board = HealthBoard()
        board.failed(A.id, "timeout")
        board.failed(A.id, "timeout")
        time.sleep(0.25)  # the cool-down itself is what is tested
        assert board.arrange([A, B]) == [A, B]
        board.started(A.id)
        assert board.arrange([A, B]) == [B, A]  # only one trial at a time
        board.succeeded(A.id, 80)
        assert board.arrange([A, B]) == [A, B]
        assert board.changes()[0].state == "closed"

    def test_a_failed_trial_opens_it_again_for_longer(self):
        board = HealthBoard()
        board.failed(A.id, "timeout")
        board.failed(A.id, "timeout")
        first = board._breakers[A.id].cooldown
        time.sleep(0.25)
        board.arrange([A])
        board.started(A.id)
        board.failed(A.id, "timeout")
        assert board._breakers[A.id].state == "open"
        assert board._breakers[A.id].cooldown > first

    def test_it_reports_recent_success_rate_and_median_ttft(self):
        board = HealthBoard()
        for ttft in (100, 300, 200):
            board.succeeded(A.id, ttft)
        board.failed(A.id, "cut")
        (snap,) = board.changes()
        assert (snap.recent_success_pct, snap.median_ttft_ms) == (75, 200)
        assert board.changes() == []  # nothing new since


@pytest.mark.django_db
@pytest.mark.usefixtures("quick_breaker")
class TestHealthWriter:
    def test_it_writes_what_changed_and_nothing_when_nothing_did(self, django_assert_num_queries):
        board, channel = HealthBoard(), make_channel()
        write = HealthWriter(board)
        board.failed(channel.pk, "http_500")
        board.failed(channel.pk, "http_500")
        board.failed(10**9, "http_500")  # a channel deleted meanwhile: skipped
        assert write() == 2
        health = ChannelHealth.objects.get(channel_id=channel.pk)
        assert (health.state, health.failures, health.last_error_kind) == ("open", 2, "http_500")
        with django_assert_num_queries(0):
            assert write() == 0

    def test_what_a_failed_write_could_not_store_is_written_at_the_next_tick(self, monkeypatch):
        board, channel = HealthBoard(), make_channel()
        write = HealthWriter(board)
        board.failed(channel.pk, "http_500")

        def database_down(snapshots):
            raise RuntimeError("database down")

        with monkeypatch.context() as patched:
            patched.setattr(jobs, "persist", database_down)
            with pytest.raises(RuntimeError):
                write()
        assert not ChannelHealth.objects.filter(channel_id=channel.pk).exists()
        assert write() == 1  # no new change on the board: the kept snapshot
        assert ChannelHealth.objects.get(channel_id=channel.pk).failures == 1
        board.succeeded(channel.pk, 90)
        assert write() == 1
        assert ChannelHealth.objects.get(channel_id=channel.pk).successes == 1

    def test_the_job_runs_about_every_second_and_writes_once_more_on_stop(self):
        job = health_writer(HealthBoard())
        assert (job.name, job._interval, job._run_on_stop) == ("channel-health", HEALTH_INTERVAL, True)
        assert 1 <= HEALTH_INTERVAL <= 2
        assert not job.running


@pytest.fixture(scope="module")
def breaker_gateway(world):
    env = {
        **GATEWAY_TIMERS,
        "DATABASE_URL": database_url_for_subprocess(),
        "HOPBASE_BREAKER_FAILURES": "2",
        "HOPBASE_BREAKER_COOLDOWN": "1",
    }
    service = start_gateway(env)
    yield service
    service.stop()


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_failing_channel_is_skipped_then_retried_after_its_cooldown(breaker_gateway, world):
    def ask() -> tuple[str, int]:
        tag = uuid.uuid4().hex[:10]
        request = call("messages", world.key, "failover-busy", f"hi [sim tag={tag} tokens=2]")
        response = httpx.post(breaker_gateway.url + request.path, json=request.body, headers=request.headers)
        assert response.status_code == 200
        return tag, wait_for_log(response.headers["x-hopbase-request-id"]).attempts

    assert [ask()[1] for _ in range(2)] == [2, 2]
    tag, attempts = ask()
    assert attempts == 1  # the bad channel is open: straight to the good one
    assert [r["api_key"] for r in wait_for_records(world.simulator.url, tag)] == ["sk-upstream-secret"]
    bad = world.channels["anthropic-failover-busy-bad"]
    deadline = time.monotonic() + 5
    while not ChannelHealth.objects.filter(channel_id=bad, state="open").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    health = ChannelHealth.objects.get(channel_id=bad)
    assert (health.state, health.last_error_kind) == ("open", "http_529")
    time.sleep(1.1)  # the cool-down itself is what is tested
    tag, attempts = ask()
    assert attempts == 2  # half-open: tried again, failed, then the good one


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_channel_that_rightly_refuses_a_bad_request_is_not_marked_failing(gateway, world):
    request = call("chat", world.key, "bad-request", "hi")
    refused = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers)
    assert refused.status_code == 400
    # Health is written every second from one thread, all changes so far at
    # once: once a later request's success shows in health, the refusal's
    # effect would too.
    good = world.channels["openai-failover-http-good"]
    before = ChannelHealth.objects.filter(channel_id=good).values_list("successes", flat=True).first() or 0
    later = call("chat", world.key, "failover-http", "hi")
    assert httpx.post(gateway.url + later.path, json=later.body, headers=later.headers).status_code == 200
    deadline = time.monotonic() + 5
    while not ChannelHealth.objects.filter(channel_id=good, successes__gt=before).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    strict = world.channels["openai-bad-request-strict"]
    assert not ChannelHealth.objects.filter(channel_id=strict, failures__gt=0).exists()
