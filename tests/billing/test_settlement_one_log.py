"""Settlement (B6): one request log charged into the ledger exactly once, in-process
inside test transactions."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.ledger import post_entry
from billing.models import LedgerEntry
from billing.settlement import Outcome, settle, settle_many
from billing.tasks import settle_request_log, settle_request_logs
from tests.support.factories import make_log, make_price, unique
from tests.support.settlement_checks import CHARGE, PRICED, balance, entries_total, funded_tenant, priced_model


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
