"""Settlement (B6) in batches: many logs of several tenants in one transaction, each
charged exactly once, also when several settlers run at once.

The concurrent settlers run on committed data, in threads; they are marked
``gateway`` so they run with the other integration tests, after every unit
test, and their committed rows surprise no one.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing import settlement
from billing.checks import ledger_problems
from billing.ledger import post_entry
from billing.models import LedgerEntry, RequestLog
from billing.settlement import Outcome, settle, settle_many
from tests.support.factories import make_log, make_price, unique
from tests.support.settlement_checks import (
    CHARGE,
    PRICED,
    assert_charged_once,
    balance,
    charges_of,
    entries_total,
    funded_tenant,
    priced_model,
    settled_count,
)


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
