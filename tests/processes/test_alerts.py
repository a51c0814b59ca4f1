"""Budget alerts (G4, billing.budgets.alerts and billing.tasks.deliver_budget_alert)
against a real webhook receiver: a threaded HTTP server on 127.0.0.1 that
records what it is sent and answers as each test scripts it (a 500 first,
or taking the request and answering after the client's deadline).

Three kinds of test:
- one step at a time in the test's own transaction (the body, the
  signature, one attempt and what it records);
- the hand-off (raise_alert and the dispatcher thread), without a database;
- the whole path, raise_alert to delivery, on the dispatcher thread, which
  needs the rows committed (marked ``gateway``: they run after the unit
  tests, as every test of committed rows does), and once with a real Celery
  worker retrying with its countdown.

Celery runs eagerly here whatever REDIS_URL says (the dispatcher's ``send``
is ``task.apply``), so retries are the dispatcher's, with a backoff of a few
hundredths of a second (HOPBASE_WEBHOOK_RETRY_BASE).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from celery import Celery
from django.db import connections
from django.utils import timezone

from billing.budgets import alerts
from billing.budgets.alerts import (
    AlertDispatcher,
    Delivery,
    attempt_delivery,
    deliver_budget_alert,
    raise_alert,
    record_alert,
    retry_delay,
)
from billing.budgets.windows import window_at
from billing.models import AlertType, Budget, BudgetAlert, WebhookAttempt
from tenants.models import ApiKey, Tenant
from tests.support.celery_worker import Worker, worker_redis_url
from tests.support.factories import make_key, make_tenant, unique

SECRET = "whsec-test-9f1c2e7a"
FIELDS = ["id", "type", "created_at", "tenant", "key_prefix", "period", "window_start", "window_end",
          "limit_usd", "spent_usd"]
NOW = datetime(2026, 12, 5, 21, 17, 3, 250000, tzinfo=UTC)
WAIT = 10.0  # the longest any test waits for anything


@dataclass(frozen=True)
class Received:
    body: bytes
    headers: dict[str, str]


class Receiver:
    """A webhook receiver. ``script`` answers the first requests in order: a
    status code, or ``"slow"`` (take the request whole, then answer 200 only
    once released, past the client's deadline); 200 after that."""

    def __init__(self, *script: int | str) -> None:
        self.script = list(script)
        self.received: list[Received] = []
        self.changed = threading.Condition()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.changed:
                    receiver.received.append(Received(body, {k.lower(): v for k, v in self.headers.items()}))
                    answer = receiver.script.pop(0) if receiver.script else 200
                    receiver.changed.notify_all()
                if answer == "slow":
                    receiver.release.wait(WAIT)  # the client has given up long before
                    answer = 200
                try:
                    self.send_response(int(answer))
                    if 300 <= int(answer) < 400:
                        self.send_header("location", receiver.url + "moved")
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client went away

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/"
        # Polled every 0.05 s for shutdown (the default half second would slow every test's teardown).
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="test-receiver",
                                       daemon=True)
        self.thread.start()

    def wait_for(self, count: int, timeout: float = WAIT) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.received) >= count, timeout)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*script: int | str) -> Receiver:
        made.append(Receiver(*script))
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture(autouse=True)
def quick_retries(settings):
    settings.HOPBASE_WEBHOOK_RETRY_BASE = 0.05
    settings.HOPBASE_WEBHOOK_TIMEOUT = 2


def run_here(args: alerts.AlertArgs) -> None:
    """Publishing as in eager mode, whatever REDIS_URL says: the task runs on the dispatcher thread."""
    deliver_budget_alert.apply(args=args, throw=True)


@pytest.fixture
def alert_thread(monkeypatch) -> Iterator[AlertDispatcher]:
    """raise_alert's dispatcher, for this test only."""
    thread = AlertDispatcher(send=run_here)
    monkeypatch.setattr(alerts, "dispatcher", thread)
    yield thread
    assert thread.stop(WAIT)


def make_budget(url: str = "", *, key: bool = False, period: str = "1d", limit: str = "12.5",
                secret: str = SECRET) -> Budget:
    tenant = make_tenant(unique("alerts"))  # the name leaves_nothing looks for
    api_key = make_key(tenant, label="ci")[0] if key else None
    return Budget.objects.create(tenant=tenant, api_key=api_key, period=period, limit_usd=Decimal(limit),
                                 alert_at_pct=80, webhook_url=url, webhook_secret=secret if url else "")


