"""Ledger verification (settlement's audit, run by ``checkledger``).

Three promises of the money side are checked against the database:
1. every tenant's ``balance_usd`` equals the sum of its ledger entries;
2. every settled request log with a non-zero charge has exactly one charge
   entry, of minus its ``charge_usd``, on the log's tenant (the one-to-one
   ``LedgerEntry.request_log`` already forbids a second one);
3. no charge entry points at an unsettled log.

Each check is a single SQL statement, so on PostgreSQL it reads one snapshot
and a settlement committing meanwhile cannot produce a false alarm. Amounts are
compared as exact decimals; on SQLite, which stores decimals as floating
point, the sums are made in Python instead, inside one transaction, and a balance with more than about
15 significant digits may differ in its last place.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import DecimalField, F, OuterRef, Q, Subquery, Sum, Value
from django.db.models.functions import Coalesce

from billing.models import USD, LedgerEntry, RequestLog
from core.money import usd_text
from tenants.models import Tenant

CHUNK_SIZE = 2000


def ledger_problems(limit: int | None = 1000) -> list[str]:
    """Human-readable problems, empty when the ledger is consistent. At most
    ``limit`` are listed, then one line saying more were left out."""
    problems: list[str] = []
    for problem in _all_problems():
        if limit is not None and len(problems) >= limit:
            problems.append(f"... more problems not listed (limit {limit})")
            break
        problems.append(problem)
    return problems


def _all_problems():
    yield from _balance_problems()
    yield from _missing_charge_problems()
    yield from _wrong_charge_problems()


def _balance_problems():
    if connection.vendor == "sqlite":
        yield from _balance_problems_summed_here()
        return
    entries_total = (
        LedgerEntry.objects.filter(tenant=OuterRef("pk"))
        .order_by()
        .values("tenant")
        .annotate(total=Sum("amount_usd"))
        .values("total")
    )
    tenants = Tenant.objects.annotate(
        entries_total=Coalesce(Subquery(entries_total), Value(Decimal(0)), output_field=DecimalField(**USD))
    ).order_by("name")
    for name, balance, total in tenants.values_list("name", "balance_usd", "entries_total").iterator(CHUNK_SIZE):
        if balance != total:
            yield f"tenant {name}: balance {usd_text(balance)} but its ledger entries sum to {usd_text(total)}"


def _balance_problems_summed_here():
    """SQLite stores decimals as floating point and SUM() adds them as such,
    so thousands of small charges drift from the exact total. Each stored
    amount reads back exactly (at most 15 significant digits), so add them
    here in Decimal, streaming the entries. (SQLite is the embedded mode:
    small ledgers.)"""
    totals: dict[int, Decimal] = defaultdict(Decimal)
    # One transaction: SQLite's (immediate) lock keeps settlements out
    # between reading the entries and the balances.
    with transaction.atomic():
        entries = LedgerEntry.objects.order_by().values_list("tenant_id", "amount_usd")
        for tenant_id, amount in entries.iterator(CHUNK_SIZE):
            totals[tenant_id] += amount
        balances = list(Tenant.objects.order_by("name").values_list("pk", "name", "balance_usd"))
    for pk, name, balance in balances:
        total = totals.get(pk, Decimal(0))
        if balance != total:
            yield f"tenant {name}: balance {usd_text(balance)} but its ledger entries sum to {usd_text(total)}"


def _missing_charge_problems():
    """Settled logs owing a charge that has no ledger entry at all."""
    logs = (
        RequestLog.objects.filter(settled_at__isnull=False, ledger_entry__isnull=True)
        .exclude(charge_usd=0)  # keeps a NULL charge, itself a problem once settled
        .order_by("created_at", "id")
        .values_list("request_id", "tenant__name", "charge_usd")
    )
    for request_id, tenant, charge in logs.iterator(CHUNK_SIZE):
        if charge is None:
            yield f"request log {request_id} (tenant {tenant}): settled but has no charge amount"
        else:
            yield f"request log {request_id} (tenant {tenant}): settled charge {usd_text(charge)} has no ledger entry"


def _wrong_charge_problems():
    """Entries tied to a log that are not that log's settled charge. The
    database narrows them down; the exact comparison happens here."""
    suspects = (
        LedgerEntry.objects.filter(request_log__isnull=False)
        .filter(
            ~Q(kind=LedgerEntry.Kind.CHARGE)
            | Q(request_log__settled_at__isnull=True)
            | Q(request_log__charge_usd__isnull=True)
            | ~Q(tenant=F("request_log__tenant"))
            | ~Q(amount_usd=-F("request_log__charge_usd"))
        )
        .order_by("id")
        .values_list(
            "id", "kind", "amount_usd", "tenant__name", "request_log__request_id", "request_log__tenant__name",
            "request_log__charge_usd", "request_log__settled_at",
        )
    )
    for entry_id, kind, amount, tenant, request_id, log_tenant, charge, settled_at in suspects.iterator(CHUNK_SIZE):
        log = f"request log {request_id} (tenant {log_tenant})"
        if kind != LedgerEntry.Kind.CHARGE:
            yield f"{log}: ledger entry #{entry_id} is a {kind}, not a charge"
            continue
        if settled_at is None:
            yield f"{log}: has charge entry #{entry_id} but is not settled"
        if tenant != log_tenant:
            yield f"{log}: charge entry #{entry_id} is on tenant {tenant}"
        if charge is None:
            yield f"{log}: charge entry #{entry_id} of {usd_text(amount)} but the log has no charge amount"
        elif amount != -charge:
            yield f"{log}: charge entry #{entry_id} is {usd_text(amount)}, expected {usd_text(-charge)}"
