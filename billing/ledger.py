"""Writing to the ledger: every entry and the balance it changes land in one
transaction, so a tenant's balance always equals the sum of its entries."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import Sum

from billing.models import LedgerEntry, RequestLog
from hopbase.models import Tenant


@transaction.atomic
def post_entry(
    tenant_id: int,
    kind: str,
    amount_usd: Decimal,
    request_log: RequestLog | None = None,
    note: str = "",
) -> LedgerEntry:
    # The row lock orders concurrent postings for one tenant, so each entry's
    # balance_after is the balance right after it.
    tenant = Tenant.objects.select_for_update().only("balance_usd").get(pk=tenant_id)
    balance_after = tenant.balance_usd + amount_usd
    entry = LedgerEntry.objects.create(
        tenant_id=tenant_id,
        kind=kind,
        amount_usd=amount_usd,
        balance_after_usd=balance_after,
        request_log=request_log,
        note=note,
    )
    # The exact sum computed here, not F("balance_usd") + amount: SQLite would
    # add in floating point and the balance would drift from its entries.
    # The row lock (or SQLite's one writer) keeps this from racing.
    Tenant.objects.filter(pk=tenant_id).update(balance_usd=balance_after)
    return entry


def top_up(tenant: Tenant, amount_usd: Decimal, note: str = "top-up") -> LedgerEntry:
    if amount_usd <= 0:
        raise ValueError("a top-up must be a positive amount")
    return post_entry(tenant.pk, LedgerEntry.Kind.TOPUP, amount_usd, note=note)


def sum_of_entries(tenant: Tenant) -> Decimal:
    total = LedgerEntry.objects.filter(tenant=tenant).aggregate(total=Sum("amount_usd"))["total"]
    return total if total is not None else Decimal("0")
