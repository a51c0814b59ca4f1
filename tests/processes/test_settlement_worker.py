"""Settlement (B6) through Celery: the recorder hands each written batch to the
settlement tasks, and a real worker settles them.

The worker tests run the real thing on committed data: a Celery worker process
(solo pool) on the test database and Redis, stopped, killed mid-settlement
and restarted, and a Redis of the test's own that goes away and comes back.
Those tests are marked ``gateway`` so they run with the other integration
tests, after every unit test, and their committed rows surprise no one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from celery import Celery
from django.utils import timezone

from billing.finished import Finished
from billing.models import RequestLog
from billing.recorder import Recorder
from billing.tasks import Publisher, settle_request_logs
from core.usage import Usage
from tests.support.celery_worker import Worker, worker_redis_url
from tests.support.factories import make_key, make_log, unique
from tests.support.processes import free_port
from tests.support.settlement_checks import (
    CHARGE,
    PRICED,
    assert_charged_once,
    balance,
    charges_of,
    funded_tenant,
    priced_model,
    settled_count,
    wait_for,
)


@pytest.mark.django_db
class TestHandOver:
    """The recorder hands each written batch to settlement after commit."""

    def finished(self, key, model: str, status: str = "completed") -> Finished:
        return Finished(
            request_id=unique("req-rec"), created_at=timezone.now(), tenant_id=key.tenant_id, api_key_id=key.pk,
            protocol="chat", status=status, model=model,
            usage=Usage(1000, 200, input_reported=True, output_reported=True),
        )

    def test_it_publishes_the_new_ids_once_committed(self, django_capture_on_commit_callbacks):
        key, _ = make_key(funded_tenant())
        published: list[list[int]] = []
        recorder = Recorder(publish=published.append)
        batch = [self.finished(key, "m1"), self.finished(key, "m2", "rejected")]
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            recorder._write(batch)
        assert len(callbacks) == 1
        ids = set(RequestLog.objects.filter(request_id__in=[f.request_id for f in batch]).values_list("pk", flat=True))
        assert [set(p) for p in published] == [ids]

    def test_in_eager_mode_the_recorder_settles_as_it_writes(self, django_capture_on_commit_callbacks):
        key, _ = make_key(funded_tenant())
        model = priced_model()
        recorder = Recorder(publish=Publisher(send=lambda ids: settle_request_logs.apply(args=(ids,))).publish)
        with django_capture_on_commit_callbacks(execute=True):
            recorder._write([self.finished(key, model)])
        assert balance(key.tenant) == Decimal("10") - CHARGE

    def test_publishing_failures_are_swallowed_and_pause_publishing(self, caplog):
        calls: list[list[int]] = []

        def broker_down(ids: list[int]) -> None:
            calls.append(ids)
            raise ConnectionError("broker down")

        publisher = Publisher(send=broker_down, pause=60)
        assert publisher.publish([3, 1, 1]) is False
        assert publisher.publish([4]) is False  # paused: not even tried
        assert calls == [[1, 3]]
        assert "the sweep will settle them" in caplog.text

    def test_publishing_resumes_after_the_pause(self):
        outcomes = iter([ConnectionError("down"), None])
        sent: list[list[int]] = []

        def flaky(ids: list[int]) -> None:
            error = next(outcomes)
            if error:
                raise error
            sent.append(ids)

        publisher = Publisher(send=flaky, pause=0.000001)
        assert publisher.publish([1]) is False
        time.sleep(0.001)
        assert publisher.publish([2]) is True and sent == [[2]]

    def test_an_empty_batch_publishes_nothing(self):
        publisher = Publisher(send=lambda ids: pytest.fail("sent"))
        assert publisher.publish([]) is True


class Producer:
    """What the gateway does, from the test process: send tasks by name to
    the worker's queue on the worker's broker, with the gateway's short
    broker timeouts (the project's Celery app stays untouched)."""

    def __init__(self, broker: str, queue: str) -> None:
        self.queue = queue
        self.app = Celery("hopbase-test-producer", set_as_current=False)
        self.app.config_from_object("django.conf:settings", namespace="CELERY")
        self.app.conf.update(broker_url=broker, task_always_eager=False)

    def send(self, name: str, *args, retry: bool = False, **kwargs) -> None:
        self.app.send_task(f"billing.tasks.{name}", args=args, kwargs=kwargs, queue=self.queue, retry=retry)

    def publish_batch(self, ids: list[int]) -> None:
        self.send("settle_request_logs", ids)

    def waiting(self) -> int:
        """Messages in the queue, not yet taken by a worker."""
        with self.app.connection_for_write() as connection:
            return connection.default_channel.client.llen(self.queue)

    def close(self) -> None:
        self.app.close()


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(broker: str, queue: str, **env: str) -> Worker:
        worker = Worker(broker, queue, env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def queue_name() -> str:
    return f"hopbase-test-settle-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def producer(queue_name) -> Iterator[Producer]:
    producer = Producer(worker_redis_url(), queue_name)
    yield producer
    producer.close()


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_stopped_worker_leaves_logs_unsettled_and_a_running_one_charges_each_once(workers, producer, queue_name):
    tenant, model = funded_tenant(), priced_model()
    ids = [make_log(tenant, model=model, **PRICED).pk for _ in range(20)]
    # As the recorder does, one message per batch; and, as a redelivery or a
    # second publisher would, every log again on its own.
    producer.publish_batch(ids)
    for log_id in ids:
        producer.send("settle_request_log", log_id)
    assert producer.waiting() == 1 + len(ids)
    assert settled_count(ids) == 0 and charges_of(ids) == 0  # no worker, no settlement

    worker = workers(worker_redis_url(), queue_name)
    wait_for(lambda: settled_count(ids) == len(ids), what="the worker to settle the logs")
    # The duplicate messages are consumed too; they must find nothing to do.
    wait_for(lambda: worker.output().count(" succeeded in ") == 1 + len(ids), what="every message to be consumed")
    assert producer.waiting() == 0
    assert_charged_once(tenant, ids)


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_worker_killed_inside_settlement_loses_nothing_and_doubles_nothing(workers, producer, queue_name):
    tenant, model = funded_tenant(), priced_model()
    crashing = workers(worker_redis_url(), queue_name, HOPBASE_TEST_CRASH_AT="after_charge")
    ids = [make_log(tenant, model=model, **PRICED).pk for _ in range(3)]
    producer.publish_batch(ids)
    wait_for(lambda: crashing.process.poll() is not None, what="the worker to kill itself")
    assert crashing.process.returncode == -signal.SIGKILL
    # It died after posting the first charge, before commit: nothing remains.
    assert settled_count(ids) == 0 and charges_of(ids) == 0
    assert balance(tenant) == Decimal("10")

    # acks_late leaves the message unacknowledged until the broker's
    # visibility timeout (an hour); the sweep does not wait for it.
    restarted = workers(worker_redis_url(), queue_name)
    producer.send("sweep_unsettled", older_than=0)
    wait_for(lambda: settled_count(ids) == len(ids), what="the sweep to settle the logs")
    # The late redelivery, when it comes, finds them settled; so do more sweeps.
    producer.publish_batch(ids)
    producer.send("sweep_unsettled", older_than=0)
    producer.send("settle_request_log", ids[0])
    wait_for(lambda: restarted.output().count(" succeeded in ") == 4, what="every message to be consumed")
    assert_charged_once(tenant, ids)


class OwnRedis:
    """A Redis of this test's own, so it can be stopped and started again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for(self.answers, 10, "redis-server to start")

    def answers(self) -> bool:
        import redis

        try:
            return redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    if not Path("/usr/bin/redis-server").exists() and not any(
        (Path(d) / "redis-server").exists() for d in os.environ.get("PATH", "").split(os.pathsep)
    ):
        pytest.skip("redis-server is not installed")
    server = OwnRedis()
    server.start()
    yield server
    server.stop()


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_with_the_broker_down_recording_does_not_block_and_the_sweep_catches_up(workers, own_redis, queue_name):
    tenant, model = funded_tenant(), priced_model()
    key, _ = make_key(tenant)
    workers(own_redis.url, queue_name)
    producer = Producer(own_redis.url, queue_name)
    recorder = Recorder(publish=Publisher(send=producer.publish_batch).publish)
    try:
        own_redis.stop()
        items = [
            Finished(
                request_id=unique("req-down"), created_at=timezone.now(), tenant_id=tenant.pk, api_key_id=key.pk,
                protocol="chat", status="completed", model=model,
                usage=Usage(1000, 200, input_reported=True, output_reported=True),
            )
            for _ in range(5)
        ]
        started = time.monotonic()
        for item in items:
            recorder.record(item)
        record_seconds = time.monotonic() - started
        assert recorder.flush(10)
        write_and_publish_seconds = time.monotonic() - started
        assert record_seconds < 0.1
        # The log rows are written and the failed publish gave up at once.
        assert write_and_publish_seconds < 3
        ids = list(RequestLog.objects.filter(request_id__in=[i.request_id for i in items]).values_list("pk", flat=True))
        assert len(ids) == 5 and settled_count(ids) == 0

        own_redis.start()  # empty: whatever was queued before is gone
        producer.send("sweep_unsettled", older_than=0, retry=True)  # as beat would
        wait_for(lambda: settled_count(ids) == len(ids), what="the sweep to settle the logs")
        assert_charged_once(tenant, ids)
    finally:
        recorder.stop()
        producer.close()
