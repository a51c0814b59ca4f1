"""What the settlement tests share (tests/*/test_settlement_*.py): a priced model, a
funded tenant, and proof that each log was charged exactly once."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from decimal import Decimal

from django.utils import timezone

from billing.checks import ledger_problems
from billing.ledger import top_up
from billing.models import LedgerEntry, RequestLog
from tenants.models import Tenant
from tests.support.factories import make_price, make_tenant, unique

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
