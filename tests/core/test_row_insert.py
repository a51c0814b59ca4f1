"""core.row_insert: many new rows in one statement, each value converted as
its field converts it, a duplicate left out only where asked, and any other
broken constraint still an error."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from billing.models import LedgerEntry, RequestLog
from core.row_insert import insert_rows
from tests.support.factories import make_key, make_log


def new_log(key, **fields) -> RequestLog:
    return RequestLog(request_id=uuid.uuid4().hex, tenant_id=key.tenant_id, api_key_id=key.pk, protocol="chat",
                      status=RequestLog.Status.COMPLETED, **fields)


@pytest.mark.django_db
@pytest.mark.parametrize(("sent", "stored"), [(12.7, 12), (True, 1), ("12", 12), (12, 12)])
def test_an_integer_column_stores_what_the_orm_would(sent, stored):
    # A provider's usage is read from its JSON: a count may arrive as any of these.
    key, _ = make_key()
    row = new_log(key, output_tokens=sent)
    insert_rows([row])
    assert RequestLog.objects.values_list("output_tokens", flat=True).get(request_id=row.request_id) == stored


@pytest.mark.django_db
def test_a_row_already_stored_is_left_out_when_asked_and_the_rest_written():
    key, _ = make_key()
    first = new_log(key, output_tokens=1)
    insert_rows([first])
    again, other = new_log(key, output_tokens=2), new_log(key, output_tokens=3)
    again.request_id = first.request_id
    insert_rows([again, other], skip_existing="request_id")
    stored = dict(RequestLog.objects.filter(tenant_id=key.tenant_id).values_list("request_id", "output_tokens"))
    assert stored == {first.request_id: 1, other.request_id: 3}


@pytest.mark.django_db
def test_a_second_charge_for_one_request_log_is_refused():
    log = make_log()
    charge = {"tenant_id": log.tenant_id, "kind": LedgerEntry.Kind.CHARGE, "amount_usd": Decimal("-0.0000012345"),
              "balance_after_usd": Decimal("9.9999987655"), "request_log_id": log.pk}
    insert_rows([LedgerEntry(**charge)])
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_rows([LedgerEntry(**charge)])
    assert list(LedgerEntry.objects.filter(request_log=log).values_list("amount_usd", flat=True)) == [
        Decimal("-0.0000012345")
    ]