def signed(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def answers(alert: BudgetAlert) -> list[tuple[int | None, str]]:
    return list(alert.attempts.order_by("attempted_at", "id").values_list("status_code", "error"))


# One step at a time, in the test's transaction


@pytest.mark.django_db
class TestTheEvent:
    def test_the_body_has_exactly_g4s_fields_with_exact_decimals(self):
        budget = make_budget("http://127.0.0.1:9/", key=True)
        window = window_at("1d", NOW)
        alert = record_alert(budget.pk, AlertType.THRESHOLD, window, Decimal("10.0000000001"))
        event = json.loads(alert.body)
        assert list(event) == FIELDS
        assert event == {
            "id": str(alert.pk), "type": "budget.threshold", "created_at": event["created_at"],
            "tenant": budget.tenant.name, "key_prefix": budget.api_key.prefix, "period": "1d",
            "window_start": "2026-12-05T00:00:00.000000Z", "window_end": "2026-12-06T00:00:00.000000Z",
            "limit_usd": "12.50", "spent_usd": "10.0000000001",
        }
        assert event["created_at"] == alert.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        alert.refresh_from_db()
        assert event["created_at"] == alert.created_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # as stored
        assert alert.budget_id == budget.pk and alert.type == AlertType.THRESHOLD
        assert alert.window_start == window.start and alert.delivered_at is None
        assert alert.body.isascii()  # its text is its bytes

    def test_a_tenant_budget_has_no_key_prefix_and_a_total_one_no_window_end(self):
        budget = make_budget(period="total", limit="100")
        alert = record_alert(budget.pk, AlertType.EXHAUSTED, window_at("total", NOW), Decimal("100.00"))
        event = json.loads(alert.body)
        assert event["key_prefix"] is None and event["window_end"] is None
        assert event["window_start"] == "1970-01-01T00:00:00.000000Z"
        assert (event["type"], event["limit_usd"], event["spent_usd"]) == ("budget.exhausted", "100.00", "100.00")

    def test_one_alert_per_budget_type_and_window_its_body_written_once(self):
        budget = make_budget()
        window = window_at("30s", NOW)
        first = record_alert(budget.pk, AlertType.THRESHOLD, window, Decimal("8"))
        again = record_alert(budget.pk, AlertType.THRESHOLD, window, Decimal("9.5"))
        assert (again.pk, again.body) == (first.pk, first.body)
        exhausted = record_alert(budget.pk, AlertType.EXHAUSTED, window, Decimal("10"))
        later = record_alert(budget.pk, AlertType.THRESHOLD, window_at("30s", NOW + timedelta(seconds=30)),
                             Decimal("8"))
        assert len({first.pk, exhausted.pk, later.pk}) == 3
        assert BudgetAlert.objects.filter(budget=budget).count() == 3

    def test_a_deleted_budget_has_no_alert(self):
        assert record_alert(0, AlertType.THRESHOLD, window_at("1h", NOW), Decimal("1")) is None

    def test_retries_wait_longer_each_time_up_to_ten_minutes(self, settings):
        settings.HOPBASE_WEBHOOK_RETRY_BASE = 5
        assert [retry_delay(n) for n in range(9)] == [5, 10, 20, 40, 80, 160, 320, 600, 600]
        assert retry_delay(10_000) == 600


@pytest.mark.django_db
class TestOneAttempt:
    def alert(self, url: str, **budget) -> BudgetAlert:
        return record_alert(make_budget(url, **budget).pk, AlertType.THRESHOLD, window_at("1d", NOW),
                            Decimal("10.5"))

    def test_the_signature_verifies_with_the_budgets_secret(self, receiver):
        hooks = receiver()
        alert = self.alert(hooks.url)
        assert attempt_delivery(alert.pk) is Delivery.DELIVERED
        [got] = hooks.received
        assert got.body == alert.body.encode()
        assert hmac.compare_digest(got.headers["x-hopbase-signature"], signed(got.body))
        assert got.headers["x-hopbase-signature"] != signed(got.body, "another secret")
        assert got.headers["content-type"] == "application/json"
        alert.refresh_from_db()
        assert alert.delivered_at is not None and answers(alert) == [(200, "")]

    def test_a_500_is_recorded_then_delivered_and_never_posted_again(self, receiver):
        hooks = receiver(500)
        alert = self.alert(hooks.url)
        assert attempt_delivery(alert.pk) is Delivery.FAILED
        assert attempt_delivery(alert.pk) is Delivery.DELIVERED
        assert attempt_delivery(alert.pk) is Delivery.ALREADY_DELIVERED
        assert len(hooks.received) == 2 and answers(alert) == [(500, ""), (200, "")]

    def test_an_answer_past_the_deadline_fails_though_received_and_the_retry_is_the_same_event(
            self, receiver, settings):
        settings.HOPBASE_WEBHOOK_TIMEOUT = 0.3
        hooks = receiver("slow")
        alert = self.alert(hooks.url)
        assert attempt_delivery(alert.pk) is Delivery.FAILED
        assert attempt_delivery(alert.pk) is Delivery.DELIVERED
        first, retry = hooks.received
        assert first.body == retry.body == alert.body.encode()
        assert json.loads(first.body)["id"] == json.loads(retry.body)["id"] == str(alert.pk)
        assert first.headers["x-hopbase-signature"] == retry.headers["x-hopbase-signature"]
        (status, error), delivered = answers(alert)
        assert status is None and error.startswith("TimeoutError") and delivered == (200, "")

    def test_no_webhook_records_the_alert_and_posts_nothing(self):
        alert = self.alert("")
        assert attempt_delivery(alert.pk) is Delivery.NO_WEBHOOK
        assert answers(alert) == [] and BudgetAlert.objects.filter(pk=alert.pk).exists()

    def test_an_unreachable_receiver_is_an_error_that_names_no_secret(self, receiver):
        closed = receiver()
        url = closed.url
        closed.close()
        alert = self.alert(url)
        assert attempt_delivery(alert.pk) is Delivery.FAILED
        [(status, error)] = answers(alert)
        assert status is None and error.startswith("ConnectError") and SECRET not in error

    def test_a_redirect_is_not_followed(self, receiver):
        hooks = receiver(302)
        alert = self.alert(hooks.url)
        assert attempt_delivery(alert.pk) is Delivery.FAILED
        assert len(hooks.received) == 1 and answers(alert) == [(302, "")]

    def test_without_a_secret_nothing_unsigned_is_posted(self, receiver):
        hooks = receiver()
        alert = self.alert(hooks.url, secret="")
        assert attempt_delivery(alert.pk) is Delivery.FAILED
        assert hooks.received == [] and answers(alert) == [(None, alerts.NO_SECRET)]

    def test_an_attempt_in_flight_elsewhere_is_left_to_it_and_a_dead_one_is_taken_over(self, receiver):
        hooks = receiver()
        alert = self.alert(hooks.url)
        flying = WebhookAttempt.objects.create(alert=alert)  # another process, posting now
        assert attempt_delivery(alert.pk) is Delivery.IN_FLIGHT and hooks.received == []
        # That process died: past its lease, the attempt is marked and the alert posted.
        WebhookAttempt.objects.filter(pk=flying.pk).update(attempted_at=timezone.now() - timedelta(minutes=5))
        assert attempt_delivery(alert.pk) is Delivery.DELIVERED
        assert answers(alert) == [(None, alerts.ABANDONED), (200, "")] and len(hooks.received) == 1


# The hand-off, without a database


def args_of(budget_id: int = 1) -> alerts.AlertArgs:
    window = window_at("1h", NOW)
    return (budget_id, "budget.threshold", window.start.isoformat(), window.end.isoformat(), "1.5")


class TestHandOff:
    def test_raise_alert_returns_at_once_while_publishing_blocks(self, monkeypatch):
        stuck = threading.Event()
        published: list[alerts.AlertArgs] = []
        thread = AlertDispatcher(send=lambda args: (stuck.wait(WAIT), published.append(args)))
        monkeypatch.setattr(alerts, "dispatcher", thread)
        window = window_at("1h", NOW)
        started = time.perf_counter()
        for budget_id in (1, 2, 3):
            assert raise_alert(budget_id, AlertType.THRESHOLD, window, Decimal("1.5")) is None
        assert time.perf_counter() - started < 0.1
        stuck.set()
        assert thread.wait_idle(WAIT) and [args[0] for args in published] == [1, 2, 3]
        assert published[0] == args_of(1)
        assert thread.stop(WAIT)

    def test_raise_alert_never_raises(self, monkeypatch, caplog):
        def broken(args: alerts.AlertArgs) -> bool:
            raise RuntimeError("queue broken")

        monkeypatch.setattr(alerts.dispatcher, "publish", broken)
        assert raise_alert(1, AlertType.EXHAUSTED, window_at("1h", NOW), Decimal("2")) is None
        assert raise_alert(1, "not.a.type", window_at("1h", NOW), Decimal("2")) is None  # type: ignore[arg-type]
        assert raise_alert(1, AlertType.EXHAUSTED, window_at("1h", NOW), 2.0) is None  # type: ignore[arg-type]
        assert caplog.text.count("dropped") == 3 and "money is a Decimal" in caplog.text

    def test_raise_alert_from_a_request_task_being_cancelled_returns_at_once(self, monkeypatch):
        published: list[alerts.AlertArgs] = []
        thread = AlertDispatcher(send=published.append)
        monkeypatch.setattr(alerts, "dispatcher", thread)
        took: list[float] = []

        async def request() -> None:
            try:
                await asyncio.Event().wait()
            finally:  # where the gateway's end-of-request code runs on cancellation
                started = time.perf_counter()
                raise_alert(7, AlertType.EXHAUSTED, window_at("1h", NOW), Decimal("3"))
                took.append(time.perf_counter() - started)

        async def main() -> None:
            task = asyncio.create_task(request())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert took[0] < 0.05
        assert thread.wait_idle(WAIT) and [args[0] for args in published] == [7]
        assert thread.stop(WAIT)

    def test_an_unreachable_broker_costs_the_caller_nothing_and_is_tried_again(self, monkeypatch, caplog):
        # The gateway's Celery settings (short broker timeouts), a broker nobody listens on.
        bogus = Celery("hopbase-test-bogus-broker", set_as_current=False)
        bogus.config_from_object("django.conf:settings", namespace="CELERY")
        bogus.conf.update(broker_url="redis://127.0.0.1:1/0", task_always_eager=False)
        tried = threading.Semaphore(0)

        def send(args: alerts.AlertArgs) -> None:
            tried.release()
            bogus.send_task("billing.tasks.deliver_budget_alert", args=args, retry=False)

        thread = AlertDispatcher(send=send)
        monkeypatch.setattr(alerts, "dispatcher", thread)
        started = time.perf_counter()
        raise_alert(1, AlertType.THRESHOLD, window_at("1h", NOW), Decimal("1.5"))
        assert time.perf_counter() - started < 0.05
        assert tried.acquire(timeout=WAIT) and tried.acquire(timeout=WAIT)  # a second publish, after the backoff
        assert thread.stop(WAIT)
        bogus.close()
        assert "could not publish budget alert budget.threshold of budget 1" in caplog.text

    def test_a_publish_that_keeps_failing_is_given_up(self, settings, caplog):
        settings.HOPBASE_WEBHOOK_MAX_RETRIES = 2
        calls: list[alerts.AlertArgs] = []

        def down(args: alerts.AlertArgs) -> None:
            calls.append(args)
            raise ConnectionError("broker down")

        thread = AlertDispatcher(send=down)
        thread.publish(args_of())
        assert thread.wait_idle(WAIT) and len(calls) == 3
        assert "lost: could not be published" in caplog.text
        assert thread.stop(WAIT)

    def test_jobs_run_when_due_in_that_order(self):
        ran: list[str] = []
        thread = AlertDispatcher()
        thread.later(0.2, lambda: ran.append("late"))
        thread.later(0.0, lambda: ran.append("now"))
        thread.later(0.0, lambda: ran.append("next"))
        assert thread.wait_idle(WAIT) and ran == ["now", "next", "late"]
        assert thread.stop(WAIT) and not thread.later(0, lambda: ran.append("after stop"))


# The whole path, on committed rows (the dispatcher thread has its own connection)


def raise_for(budget: Budget, window=None, alert_type: AlertType = AlertType.THRESHOLD,
              spent: str = "10.25") -> None:
    raise_alert(budget.pk, alert_type, window or window_at("1d", timezone.now()), Decimal(spent))


def alerts_of(budget: Budget) -> list[BudgetAlert]:
    return list(BudgetAlert.objects.filter(budget=budget).order_by("created_at", "window_start"))


@pytest.fixture
def leaves_nothing() -> Iterator[None]:
    """The committed rows of a test deleted after it, so that no later test
    of committed rows (a list of every budget, say) meets them."""
    yield
    tenants = Tenant.objects.filter(name__startswith="alerts-")
    Budget.objects.filter(tenant__in=tenants).delete()  # their alerts and attempts with them
    ApiKey.objects.filter(tenant__in=tenants).delete()
    tenants.delete()


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db", "leaves_nothing")
class TestDelivered:
    def test_raise_alert_records_signs_and_delivers_the_event(self, alert_thread, receiver):
        hooks = receiver()
        budget = make_budget(hooks.url, key=True)
        raise_for(budget, spent="10.0000000001")
        assert alert_thread.wait_idle(WAIT)
        [alert] = alerts_of(budget)
        [got] = hooks.received
        assert got.body == alert.body.encode() and got.headers["x-hopbase-signature"] == signed(got.body)
        event = json.loads(got.body)
        assert list(event) == FIELDS and event["id"] == str(alert.pk)
        assert (event["spent_usd"], event["limit_usd"], event["key_prefix"]) == (
            "10.0000000001", "12.50", budget.api_key.prefix)
        assert alert.delivered_at is not None and answers(alert) == [(200, "")]

    def test_a_500_is_retried_after_the_backoff_and_then_delivered(self, alert_thread, receiver, settings):
        settings.HOPBASE_WEBHOOK_RETRY_BASE = 0.2
        hooks = receiver(500, 503)
        budget = make_budget(hooks.url)
        raise_for(budget)
        assert alert_thread.wait_idle(WAIT)
        [alert] = alerts_of(budget)
        assert answers(alert) == [(500, ""), (503, ""), (200, "")] and alert.delivered_at is not None
        times = list(alert.attempts.order_by("attempted_at").values_list("attempted_at", flat=True))
        assert times[1] - times[0] >= timedelta(seconds=0.2) and times[2] - times[1] >= timedelta(seconds=0.4)
        assert len({r.body for r in hooks.received}) == 1 and len(hooks.received) == 3

    def test_a_received_attempt_answered_too_late_is_retried_with_the_same_id(self, alert_thread, receiver,
                                                                             settings):
        settings.HOPBASE_WEBHOOK_TIMEOUT = 0.3
        hooks = receiver("slow")
        budget = make_budget(hooks.url)
        raise_for(budget)
        assert alert_thread.wait_idle(WAIT)
        first, retry = hooks.received
        # What a receiver deduplicating by id sees: the same event twice.
        assert json.loads(first.body)["id"] == json.loads(retry.body)["id"] and first.body == retry.body
        [alert] = alerts_of(budget)
        assert [status for status, _ in answers(alert)] == [None, 200]
        delivered_at = alert.delivered_at
        raise_for(budget)  # the gateway again, in another process
        assert alert_thread.wait_idle(WAIT)
        alert.refresh_from_db()
        assert alert.delivered_at == delivered_at and len(hooks.received) == 2

    def test_raising_twice_for_a_window_makes_one_alert_and_one_delivery(self, alert_thread, receiver):
        hooks = receiver()
        budget = make_budget(hooks.url)
        raise_for(budget)
        raise_for(budget, spent="11")
        assert alert_thread.wait_idle(WAIT)
        [alert] = alerts_of(budget)
        assert len(hooks.received) == 1 and json.loads(alert.body)["spent_usd"] == "10.25"

    def test_two_processes_raising_at_once_deliver_once(self, alert_thread, receiver, settings):
        settings.HOPBASE_WEBHOOK_TIMEOUT = WAIT
        hooks = receiver("slow")  # the first POST is held until the other process has had its look
        budget = make_budget(hooks.url)
        window = window_at("1d", timezone.now())
        looked = threading.Semaphore(0)

        def run_and_tell(args: alerts.AlertArgs) -> None:
            run_here(args)
            looked.release()

        first_process = AlertDispatcher(send=run_and_tell)
        second_process = AlertDispatcher(send=run_and_tell)
        for process, spent in ((first_process, "10.25"), (second_process, "10.30")):
            process.publish((budget.pk, AlertType.THRESHOLD.value, window.start.isoformat(),
                             window.end.isoformat(), spent))
        # Whichever posts waits for the receiver; the other found it in flight.
        assert hooks.wait_for(1) and looked.acquire(timeout=WAIT)
        hooks.release.set()
        assert looked.acquire(timeout=WAIT)
        for process in (first_process, second_process, alert_thread):  # the loser's retries are alert_thread's
            assert process.wait_idle(WAIT) and process.stop(WAIT)
        [alert] = alerts_of(budget)
        assert len(hooks.received) == 1 and answers(alert) == [(200, "")] and alert.delivered_at is not None

    def test_two_processes_recording_the_same_alert_at_the_same_moment_post_it_once(self, receiver):
        hooks = receiver()
        budget = make_budget(hooks.url)
        window = window_at("1d", timezone.now())
        together = threading.Barrier(2, timeout=WAIT)
        outcomes: list[Delivery] = []

        def process(spent: str) -> None:
            try:
                together.wait()
                outcomes.append(alerts.deliver(budget.pk, AlertType.THRESHOLD, window, Decimal(spent)))
            finally:
                connections.close_all()

        threads = [threading.Thread(target=process, args=(spent,)) for spent in ("10.25", "10.30")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert sorted(outcomes) in ([Delivery.ALREADY_DELIVERED, Delivery.DELIVERED],
                                    [Delivery.DELIVERED, Delivery.IN_FLIGHT])
        [alert] = alerts_of(budget)
        assert len(hooks.received) == 1 and answers(alert) == [(200, "")]

    def test_a_new_window_is_a_new_alert(self, alert_thread, receiver):
        hooks = receiver()
        budget = make_budget(hooks.url, period="30s")
        now = timezone.now()
        raise_for(budget, window_at("30s", now))
        raise_for(budget, window_at("30s", now + timedelta(seconds=30)))
        assert alert_thread.wait_idle(WAIT)
        first, second = alerts_of(budget)
        ids = {json.loads(r.body)["id"] for r in hooks.received}
        assert ids == {str(first.pk), str(second.pk)} and first.delivered_at and second.delivered_at

    def test_no_webhook_is_recorded_and_nothing_is_posted(self, alert_thread, receiver):
        hooks = receiver()
        budget = make_budget("")
        raise_for(budget, alert_type=AlertType.EXHAUSTED)
        assert alert_thread.wait_idle(WAIT)
        [alert] = alerts_of(budget)
        assert alert.type == AlertType.EXHAUSTED and answers(alert) == [] and alert.delivered_at is None
        assert hooks.received == []

    def test_retries_end_after_the_last_one(self, alert_thread, receiver, settings, caplog):
        settings.HOPBASE_WEBHOOK_MAX_RETRIES = 2
        hooks = receiver(500, 500, 500, 500)
        budget = make_budget(hooks.url)
        raise_for(budget)
        assert alert_thread.wait_idle(WAIT)
        [alert] = alerts_of(budget)
        assert answers(alert) == [(500, "")] * 3 and alert.delivered_at is None
        assert "given up after 2 retries" in caplog.text


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db", "leaves_nothing")
def test_a_celery_worker_retries_with_its_countdown_until_delivered(receiver):
    queue = f"hopbase-test-alerts-{uuid.uuid4().hex[:10]}"
    producer = Celery("hopbase-test-alerts-producer", set_as_current=False)
    producer.config_from_object("django.conf:settings", namespace="CELERY")
    producer.conf.update(broker_url=worker_redis_url(), task_always_eager=False)
    hooks = receiver(500, 500)
    budget = make_budget(hooks.url)
    worker = Worker(worker_redis_url(), queue, {"HOPBASE_WEBHOOK_RETRY_BASE": "0.3", "HOPBASE_WEBHOOK_TIMEOUT": "2"})
    thread = AlertDispatcher(send=lambda args: producer.send_task(
        "billing.tasks.deliver_budget_alert", args=args, queue=queue, retry=False))
    try:
        window = window_at("1d", timezone.now())
        thread.publish((budget.pk, "budget.threshold", window.start.isoformat(), window.end.isoformat(), "10"))
        assert hooks.wait_for(3, 30)
        deadline = time.monotonic() + WAIT
        while not BudgetAlert.objects.filter(budget=budget, delivered_at__isnull=False).exists():
            assert time.monotonic() < deadline, "the worker did not record the delivery"
            time.sleep(0.05)  # another process's commit: nothing here to wait on
    finally:
        assert thread.stop(WAIT)
        producer.close()
        worker.stop()
    [alert] = alerts_of(budget)
    assert [status for status, _ in answers(alert)] == [500, 500, 200]
    times = list(alert.attempts.order_by("attempted_at").values_list("attempted_at", flat=True))
    assert times[1] - times[0] >= timedelta(seconds=0.3) and times[2] - times[1] >= timedelta(seconds=0.6)
    assert len({r.body for r in hooks.received}) == 1
