"""Settlement (B6): each request log charged into the ledger exactly once.

The first half runs settlement in-process inside test transactions. The
second half runs the real thing on committed data: a Celery worker process
(solo pool) on the test database and Redis, stopped, killed mid-settlement
and restarted, and a Redis of the test's own that goes away and comes back.
Those tests are marked ``gateway`` so they run with the other integration
tests, after every unit test, and their committed rows surprise no one.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from celery import Celery
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import settlement
from billing.checks import ledger_problems
from billing.ledger import post_entry, top_up
from billing.models import LedgerEntry, RequestLog
from billing.recorder import Finished, Recorder, in_process_sweep_interval
from billing.settlement import Outcome, settle, settle_many, sweep, unsettled
from billing.tasks import (
    Publisher,
    settle_request_log,
    settle_request_logs,
    sweep_unsettled,
)
from core.usage import Usage
from hopbase.models import Tenant
from tests.conftest import database_url_for_subprocess
from tests.factories import make_key, make_log, make_price, make_tenant, unique
from tests.processes import ROOT, free_port

# 1000 input at 3/M + 200 output at 15/M = 0.003 + 0.003
PRICED = {"input_tokens": 1000, "output_tokens": 200}
CHARGE = Decimal("0.006")


def priced_model() -> str:
    model = unique("settle-model")
    make_price(model, input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
               effective_from=timezone.now() - dt.timedelta(days=1))
    return model


def funded_tenant(balance: str = "10", **fields) -> Tenant:
    tenant = make_tenant(**fields)
    top_up(tenant, Decimal(balance))
    return tenant


def an_hour_ago() -> dt.datetime:
    return timezone.now() - dt.timedelta(hours=1)


def balance(tenant: Tenant) -> Decimal:
    return Tenant.objects.get(pk=tenant.pk).balance_usd


# In-process


@pytest.mark.django_db
class TestSettle:
    def test_it_charges_a_log_once_into_the_ledger(self):
        tenant, model = funded_tenant(), priced_model()
        log = make_log(tenant, model=model, **PRICED)
        assert settle(log.pk) == Outcome.CHARGED
        log.refresh_from_db()
        entry = LedgerEntry.objects.get(request_log=log)
        assert (log.charge_usd, entry.kind, entry.amount_usd, entry.tenant_id) == (CHARGE, "charge", -CHARGE, tenant.pk)
        assert log.settled_at is not None
        assert balance(tenant) == Decimal("10") - CHARGE == entry.balance_after_usd
        assert settle(log.pk) == Outcome.ALREADY
        assert LedgerEntry.objects.filter(request_log=log).count() == 1
        assert balance(tenant) == Decimal("10") - CHARGE

    @pytest.mark.parametrize("status", ["failed", "rejected"])
    def test_a_request_that_costs_nothing_is_settled_without_an_entry(self, status):
        tenant = funded_tenant()
        log = make_log(tenant, model="never-priced", status=status, **PRICED)
        assert settle(log.pk) == Outcome.FREE
        log.refresh_from_db()
        assert (log.charge_usd, log.settled_at is not None) == (0, True)
        assert not LedgerEntry.objects.filter(request_log=log).exists()

    @pytest.mark.parametrize("status", ["cancelled", "stalled", "interrupted"])
    def test_a_cut_short_request_is_charged_for_what_it_used(self, status):
        tenant, model = funded_tenant(), priced_model()
        log = make_log(tenant, model=model, status=status, usage_estimated=True, **PRICED)
        assert settle(log.pk) == Outcome.CHARGED
        assert LedgerEntry.objects.get(request_log=log).amount_usd == -CHARGE

    def test_it_charges_the_price_in_force_when_the_request_was_made(self):
        tenant, model = funded_tenant(), unique("repriced")
        make_price(model, input_usd_per_mtok=Decimal("1"), output_usd_per_mtok=Decimal("1"),
                   effective_from=timezone.now() - dt.timedelta(days=2))
        old = make_log(tenant, model=model, input_tokens=1_000_000, created_at=timezone.now() - dt.timedelta(days=1))
        make_price(model, input_usd_per_mtok=Decimal("7"), output_usd_per_mtok=Decimal("7"))
        new = make_log(tenant, model=model, input_tokens=1_000_000)
        settle_many([old.pk, new.pk])
        old.refresh_from_db()
        new.refresh_from_db()
        assert (old.charge_usd, new.charge_usd) == (Decimal("1"), Decimal("7"))

    def test_it_applies_the_tenants_multiplier(self):
        tenant, model = funded_tenant(price_multiplier=Decimal("0.5")), priced_model()
        log = make_log(tenant, model=model, **PRICED)
        settle(log.pk)
        log.refresh_from_db()
        assert log.charge_usd == CHARGE / 2

    def test_it_applies_the_multiplier_in_force_when_the_request_was_made(self):
        tenant, model = funded_tenant(price_multiplier=Decimal("3")), priced_model()
        log = make_log(tenant, model=model, price_multiplier=Decimal("1"), **PRICED)
        settle(log.pk)
        log.refresh_from_db()
        assert log.charge_usd == CHARGE

    def test_a_log_without_a_price_stays_unsettled(self, caplog):
        tenant = funded_tenant()
        log = make_log(tenant, model="nobody-priced-this", **PRICED)
        assert settle(log.pk) == Outcome.UNPRICED
        log.refresh_from_db()
        assert log.settled_at is None and log.charge_usd is None
        assert "no price for 'nobody-priced-this'" in caplog.text

    def test_a_balance_may_go_negative(self):
        tenant, model = funded_tenant("0.001"), priced_model()
        settle(make_log(tenant, model=model, **PRICED).pk)
        assert balance(tenant) == Decimal("0.001") - CHARGE == entries_total(tenant)

    def test_a_charge_already_in_the_ledger_is_not_posted_again(self):
        # The unique request_log of an entry is the last line of defence, for a
        # settler that got past the row lock (none should).
        tenant, model = funded_tenant(), priced_model()
        log = make_log(tenant, model=model, **PRICED)
        post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, -CHARGE, request_log=log)
        assert settle(log.pk) == Outcome.ALREADY
        assert LedgerEntry.objects.filter(request_log=log).count() == 1
        assert balance(tenant) == Decimal("10") - CHARGE

    def test_a_missing_log_is_reported(self):
        assert settle(987654321) == Outcome.MISSING

    def test_the_tasks_settle_by_id(self):
        tenant, model = funded_tenant(), priced_model()
        one, two, three = (make_log(tenant, model=model, **PRICED) for _ in range(3))
        assert settle_request_log.apply(args=(one.pk,)).get() == "charged"
        assert settle_request_logs.apply(args=([one.pk, two.pk, three.pk],)).get() == {"already": 1, "charged": 2}
        assert LedgerEntry.objects.filter(kind="charge", tenant=tenant).count() == 3


def transactions_in(queries: list[dict]) -> int:
    """Transactions begun: a savepoint inside the test's transaction (one per
    ``atomic()`` block settlement opens)."""
    return sum(1 for query in queries if query["sql"].upper().startswith("SAVEPOINT"))


@pytest.mark.django_db
class TestSettleMany:
    def test_a_mixed_batch_of_several_tenants_settles_in_one_transaction(self, caplog):
        model = priced_model()
        a, b, c = funded_tenant(), funded_tenant(price_multiplier=Decimal("0.5")), funded_tenant("3")
        charged_a = [make_log(a, model=model, **PRICED) for _ in range(3)]
        charged_b = [make_log(b, model=model, **PRICED) for _ in range(2)]
        charged_c = make_log(c, model=model, input_tokens=1, output_tokens=1)  # 0.000018
        free = [
            make_log(a, model=model, status="failed", **PRICED),
            make_log(b, model="never-priced", status="rejected", **PRICED),
            make_log(c, model=model),  # no tokens
        ]
        unpriced = make_log(b, model=unique("unpriced"), **PRICED)
        before = make_log(a, model=model, **PRICED)
        assert settle(before.pk) == Outcome.CHARGED
        # Interleave the tenants, so each one's running balance is tested.
        ids = [charged_a[0].pk, charged_b[0].pk, charged_a[1].pk, charged_c.pk, charged_b[1].pk, charged_a[2].pk]
        ids += [log.pk for log in free] + [unpriced.pk, before.pk, 987654321]

        with CaptureQueriesContext(connection) as queries:
            outcomes = settle_many(ids)

        assert transactions_in(queries.captured_queries) == 1
        assert outcomes == {Outcome.CHARGED: 6, Outcome.FREE: 3, Outcome.UNPRICED: 1, Outcome.ALREADY: 1,
                            Outcome.MISSING: 1}
        expected = {a: Decimal("10") - 4 * CHARGE, b: Decimal("10") - CHARGE, c: Decimal("3") - Decimal("0.000018")}
        for tenant, left in expected.items():
            assert balance(tenant) == left == entries_total(tenant)
            # Entries in order, each with the balance right after it.
            running = Decimal(0)
            for amount, after in LedgerEntry.objects.filter(tenant=tenant).order_by("id").values_list(
                "amount_usd", "balance_after_usd"
            ):
                running += amount
                assert after == running
        for log in charged_a + charged_b + [charged_c]:
            log.refresh_from_db()
            assert log.settled_at is not None
            assert LedgerEntry.objects.get(request_log=log).amount_usd == -log.charge_usd
        assert {RequestLog.objects.get(pk=log.pk).charge_usd for log in charged_b} == {CHARGE / 2}
        for log in free:
            log.refresh_from_db()
            assert (log.charge_usd, log.settled_at is not None) == (0, True)
            assert not LedgerEntry.objects.filter(request_log=log).exists()
        unpriced.refresh_from_db()
        assert unpriced.settled_at is None and unpriced.charge_usd is None
        assert f"request log {unpriced.pk} left unsettled" in caplog.text
        assert ledger_problems() == []
        assert settle_many(ids) == {Outcome.ALREADY: 10, Outcome.UNPRICED: 1, Outcome.MISSING: 1}

    def test_the_queries_per_batch_do_not_grow_with_its_logs(self):
        model, cheap = priced_model(), priced_model()
        tenants = [funded_tenant(price_multiplier=Decimal(m)) for m in ("1", "0.5", "2", "1.25")]

        def batch(size: int) -> list[int]:
            ids = []
            for n in range(size):
                tenant = tenants[n % len(tenants)]
                kind = n % 5
                if kind == 4:
                    ids.append(make_log(tenant, model=model, status="failed", **PRICED).pk)
                else:
                    # Several distinct charges: tokens vary with n.
                    ids.append(make_log(tenant, model=cheap if kind else model, input_tokens=1000 + n,
                                        output_tokens=200).pk)
            return ids

        counts = {}
        for size in (1, 5, 120):
            ids = batch(size)
            with CaptureQueriesContext(connection) as queries:
                settle_many(ids)
            assert settled_count(ids) == size
            counts[size] = len(queries)
        # SAVEPOINT, logs, prices, tenants, entries, balances, marks, RELEASE;
        # a batch of one log spends the same.
        assert counts[120] == counts[5] <= 8, counts
        assert counts[1] <= counts[5]
        assert ledger_problems() == []

    def test_a_list_longer_than_a_batch_is_settled_a_batch_per_transaction(self, monkeypatch):
        monkeypatch.setattr(settlement, "SETTLE_BATCH", 3)
        tenant, model = funded_tenant(), priced_model()
        ids = [make_log(tenant, model=model, **PRICED).pk for _ in range(7)]
        with CaptureQueriesContext(connection) as queries:
            assert settle_many(ids) == {Outcome.CHARGED: 7}
        assert transactions_in(queries.captured_queries) == 3
        assert balance(tenant) == Decimal("10") - 7 * CHARGE == entries_total(tenant)

    def test_marking_many_distinct_charges_stays_within_the_parameter_limit(self, monkeypatch):
        # SQLite allows 999 parameters a statement; a batch of 500 logs with
        # 500 different charges needs more, so its UPDATE is split.
        monkeypatch.setattr(connection.features, "max_query_params", 25)
        tenant, model = funded_tenant(), priced_model()
        logs = [make_log(tenant, model=model, input_tokens=1000 + n, output_tokens=200) for n in range(30)]
        with CaptureQueriesContext(connection) as queries:
            assert settle_many([log.pk for log in logs]) == {Outcome.CHARGED: 30}
        marks = [q for q in queries.captured_queries if q["sql"].startswith('UPDATE "billing_requestlog"')]
        assert len(marks) > 1
        for n, log in enumerate(logs):
            log.refresh_from_db()
            assert log.charge_usd == CHARGE + Decimal(3 * n) / 1_000_000 and log.settled_at is not None
        assert balance(tenant) == entries_total(tenant) and ledger_problems() == []

    def test_a_crash_inside_a_batch_rolls_all_of_it_back(self, monkeypatch):
        tenant, model = funded_tenant(), priced_model()
        ids = [make_log(tenant, model=model, **PRICED).pk for _ in range(4)]

        def crash(name: str) -> None:
            raise KeyboardInterrupt(name)  # as the worker's SIGKILL would, mid-transaction

        monkeypatch.setattr(settlement, "crash_point", crash)
        with pytest.raises(KeyboardInterrupt, match="after_charge"):
            settle_many(ids)
        assert settled_count(ids) == 0 and charges_of(ids) == 0
        assert balance(tenant) == Decimal("10")
        monkeypatch.undo()
        assert settle_many(ids) == {Outcome.CHARGED: 4}
        assert balance(tenant) == Decimal("10") - 4 * CHARGE == entries_total(tenant)

    def test_a_batch_that_meets_the_unique_charge_is_retried_a_log_at_a_time(self, monkeypatch):
        # A charge posted past the row lock (none should be) makes the batch's
        # insert fail: the batch rolls back whole and each log settles alone.
        tenant, model = funded_tenant(), priced_model()
        ids = [make_log(tenant, model=model, **PRICED).pk for _ in range(3)]
        real = settlement.post_charges
        calls: list[int] = []

        def sneaky(postings):
            calls.append(len(postings))
            if len(calls) == 1:
                post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, -CHARGE, request_log=RequestLog(pk=ids[1]))
            return real(postings)

        monkeypatch.setattr(settlement, "post_charges", sneaky)
        assert settle_many(ids) == {Outcome.CHARGED: 3}
        assert calls == [3, 1, 1, 1]
        assert balance(tenant) == Decimal("10") - 3 * CHARGE == entries_total(tenant)
        assert charges_of(ids) == 3 and ledger_problems() == []

    def test_a_log_charged_but_not_marked_settled_is_not_charged_again_in_a_batch(self):
        tenant, model = funded_tenant(), priced_model()
        logs = [make_log(tenant, model=model, **PRICED) for _ in range(3)]
        post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, -CHARGE, request_log=logs[1])
        assert settle_many([log.pk for log in logs]) == {Outcome.CHARGED: 2, Outcome.ALREADY: 1}
        assert balance(tenant) == Decimal("10") - 3 * CHARGE == entries_total(tenant)
        assert LedgerEntry.objects.filter(request_log=logs[1]).count() == 1
        # ... and it is marked settled with what the ledger charged, so no
        # sweep keeps coming back to it.
        logs[1].refresh_from_db()
        assert (logs[1].settled_at is not None, logs[1].charge_usd) == (True, CHARGE)
        assert ledger_problems() == []

    def test_charges_are_exact_and_rounded_once_half_up(self):
        plain, scaled = funded_tenant(), funded_tenant(price_multiplier=Decimal("1.2345"))
        model = unique("exact")
        make_price(model, input_usd_per_mtok=Decimal("0.00005"), output_usd_per_mtok=Decimal("12.345678"),
                   cache_read_usd_per_mtok=Decimal("0.000049"), effective_from=timezone.now() - dt.timedelta(days=1))
        half = make_log(plain, model=model, input_tokens=1)  # 0.00000000005 -> 0.0000000001
        below = make_log(plain, model=model, cache_read_tokens=1)  # 0.000000000049 -> 0, settled free
        big = make_log(scaled, model=model, output_tokens=7)  # 0.000106685176437 -> 0.0001066852
        outcomes = settle_many([half.pk, below.pk, big.pk])
        assert outcomes == {Outcome.CHARGED: 2, Outcome.FREE: 1}
        charges = dict(RequestLog.objects.filter(pk__in=[half.pk, below.pk, big.pk]).values_list("pk", "charge_usd"))
        assert charges == {half.pk: Decimal("1E-10"), below.pk: 0, big.pk: Decimal("0.0001066852")}
        assert balance(plain) == Decimal("9.9999999999") == entries_total(plain)
        assert balance(scaled) == Decimal("9.9998933148") == entries_total(scaled)


@pytest.mark.django_db
class TestSweep:
    def test_it_settles_what_is_old_enough_and_leaves_fresh_logs_to_their_task(self):
        tenant, model = funded_tenant(), priced_model()
        old = [make_log(tenant, model=model, created_at=an_hour_ago(), **PRICED) for _ in range(3)]
        fresh = make_log(tenant, model=model, **PRICED)
        result = sweep()
        assert result.settled == 3
        assert set(unsettled(dt.timedelta(0)).filter(tenant=tenant)) == {fresh}
        assert all(RequestLog.objects.get(pk=log.pk).settled_at for log in old)

    def test_it_works_in_batches_and_passes_over_unpriced_logs(self):
        tenant, model = funded_tenant(), priced_model()
        logs = [make_log(tenant, model=model if i % 4 else "unpriced-x", created_at=an_hour_ago(), **PRICED)
                for i in range(11)]
        result = sweep(batch=3)
        assert (result.settled, result.unpriced) == (8, 3)
        assert balance(tenant) == Decimal("10") - 8 * CHARGE
        assert unsettled().filter(tenant=tenant).count() == 3
        assert sweep(batch=3).settled == 0  # nothing twice
        assert len(logs) == 11

    def test_the_sweep_task_takes_a_delay(self):
        tenant, model = funded_tenant(), priced_model()
        make_log(tenant, model=model, **PRICED)
        assert sweep_unsettled.apply().get() == 0
        assert sweep_unsettled.apply(kwargs={"older_than": 0}).get() == 1

    def test_beat_runs_the_sweep_every_interval(self):
        entry = settings.CELERY_BEAT_SCHEDULE["sweep-unsettled-request-logs"]
        assert entry["task"] == sweep_unsettled.name
        assert entry["schedule"] == settings.HOPBASE_SWEEP_INTERVAL


@pytest.mark.django_db
class TestSettleCommand:
    def run(self) -> str:
        out = io.StringIO()
        call_command("settle", stdout=out, stderr=io.StringIO())
        return out.getvalue()

    def test_it_settles_everything_now_and_says_how_many(self):
        tenant, model = funded_tenant(), priced_model()
        for status in ("completed", "cancelled", "failed"):
            make_log(tenant, model=model, status=status, **PRICED)
        assert self.run().splitlines()[-1] == "settled 3 request logs"
        assert self.run().splitlines()[-1] == "settled 0 request logs"
        assert balance(tenant) == Decimal("10") - 2 * CHARGE
        assert ledger_problems() == []

    def test_it_fails_when_a_log_cannot_be_priced(self):
        make_log(funded_tenant(), model="unpriced-y", **PRICED)
        with pytest.raises(CommandError, match="1 request logs have no price") as caught:
            self.run()
        assert caught.value.returncode == 1


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


# With committed data: threads, a real worker, a real Redis.

WORKER_DEADLINE = 60


def wait_for(condition: Callable[[], bool], timeout: float = WORKER_DEADLINE, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def settled_count(ids: list[int]) -> int:
    return RequestLog.objects.filter(pk__in=ids, settled_at__isnull=False).count()


def charges_of(ids: list[int]) -> int:
    return LedgerEntry.objects.filter(request_log_id__in=ids).count()


def entries_total(tenant: Tenant) -> Decimal:
    # Summed here, exactly: SQLite sums decimals as floating point.
    return sum(LedgerEntry.objects.filter(tenant=tenant).values_list("amount_usd", flat=True), Decimal(0))


def assert_charged_once(tenant: Tenant, ids: list[int], start: Decimal = Decimal("10")) -> None:
    assert settled_count(ids) == len(ids)
    assert charges_of(ids) == len(ids)
    assert balance(tenant) == start - len(ids) * CHARGE == entries_total(tenant)
    assert ledger_problems() == []


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_concurrent_settlers_charge_each_log_once():
    tenant, model = funded_tenant(), priced_model()
    ids = [make_log(tenant, model=model, **PRICED).pk for _ in range(30)]
    errors: list[BaseException] = []

    def settler(order: list[int]) -> None:
        try:
            for log_id in order:
                settle(log_id)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=settler, args=(ids if n % 2 else ids[::-1],)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert_charged_once(tenant, ids)


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_concurrent_batch_settlers_split_the_work_and_charge_each_log_once():
    """Batch settlers (recorder tasks, sweeps with SKIP LOCKED, single-log
    retries) over overlapping logs of several tenants: on PostgreSQL they
    really run at once; none deadlocks, none charges a log twice."""
    model = priced_model()
    tenants = [funded_tenant() for _ in range(3)]
    logs = {tenant.pk: [make_log(tenant, model=model, **PRICED).pk for _ in range(40)] for tenant in tenants}
    ids = sorted(log_id for tenant_logs in logs.values() for log_id in tenant_logs)
    errors: list[BaseException] = []
    outcomes: list[Counter] = []
    start = threading.Barrier(8)

    def settler(n: int) -> None:
        try:
            start.wait(10)
            if n == 7:
                for log_id in ids[::-1]:
                    settle(log_id)
                return
            chunk = 7 + 5 * n
            order = ids if n % 2 else ids[::-1]
            for first in range(0, len(order), chunk):
                outcomes.append(settle_many(order[first : first + chunk], skip_locked=n % 3 == 0))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=settler, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sum(counter[Outcome.CHARGED] for counter in outcomes) <= len(ids)
    settle_many(ids)  # whatever was skipped as busy (all of it was settled by its holder)
    for tenant in tenants:
        assert_charged_once(tenant, logs[tenant.pk])


def worker_redis_url() -> str:
    # CI sets REDIS_URL; locally Redis runs on this machine all the same.
    return settings.REDIS_URL or "redis://127.0.0.1:6379/13"


class Worker:
    """``celery -A hopbase worker --pool=solo`` on the test database,
    consuming one queue of its own."""

    def __init__(self, broker: str, queue: str, env: dict[str, str] | None = None) -> None:
        self.log_path = ROOT / "var" / f"worker-{queue}-{uuid.uuid4().hex[:6]}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")
        full_env = {
            **os.environ,
            "DATABASE_URL": database_url_for_subprocess(),
            "REDIS_URL": broker,
            "HOPBASE_LOG_LEVEL": "INFO",
            **(env or {}),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "hopbase", "worker", "--pool=solo", "-Q", queue,
             "--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-n", f"{queue}@%h"],
            cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_for(self.ready, 30, "the worker to start")
        except AssertionError:
            self.stop()
            raise AssertionError(f"worker did not start:\n{self.log_path.read_text()[-3000:]}") from None

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")
        return b" ready." in self.log_path.read_bytes()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


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


def test_without_redis_the_gateways_recorder_sweeps_and_with_redis_beat_does(settings):
    settings.REDIS_URL = None
    settings.HOPBASE_SWEEP_INTERVAL = 42
    assert in_process_sweep_interval() == 42
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    assert in_process_sweep_interval() is None


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_the_recorder_thread_sweeps_in_process_when_told_to():
    tenant, model = funded_tenant(), priced_model()
    key, _ = make_key(tenant)
    left_behind = [make_log(tenant, key, model=model, created_at=an_hour_ago(), **PRICED).pk for _ in range(2)]
    published: list[list[int]] = []
    recorder = Recorder(publish=published.append, sweep_every=0.05)
    try:
        recorder.record(
            Finished(request_id=unique("req-sweep"), created_at=timezone.now(), tenant_id=tenant.pk,
                     api_key_id=key.pk, protocol="chat", status="rejected")
        )
        wait_for(lambda: settled_count(left_behind) == 2, 30, "the recorder's sweep")
        assert len(published) == 1  # the new row went to its task, not to the sweep
    finally:
        recorder.stop()
    assert_charged_once(tenant, left_behind)
