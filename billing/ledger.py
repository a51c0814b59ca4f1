"""Writing to the ledger: every entry and the balance it changes land in one
transaction, so a tenant's balance always equals the sum of its entries."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from billing.models import LedgerEntry, RequestLog
from core.money import usd_text
from core.row_insert import insert_rows
from tenants.models import Tenant


@transaction.atomic
def post_entry(
    tenant_id: int,
    kind: str,
    amount_usd: Decimal,
    request_log: RequestLog | None = None,
    note: str = "",
    idempotency_key: str | None = None,
) -> LedgerEntry:
    # The row lock orders concurrent postings for one tenant, so each entry's
    # balance_after is the balance right after it. FOR NO KEY UPDATE
    # (PostgreSQL): request logs referring to the tenant can still be
    # inserted meanwhile.
    tenant = Tenant.objects.select_for_update(no_key=True).only("balance_usd").get(pk=tenant_id)
    balance_after = tenant.balance_usd + amount_usd
    entry = LedgerEntry.objects.create(
        tenant_id=tenant_id,
        kind=kind,
        amount_usd=amount_usd,
        balance_after_usd=balance_after,
        request_log=request_log,
        note=note,
        idempotency_key=idempotency_key,
    )
    # The exact sum computed here, not F("balance_usd") + amount: SQLite would
    # add in floating point and the balance would drift from its entries.
    # The row lock (or SQLite's one writer) keeps this from racing.
    Tenant.objects.filter(pk=tenant_id).update(balance_usd=balance_after)
    return entry


@transaction.atomic(savepoint=False)
def post_charges(charges: Sequence[tuple[int, Decimal, int]]) -> list[LedgerEntry]:
    """Charge entries for many request logs at once (settlement of a batch):
    ``(tenant_id, amount_usd, request_log_id)`` each, amounts negative, in
    the order they are to be appended. Joins the caller's transaction (no
    savepoint of its own); starts one when there is none.

    Every tenant involved is locked first, in id order, so two batches with
    tenants in common never wait on each other in a cycle; each entry gets
    the balance right after it, in the given order; each tenant's balance is
    written once, as the exact sum (as in ``post_entry``). A few statements
    whatever the number of entries; the entries come back without their ids."""
    if not charges:
        return []
    tenant_ids = sorted({tenant_id for tenant_id, _, _ in charges})
    tenants = {
        tenant.pk: tenant
        for tenant in Tenant.objects.select_for_update(no_key=True)
        .filter(pk__in=tenant_ids)
        .order_by("pk")
        .only("balance_usd")
    }
    now = timezone.now()
    entries = []
    for tenant_id, amount_usd, request_log_id in charges:
        tenant = tenants[tenant_id]
        tenant.balance_usd = tenant.balance_usd + amount_usd
        entries.append(
            LedgerEntry(
                tenant_id=tenant_id,
                kind=LedgerEntry.Kind.CHARGE,
                amount_usd=amount_usd,
                balance_after_usd=tenant.balance_usd,
                request_log_id=request_log_id,
                created_at=now,
            )
        )
    insert_rows(entries)
    Tenant.objects.bulk_update(list(tenants.values()), ["balance_usd"])
    return entries


class TopUpMismatch(ValueError):
    """An idempotency key already used for another tenant or amount."""


def top_up(tenant: Tenant, amount_usd: Decimal, note: str = "top-up") -> LedgerEntry:
    if amount_usd <= 0:
        raise ValueError("a top-up must be a positive amount")
    return post_entry(tenant.pk, LedgerEntry.Kind.TOPUP, amount_usd, note=note)


def topped_up(entry: LedgerEntry) -> str:
    """The admin log's sentence for a top-up: the admin's and the topup command's alike."""
    return f"Topped up {usd_text(entry.amount_usd)} USD (ledger entry #{entry.pk})."


def top_up_once(
    tenant: Tenant, amount_usd: Decimal, idempotency_key: str, note: str = "top-up"
) -> tuple[LedgerEntry, bool]:
    """A top-up that happens once per key, however often it is asked for (a
    form submitted twice, a retried request): ``(entry, created)``. The key
    is unique in the ledger, so two requests racing each other credit once
    too: the loser's insert fails and it returns the winner's entry."""
    if amount_usd <= 0:
        raise ValueError("a top-up must be a positive amount")
    if not idempotency_key:
        raise ValueError("an idempotency key is required")
    existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
    if existing is None:
        try:
            entry = post_entry(
                tenant.pk, LedgerEntry.Kind.TOPUP, amount_usd, note=note, idempotency_key=idempotency_key
            )
        except IntegrityError:
            existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
            if existing is None:
                raise
        else:
            return entry, True
    if existing.tenant_id != tenant.pk or existing.amount_usd != amount_usd or existing.kind != LedgerEntry.Kind.TOPUP:
        raise TopUpMismatch("this top-up token was already used for another top-up")
    return existing, False


def sum_of_entries(tenant: Tenant) -> Decimal:
    total = LedgerEntry.objects.filter(tenant=tenant).aggregate(total=Sum("amount_usd"))["total"]
    return total if total is not None else Decimal("0")
