"""Celery tasks for settlement, and publishing them without waiting on the
broker (recorder -> *tasks* -> settlement).

The tasks are thin: they pass ids to billing.settlement, which is idempotent,
so a task run twice (acks_late redelivery, a retry) charges nothing twice.
A task that fails for good is not lost money either: the periodic sweep
settles every log still unsettled a little later.

- ``settle_request_logs(ids)``: what the recorder publishes, one message per
  written batch of logs rather than one per request;
- ``settle_request_log(id)``: the same for one log;
- ``sweep_unsettled()``: run by beat every HOPBASE_SWEEP_INTERVAL seconds
  when REDIS_URL is set (settings.CELERY_BEAT_SCHEDULE);
- ``deliver_budget_alert(...)``: a budget alert's webhook (G4), retried
  with backoff until a 2xx; defined beside its work in billing.budgets.alerts
  and imported here, where the worker looks for tasks.

Without REDIS_URL Celery is eager: ``apply_async`` runs the task in the
calling thread (the recorder's), and there is no beat; the gateway runs the
sweep as a periodic job of its own (billing.jobs).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable

from celery import shared_task
from django.db import OperationalError

from billing.budgets.alerts import deliver_budget_alert  # noqa: F401  (registered where the worker looks)
from billing.settlement import SWEEP_DELAY, settle, settle_many, sweep
from core import loggers

log = logging.getLogger(loggers.SETTLEMENT)

# A database that is briefly away (restart, failover) is worth a few retries;
# after that the sweep takes over.
RETRY = {"autoretry_for": (OperationalError,), "retry_backoff": True, "retry_backoff_max": 60, "max_retries": 5}


@shared_task(name="billing.tasks.settle_request_log", ignore_result=True, **RETRY)
def settle_request_log(log_id: int) -> str:
    return settle(log_id).value


@shared_task(name="billing.tasks.settle_request_logs", ignore_result=True, **RETRY)
def settle_request_logs(log_ids: list[int]) -> dict[str, int]:
    return {outcome.value: count for outcome, count in settle_many(log_ids).items()}


@shared_task(name="billing.tasks.sweep_unsettled", ignore_result=True)
def sweep_unsettled(older_than: float | None = None) -> int:
    """Settle every log unsettled for ``older_than`` seconds (default
    settlement.SWEEP_DELAY); returns how many were settled."""
    delay = SWEEP_DELAY if older_than is None else dt.timedelta(seconds=older_than)
    result = sweep(delay)
    if result.settled:
        log.info("sweep settled %d request logs", result.settled)
    return result.settled


def send_batch(log_ids: list[int]) -> None:
    # retry=False: a publish makes one attempt; the broker timeouts in
    # settings (CELERY_BROKER_*) bound how long that attempt may take.
    settle_request_logs.apply_async((log_ids,), retry=False)


class Publisher:
    """Hands batches of new logs to settlement, never blocking for long.

    Called from the recorder's thread, never from the event loop. When the
    broker cannot be reached the batch is dropped with a warning (the sweep
    settles it later) and publishing pauses for ``pause`` seconds, so an
    outage costs one failed connection attempt per pause, not one per batch.
    """

    def __init__(self, send: Callable[[list[int]], object] = send_batch, pause: float = 5.0) -> None:
        self._send = send
        self._pause = pause
        self._paused_until = 0.0
        self._lock = threading.Lock()

    def publish(self, log_ids: Iterable[int]) -> bool:
        """True when the batch was handed over (or run, in eager mode)."""
        ids = sorted(set(log_ids))
        if not ids:
            return True
        with self._lock:
            if time.monotonic() < self._paused_until:
                return False
        try:
            self._send(ids)
        except Exception as error:  # noqa: BLE001 - any broker failure means "later, by the sweep"
            with self._lock:
                first = self._paused_until == 0.0
                self._paused_until = time.monotonic() + self._pause
            log.warning(
                "could not queue settlement of %d request logs (%s: %s); the sweep will settle them%s",
                len(ids), type(error).__name__, error, "" if first else " (broker still unreachable)",
            )
            return False
        with self._lock:
            if self._paused_until:
                log.info("settlement publishing resumed")
            self._paused_until = 0.0
        return True


publisher = Publisher()
