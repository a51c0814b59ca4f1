"""Budget alerts (G4): from the gateway's "this window crossed its threshold"
to one signed webhook event, delivered off the request path.

    raise_alert (event loop, returns at once)
      -> dispatcher thread: publish billing.tasks.deliver_budget_alert
        -> task: record_alert (one BudgetAlert per budget, type and window)
                 attempt_delivery (one POST, one WebhookAttempt row)
                 a failure: retried after retry_delay(n), up to
                 HOPBASE_WEBHOOK_MAX_RETRIES times

The event's body is written once, when its row is made, and every attempt
sends those bytes: a receiver that got an attempt whose answer we never
saw recognises the retry by its ``id``. Times in the body are ISO 8601 UTC
with a ``Z``, to the microsecond (``2026-12-05T21:00:00.000000Z``), as in
exports, ``budgets --format jsonl`` and /v1/usage (billing.exports.utc_iso);
amounts are exact decimal strings (core.money.usd_text: ``"12.50"``,
``"0.000123"``).

At most once per (budget, type, window): the unique constraint makes a second
raise find the first's row, and an attempt first claims the alert under its
row lock (a WebhookAttempt row with neither status nor error is an attempt
in flight): nobody posts an alert already delivered, nor one another
process is posting right now.

With REDIS_URL a Celery worker delivers and its retries wait in the broker.
Without it (Celery eager) the gateway's own dispatcher thread delivers, one
alert at a time, and keeps the retries in memory: a restart forgets them,
and the alert stays undelivered in the admin (billing.budgets.admin_alerts).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import hmac
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from functools import partial

import httpx
from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, connections, transaction
from django.utils import timezone

from billing.budgets.windows import Window
from billing.exports import utc_iso
from billing.models import AlertType, Budget, BudgetAlert, WebhookAttempt
from core import loggers
from core.money import usd_text
from core.snapshots import refresh_connection

log = logging.getLogger(loggers.ALERTS)

SIGNATURE_HEADER = "x-hopbase-signature"
# One delay is at most this long, whatever the base and the count: under the
# Redis broker's visibility timeout (an hour), past which a message held for
# its countdown would be handed to a second worker.
MAX_RETRY_DELAY = 600.0
# Alerts waiting for the dispatcher thread; past this (a broker down for long
# under a storm of budgets) new ones are dropped, with an error logged.
MAX_PENDING = 10_000
IN_FLIGHT_ERROR = ""  # an attempt row with no status and this error has not ended yet
ABANDONED = "no outcome recorded: its sender stopped, or lost the database, before it could"
NO_SECRET = "the budget has no webhook secret (setbudget --webhook makes one)"

# What the task is handed (JSON-serialisable): budget id, alert type, window
# start and end (ISO 8601; no end for ``total``), spent (a decimal string).
AlertArgs = tuple[int, str, str, str | None, str]


class Delivery(StrEnum):
    DELIVERED = "delivered"
    ALREADY_DELIVERED = "already delivered"
    NO_WEBHOOK = "no webhook"  # recorded for the admin, nothing to post
    NO_BUDGET = "budget gone"
    IN_FLIGHT = "in flight elsewhere"
    FAILED = "failed"

    @property
    def retry(self) -> bool:
        # In flight elsewhere: that attempt may yet fail, or be our own from a
        # run that died before recording its outcome. A later look settles it.
        return self in (Delivery.FAILED, Delivery.IN_FLIGHT)


def raise_alert(budget_id: int, alert_type: AlertType, window: Window, spent_usd: Decimal) -> None:
    """Alert that ``window`` of a budget crossed its threshold, or ran out.

    Called by the gateway on its event loop when a request ends. A plain
    function, not a coroutine: with no await in it, a request task being
    cancelled cannot stop it halfway. It only queues the alert for the
    dispatcher thread (a lock held for a heap push) and returns; the thread
    publishes the Celery task, which may wait on the broker for a second or
    two. A daemon thread rather than ``loop.run_in_executor``: the publish
    outlives the request, needs no loop (the gateway's may be closing), and
    its failures are retried there rather than left in an unawaited future.
    Never raises: an alert that cannot be queued is logged and dropped.
    """
    try:
        if isinstance(spent_usd, float):
            raise TypeError("spent_usd is a float: money is a Decimal")
        args: AlertArgs = (
            int(budget_id), AlertType(alert_type).value, window.start.isoformat(),
            window.end.isoformat() if window.end is not None else None, str(spent_usd),
        )
        dispatcher.publish(args)
    except Exception:  # noqa: BLE001 - the request path must never fail because of an alert
        log.exception("budget alert %s for budget %s dropped", alert_type, budget_id)


def retry_delay(retries: int) -> float:
    """Seconds before retry number ``retries + 1``: HOPBASE_WEBHOOK_RETRY_BASE,
    doubled after each failure, at most MAX_RETRY_DELAY."""
    return min(settings.HOPBASE_WEBHOOK_RETRY_BASE * 2 ** min(retries, 32), MAX_RETRY_DELAY)


def event_body(alert_id: uuid.UUID, alert_type: AlertType, created_at: datetime, budget: Budget, window: Window,
               spent_usd: Decimal) -> str:
    """The event as sent, G4's fields in its order; ASCII, so its text and its bytes are the same."""
    event = {
        "id": str(alert_id),
        "type": AlertType(alert_type).value,
        "created_at": utc_iso(created_at),
        "tenant": budget.tenant.name,
        "key_prefix": budget.api_key.prefix if budget.api_key_id is not None else None,
        "period": budget.period,
        "window_start": utc_iso(window.start),
        "window_end": utc_iso(window.end) if window.end is not None else None,
        "limit_usd": usd_text(budget.limit_usd),
        "spent_usd": usd_text(spent_usd),
    }
    return json.dumps(event, separators=(",", ":"))


def sign(secret: str, body: bytes) -> str:
    """The ``x-hopbase-signature`` value: ``sha256=`` and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def record_alert(budget_id: int, alert_type: AlertType, window: Window, spent_usd: Decimal) -> BudgetAlert | None:
    """The alert's row, made by the first caller for its budget, type and
    window (its body, id and time fixed then); later callers, in any
    process, get that row. None when the budget is gone."""
    budget = Budget.objects.select_related("tenant", "api_key").filter(pk=budget_id).first()
    if budget is None:
        return None
    alert_id = uuid.uuid4()
    created_at = timezone.now()
    alert, _ = BudgetAlert.objects.get_or_create(
        budget=budget, type=AlertType(alert_type).value, window_start=window.start,
        defaults={"id": alert_id, "created_at": created_at,
                  "body": event_body(alert_id, alert_type, created_at, budget, window, spent_usd)},
    )
    return alert


def deliver(budget_id: int, alert_type: AlertType, window: Window, spent_usd: Decimal) -> Delivery:
    """Record the alert if it is new, then make one delivery attempt unless it is delivered."""
    alert = record_alert(budget_id, alert_type, window, spent_usd)
    return Delivery.NO_BUDGET if alert is None else attempt_delivery(alert.pk)


def attempt_delivery(alert_id: uuid.UUID) -> Delivery:
    """One POST of the alert's body, recorded as a WebhookAttempt; a 2xx marks it delivered."""
    claimed = _claim(alert_id)
    if isinstance(claimed, Delivery):
        return claimed
    alert, attempt, url, secret = claimed
    status, error = None, ""
    try:
        status = _post(url, alert.body.encode("ascii"), secret)
    except Exception as failure:  # noqa: BLE001 - whatever stopped it (a bad URL too) is this attempt's outcome
        # Never the URL (it may carry a token) nor the secret: only what failed.
        error = f"{type(failure).__name__}: {failure}" if str(failure) else type(failure).__name__
    delivered = status is not None and 200 <= status < 300
    with transaction.atomic():
        WebhookAttempt.objects.filter(pk=attempt.pk).update(status_code=status, error=error[:300])
        if delivered:
            BudgetAlert.objects.filter(pk=alert.pk, delivered_at__isnull=True).update(delivered_at=timezone.now())
    if delivered:
        log.info("budget alert %s delivered (HTTP %s)", alert.pk, status)
        return Delivery.DELIVERED
    log.warning("budget alert %s not delivered: %s", alert.pk, f"HTTP {status}" if status is not None else error)
    return Delivery.FAILED


def _lease() -> timedelta:
    """How long an attempt in flight is trusted to still be running: its
    whole deadline and then some, for the rows written around it."""
    return timedelta(seconds=settings.HOPBASE_WEBHOOK_TIMEOUT * 2 + 10)


def _claim(alert_id: uuid.UUID) -> Delivery | tuple[BudgetAlert, WebhookAttempt, str, str]:
    """Under the alert's row lock (PostgreSQL; SQLite's write transaction is
    one lock for all), either the reason there is nothing to post, or an
    attempt row in flight, which makes this caller the one posting."""
    with transaction.atomic():
        alert = BudgetAlert.objects.select_for_update(of=("self",)).select_related("budget").filter(
            pk=alert_id).first()
        if alert is None:
            return Delivery.NO_BUDGET  # the budget, and its alerts with it, were deleted
        if alert.delivered_at is not None:
            return Delivery.ALREADY_DELIVERED
        budget = alert.budget
        if not budget.webhook_url:
            return Delivery.NO_WEBHOOK
        flying = alert.attempts.filter(status_code__isnull=True, error=IN_FLIGHT_ERROR)
        if flying.filter(attempted_at__gt=timezone.now() - _lease()).exists():
            return Delivery.IN_FLIGHT
        flying.update(error=ABANDONED)
        if not budget.webhook_secret:
            # Unsigned, the receiver could not tell the event from a forgery.
            WebhookAttempt.objects.create(alert=alert, error=NO_SECRET)
            log.warning("budget alert %s not delivered: %s", alert.pk, NO_SECRET)
            return Delivery.FAILED
        attempt = WebhookAttempt.objects.create(alert=alert, error=IN_FLIGHT_ERROR)
        return alert, attempt, budget.webhook_url, budget.webhook_secret


def _post(url: str, body: bytes, secret: str) -> int:
    """The receiver's status code. The whole attempt (connecting, sending,
    the answer's head) has one deadline, HOPBASE_WEBHOOK_TIMEOUT: httpx's
    own timeouts bound each read, not a receiver that answers a byte at a
    time. On a loop of its own: this runs on a worker or the dispatcher
    thread, never on the gateway's loop."""
    return asyncio.run(_post_within(url, body, secret, settings.HOPBASE_WEBHOOK_TIMEOUT))


async def _post_within(url: str, body: bytes, secret: str, deadline: float) -> int:
    headers = {"content-type": "application/json", SIGNATURE_HEADER: sign(secret, body), "user-agent": "HopBase"}
    # No redirects: a receiver that moved answers 3xx, an attempt that failed.
    async with httpx.AsyncClient(timeout=deadline, follow_redirects=False) as client:
        async with asyncio.timeout(deadline):
            # Streamed and never read: only the status counts, however long the answer.
            async with client.stream("POST", url, content=body, headers=headers) as response:
                return response.status_code


# The delivery task (named in billing.tasks, where the worker finds it): the
# work above, with the retries.


@shared_task(bind=True, name="billing.tasks.deliver_budget_alert", ignore_result=True, max_retries=None)
def deliver_budget_alert(self, budget_id: int, alert_type: str, window_start: str, window_end: str | None,
                         spent_usd: str) -> str:
    """Record the alert (once per budget, type and window) and try to deliver
    it; a failure is retried after retry_delay(n) seconds, up to
    HOPBASE_WEBHOOK_MAX_RETRIES times. Every run, first or retry, first looks
    whether the alert is delivered already, so none posts it twice."""
    window = Window(datetime.fromisoformat(window_start),
                    datetime.fromisoformat(window_end) if window_end is not None else None)
    try:
        outcome = deliver(budget_id, AlertType(alert_type), window, Decimal(spent_usd))
    except (OperationalError, InterfaceError) as error:
        # The database is away: the alert is neither lost nor sent, only later.
        log.warning("budget alert %s of budget %s waits for the database (%s)", alert_type, budget_id, error)
        outcome = Delivery.FAILED
    if not outcome.retry:
        return outcome.value
    retries = self.request.retries
    if retries >= settings.HOPBASE_WEBHOOK_MAX_RETRIES:
        log.error("budget alert %s of budget %s given up after %d retries", alert_type, budget_id, retries)
        return "given up"
    countdown = retry_delay(retries)
    args = (budget_id, alert_type, window_start, window_end, spent_usd)
    if self.request.is_eager:
        # Celery runs an eager task's retry at once, countdown ignored; without
        # a broker the alerts' own thread keeps the backoff instead.
        dispatcher.later(countdown, partial(deliver_budget_alert.apply, args=args, retries=retries + 1))
        return "retry scheduled"
    raise self.retry(args=args, countdown=countdown)


def send_alert(args: AlertArgs) -> None:
    """Publish the delivery task (in eager mode, without REDIS_URL, run it here)."""
    # retry=False: one publish attempt, bounded by the broker timeouts in
    # settings; the dispatcher retries a failed publish itself.
    deliver_budget_alert.apply_async(args, retry=False)


class AlertDispatcher:
    """One daemon thread that runs jobs when they are due, one at a time:
    publishing alerts for raise_alert (a failed publish is tried again after
    retry_delay), and, in eager mode, the delivery retries Celery would
    otherwise run at once (billing.tasks.deliver_budget_alert)."""

    def __init__(self, send: Callable[[AlertArgs], object] = send_alert, max_pending: int = MAX_PENDING) -> None:
        self._send = send
        self._max_pending = max_pending
        self._jobs: list[tuple[float, int, Callable[[], object]]] = []  # a heap by due time
        self._order = itertools.count()  # jobs due together run in the order given
        self._busy = False
        self._stopping = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def publish(self, args: AlertArgs) -> bool:
        return self.later(0.0, partial(self._publish, args, 0))

    def later(self, delay: float, job: Callable[[], object]) -> bool:
        """Run ``job`` on the thread in ``delay`` seconds; False when it was not taken."""
        with self._changed:
            if self._stopping:
                return False
            if len(self._jobs) >= self._max_pending:
                log.error("budget alert dropped: %d alerts already wait to be published", len(self._jobs))
                return False
            heapq.heappush(self._jobs, (time.monotonic() + delay, next(self._order), job))
            # Not alive: started before this process was forked from its parent.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hopbase-alerts", daemon=True)
                self._thread.start()
            self._changed.notify_all()
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no job is due or running (scheduled retries included)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def stop(self, timeout: float = 5.0) -> bool:
        """End the thread after its current job, dropping jobs not yet due; True when it has ended."""
        with self._changed:
            self._stopping = True
            if self._jobs:
                log.warning("%d budget alert jobs dropped at stop", len(self._jobs))
            self._jobs.clear()
            self._changed.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _publish(self, args: AlertArgs, failures: int) -> None:
        try:
            self._send(args)
        except Exception as error:  # noqa: BLE001 - any broker failure means "try again later"
            if failures >= settings.HOPBASE_WEBHOOK_MAX_RETRIES:
                log.error("budget alert %s of budget %s lost: could not be published (%s: %s)",
                          args[1], args[0], type(error).__name__, error)
                return
            delay = retry_delay(failures)
            log.warning("could not publish budget alert %s of budget %s (%s: %s); trying again in %.3g s",
                        args[1], args[0], type(error).__name__, error, delay)
            self.later(delay, partial(self._publish, args, failures + 1))

    def _next(self) -> Callable[[], object] | None:
        """The next job once it is due; None when stopping."""
        with self._changed:
            self._busy = False
            self._changed.notify_all()
            while not self._stopping:
                if not self._jobs:
                    self._changed.wait()  # idle until later() or stop() notifies
                    continue
                left = self._jobs[0][0] - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self._busy = True
                return heapq.heappop(self._jobs)[2]
            return None

    def _run(self) -> None:
        try:
            while (job := self._next()) is not None:
                try:
                    refresh_connection()
                    job()
                except Exception:
                    log.exception("budget alert job failed")
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()
            connections.close_all()


dispatcher = AlertDispatcher()
