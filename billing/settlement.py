"""Settlement: a request log's charge into the ledger, exactly once (B6)
(metering -> pricing -> *settlement*).

``settle_many(ids)`` is the one write, a batch (up to ``SETTLE_BATCH`` logs)
per transaction, a handful of statements per batch whatever its size:
1. lock the batch's unsettled logs (``FOR UPDATE``, in id order; ``SKIP
   LOCKED`` for the sweep on PostgreSQL, so concurrent sweeps split the
   work), noting any that already has a ledger entry;
2. load the prices of their models once (billing.pricing.PriceHistory) and
   price every log in memory;
3. post the charges (billing.ledger.post_charges: lock the tenants in id
   order, insert the entries with each one's balance after it, write each
   tenant's balance once);
4. mark the logs settled with their charges, in one UPDATE.
``settle(log_id)`` is the same for one log. Requests that cost nothing
(failed, rejected, no tokens) are settled at 0 without a ledger entry.

Why it is safe to run any number of times, from any number of workers:
- the logs' row locks order concurrent settlers of one log; the second no
  longer finds it unsettled and reports it ``ALREADY`` (locks are taken in
  id order, logs before tenants, so settlers never deadlock);
- a crash before commit rolls back the whole batch, entries, balances and
  marks together, so its logs stay unsettled and the next attempt (task
  retry or sweep) charges them; nothing is ever half-settled;
- the database's one-to-one ``LedgerEntry.request_log`` is the last line of
  defence: a second charge cannot be inserted. Should a batch meet it (a
  charge posted past the row lock; none should be), the batch rolls back
  and its logs are settled one at a time, where the IntegrityError is read
  as "already settled".

How logs reach it: the recorder publishes each written batch
(billing.tasks.Publisher); the periodic ``sweep()`` settles
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
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, Exists, OuterRef, QuerySet, Value, When
from django.utils import timezone

from billing.ledger import post_charges
from billing.models import LedgerEntry, RequestLog
from billing.pricing import PriceHistory, Unpriced, charge_for
from core import loggers

log = logging.getLogger(loggers.SETTLEMENT)

# The sweep leaves logs younger than this to the task published for them,
# so the two do not race for every fresh row (either would be safe).
SWEEP_DELAY = dt.timedelta(seconds=10)
SWEEP_BATCH = 500
# Logs settled per transaction (the recorder writes batches of 500).
SETTLE_BATCH = 500


class Outcome(str, enum.Enum):
    CHARGED = "charged"  # a charge entry was posted
    FREE = "free"  # settled at zero, no entry
    ALREADY = "already"  # settled before (or by a concurrent settler)
    UNPRICED = "unpriced"  # billable, but no price in force when it was made
    BUSY = "busy"  # another settler holds the row right now (sweep only)
    MISSING = "missing"  # no such log


def crash_point(name: str) -> None:
    """Test hook for the worker integration test (tests/processes/test_settlement_worker.py):
    when HOPBASE_TEST_CRASH_AT names this point, the process dies here as if
    SIGKILLed, with the transaction open. Never set in production."""
    if settings.HOPBASE_TEST_CRASH_AT == name:
        os.kill(os.getpid(), signal.SIGKILL)


def settle(log_id: int, prices: PriceHistory | None = None, skip_locked: bool = False) -> Outcome:
    """Settle one request log (see module docstring). ``prices`` saves the
    price query; ``skip_locked`` makes a sweep pass over a row another
    settler is working on (PostgreSQL)."""
    return _settle_batch([log_id], prices, skip_locked)[log_id]


def settle_many(
    log_ids: Iterable[int], skip_locked: bool = False, prices: PriceHistory | None = None
) -> Counter[Outcome]:
    """Settle these logs, ``SETTLE_BATCH`` at a time, one transaction per
    batch, and count the outcomes."""
    ids = sorted(set(log_ids))
    outcomes: Counter[Outcome] = Counter()
    for start in range(0, len(ids), SETTLE_BATCH):
        outcomes.update(_settle_batch(ids[start : start + SETTLE_BATCH], prices, skip_locked).values())
    return outcomes


def _settle_batch(ids: list[int], prices: PriceHistory | None, skip_locked: bool) -> dict[int, Outcome]:
    try:
        with transaction.atomic():
            return _settle_locked(ids, prices, skip_locked)
    except IntegrityError:
        # Only the unique request_log of a charge entry can fail here: another
        # settler charged one of these logs between our read and our insert.
        # The whole batch rolled back; each log now finds out for itself.
        if len(ids) > 1:
            outcomes: dict[int, Outcome] = {}
            for log_id in ids:
                outcomes.update(_settle_batch([log_id], prices, skip_locked))
            return outcomes
        if LedgerEntry.objects.filter(request_log_id=ids[0]).exists():
            return {ids[0]: Outcome.ALREADY}
        raise


class _Log(NamedTuple):
    """What settlement reads of a request log: a tuple, not a model instance
    with its tenant's (building those cost more than pricing the log)."""

    pk: int
    tenant_id: int
    created_at: dt.datetime
    model: str
    status: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    price_multiplier: Decimal | None
    tenant_multiplier: Decimal
    in_ledger: bool


