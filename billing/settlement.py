"""Settlement: a request log's charge into the ledger, exactly once (B6)
(metering -> pricing -> *settlement*).

``settle(log_id)`` is the one write. In one transaction it locks the log,
returns if it is already settled, prices it (billing.pricing), posts the
charge with the tenant's new balance (billing.ledger.post_entry) and marks
the log settled with its charge. Requests that cost nothing (failed,
rejected, no tokens) are settled at 0 without a ledger entry.

Why it is safe to run any number of times, from any number of workers:
- the log's row lock orders concurrent settlers of one log; the second sees
  ``settled_at`` and stops;
- a crash before commit rolls back the entry and the mark together, so the
  log stays unsettled and the next attempt (task retry or sweep) charges it;
- the database's one-to-one ``LedgerEntry.request_log`` is the last line of
  defence: a second charge cannot be inserted, and the IntegrityError is
  read as "already settled".

How logs reach it: the recorder publishes each written batch
(billing.tasks.publish_settlement); the periodic ``sweep()`` settles
whatever is still unsettled a little later, whether its task was lost,
never published (broker down) or killed.

A billable log whose model had no price when the request was made cannot be
priced; it is left unsettled, logged, and reported by ``settle`` and the
sweep, rather than silently billed at zero. (The intake refuses unpriced
models, so this needs a price row deleted or a model served unpriced.)
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import os
import signal
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from billing.ledger import post_entry
from billing.models import LedgerEntry, RequestLog
from billing.pricing import PriceHistory, Unpriced, charge_for, price_at

log = logging.getLogger("hopbase.settlement")

# The sweep leaves logs younger than this to the task published for them,
# so the two do not race for every fresh row (either would be safe).
SWEEP_DELAY = dt.timedelta(seconds=10)
SWEEP_BATCH = 500


class Outcome(str, enum.Enum):
    CHARGED = "charged"  # a charge entry was posted
    FREE = "free"  # settled at zero, no entry
    ALREADY = "already"  # settled before (or by a concurrent settler)
    UNPRICED = "unpriced"  # billable, but no price in force when it was made
    BUSY = "busy"  # another settler holds the row right now (sweep only)
    MISSING = "missing"  # no such log


def crash_point(name: str) -> None:
    """Test hook for the worker integration test (tests/test_settlement.py):
    when HOPBASE_TEST_CRASH_AT names this point, the process dies here as if
    SIGKILLed, with the transaction open. Never set in production."""
    if settings.HOPBASE_TEST_CRASH_AT == name:
        os.kill(os.getpid(), signal.SIGKILL)


def settle(log_id: int, prices: PriceHistory | None = None, skip_locked: bool = False) -> Outcome:
    """Settle one request log (see module docstring). ``prices`` saves a
    price query per log when settling many; ``skip_locked`` makes a sweep
    pass over a row another settler is working on (PostgreSQL)."""
    try:
        with transaction.atomic():
            return _settle_locked(log_id, prices, skip_locked)
    except IntegrityError:
        # Only the unique request_log of a charge entry can fail here: another
        # settler charged this log between our read and our insert.
        if LedgerEntry.objects.filter(request_log_id=log_id).exists():
            return Outcome.ALREADY
        raise


def _settle_locked(log_id: int, prices: PriceHistory | None, skip_locked: bool) -> Outcome:
    # Lock the log row only (of=self), not the tenant: post_entry locks the
    # tenant itself, always after the log, so settlers never deadlock.
    rows = (
        RequestLog.objects.select_for_update(of=("self",), skip_locked=skip_locked)
        .select_related("tenant")
        .only(
            "id", "created_at", "model", "status", "input_tokens", "output_tokens", "cache_read_tokens",
            "cache_write_tokens", "settled_at", "charge_usd", "tenant__price_multiplier",
        )
        .filter(pk=log_id)
    )
    request_log = rows.first()
    if request_log is None:
        if skip_locked and RequestLog.objects.filter(pk=log_id).exists():
            return Outcome.BUSY
        return Outcome.MISSING
    if request_log.settled_at is not None:
        return Outcome.ALREADY
    price = (
        prices.at(request_log.model, request_log.created_at)
        if prices is not None
        else price_at(request_log.model, request_log.created_at)
    )
    try:
        charge = charge_for(request_log, price, request_log.tenant.price_multiplier)
    except Unpriced as error:
        log.warning("request log %s left unsettled: %s", log_id, error)
        return Outcome.UNPRICED
    if charge > 0:
        post_entry(request_log.tenant_id, LedgerEntry.Kind.CHARGE, -charge, request_log=request_log)
        crash_point("after_charge")
    RequestLog.objects.filter(pk=log_id).update(charge_usd=charge, settled_at=timezone.now())
    return Outcome.CHARGED if charge > 0 else Outcome.FREE


def settle_many(log_ids: Iterable[int], skip_locked: bool = False) -> Counter[Outcome]:
    """Settle these logs, one transaction each, sharing one price lookup."""
    ids = sorted(set(log_ids))
    outcomes: Counter[Outcome] = Counter()
    if not ids:
        return outcomes
    models = RequestLog.objects.filter(pk__in=ids).values_list("model", flat=True).distinct()
    prices = PriceHistory.load(models)
    for log_id in ids:
        outcomes[settle(log_id, prices, skip_locked=skip_locked)] += 1
    return outcomes


@dataclass
class SweepResult:
    outcomes: Counter[Outcome] = field(default_factory=Counter)

    @property
    def settled(self) -> int:
        return self.outcomes[Outcome.CHARGED] + self.outcomes[Outcome.FREE]

    @property
    def unpriced(self) -> int:
        return self.outcomes[Outcome.UNPRICED]


def unsettled(older_than: dt.timedelta = SWEEP_DELAY) -> QuerySet[RequestLog]:
    """Logs not in the ledger yet, made at least ``older_than`` ago."""
    return RequestLog.objects.filter(settled_at__isnull=True, created_at__lte=timezone.now() - older_than)


def sweep(older_than: dt.timedelta = SWEEP_DELAY, batch: int = SWEEP_BATCH) -> SweepResult:
    """Settle every log still unsettled ``older_than`` after it was made, in
    id order, a batch at a time. It stops at the newest log that existed when
    it began, so a busy gateway cannot keep one sweep running forever; rows
    it skips (unpriced, busy) are tried again by the next sweep."""
    result = SweepResult()
    pending = unsettled(older_than)
    last = pending.order_by("-pk").values_list("pk", flat=True).first()
    if last is None:
        return result
    after = 0
    while True:
        ids = list(
            pending.filter(pk__gt=after, pk__lte=last).order_by("pk").values_list("pk", flat=True)[:batch]
        )
        if not ids:
            break
        result.outcomes.update(settle_many(ids, skip_locked=True))
        after = ids[-1]
    if result.unpriced:
        log.warning("sweep: %d request logs have no price in force and stay unsettled", result.unpriced)
    return result