_LOG_FIELDS = (
    "id", "tenant_id", "created_at", "model", "status", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens", "price_multiplier", "tenant__price_multiplier", "in_ledger",
)


def _settle_locked(ids: list[int], prices: PriceHistory | None, skip_locked: bool) -> dict[int, Outcome]:
    # Lock the log rows only (of=self), not the tenants: post_charges locks
    # those itself, always after the logs, so settlers never deadlock. The
    # rows are locked in id order (ORDER BY below the lock), and a settled
    # row is not locked at all: on PostgreSQL a row settled while we waited
    # for it no longer matches and is left out.
    rows = [
        _Log._make(values)
        for values in RequestLog.objects.select_for_update(of=("self",), skip_locked=skip_locked)
        .annotate(in_ledger=Exists(LedgerEntry.objects.filter(request_log=OuterRef("pk"))))
        .filter(pk__in=ids, settled_at__isnull=True)
        .order_by("pk")
        .values_list(*_LOG_FIELDS)
    ]
    outcomes: dict[int, Outcome] = {}
    if len(rows) < len(ids):
        locked = {row.pk for row in rows}
        absent = [log_id for log_id in ids if log_id not in locked]
        settled = dict(RequestLog.objects.filter(pk__in=absent).values_list("pk", "settled_at"))
        for log_id in absent:
            if log_id not in settled:
                outcomes[log_id] = Outcome.MISSING
            elif settled[log_id] is not None:
                outcomes[log_id] = Outcome.ALREADY
            else:  # skipped: another settler holds it right now
                outcomes[log_id] = Outcome.BUSY
    if not rows:
        return outcomes
    if prices is None:
        prices = PriceHistory.load({row.model for row in rows if not row.in_ledger})
    charges: dict[int, Decimal] = {}
    postings: list[tuple[int, Decimal, int]] = []
    charged_already = {
        entry.request_log_id: -entry.amount_usd
        for entry in LedgerEntry.objects.filter(request_log__in=[row.pk for row in rows if row.in_ledger])
    }
    for row in rows:
        if row.in_ledger:
            # Charged, yet not marked settled: the ledger entry is what counts;
            # mark the log with it so that sweeps stop coming back to it.
            charges[row.pk] = charged_already[row.pk]
            outcomes[row.pk] = Outcome.ALREADY
            continue
        try:
            multiplier = row.price_multiplier if row.price_multiplier is not None else row.tenant_multiplier
            charge = charge_for(row, prices.at(row.model, row.created_at), multiplier)
        except Unpriced as error:
            log.warning("request log %s left unsettled: %s", row.pk, error)
            outcomes[row.pk] = Outcome.UNPRICED
            continue
        charges[row.pk] = charge
        if charge > 0:
            postings.append((row.tenant_id, -charge, row.pk))
            outcomes[row.pk] = Outcome.CHARGED
        else:
            outcomes[row.pk] = Outcome.FREE
    if postings:
        post_charges(postings)
        crash_point("after_charge")
    if charges:
        _mark_settled(charges, timezone.now())
    return outcomes


_CHARGE_FIELD = RequestLog._meta.get_field("charge_usd")


def _mark_settled(charges: dict[int, Decimal], now: dt.datetime) -> None:
    """One UPDATE: every log settled at ``now`` with its own charge (a CASE
    over the distinct amounts, the commonest one as the default). Split in
    halves only when it would pass the backend's parameter limit (SQLite)."""
    by_amount: dict[Decimal, list[int]] = {}
    for log_id, charge in charges.items():
        by_amount.setdefault(charge, []).append(log_id)
    common = max(by_amount, key=lambda amount: len(by_amount[amount]))
    others = [(amount, ids) for amount, ids in by_amount.items() if amount != common]
    limit = connection.features.max_query_params
    parameters = 2 + len(charges) + sum(len(ids) + 1 for _, ids in others)
    if limit is not None and parameters > limit and len(charges) > 1:
        items = sorted(charges.items())
        half = len(items) // 2
        _mark_settled(dict(items[:half]), now)
        _mark_settled(dict(items[half:]), now)
        return
    value: Value | Case = Value(common, output_field=_CHARGE_FIELD)
    if others:
        whens = [When(pk__in=ids, then=Value(amount, output_field=_CHARGE_FIELD)) for amount, ids in others]
        value = Case(*whens, default=value, output_field=_CHARGE_FIELD)
    RequestLog.objects.filter(pk__in=list(charges)).update(charge_usd=value, settled_at=now)


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
