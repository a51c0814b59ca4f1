"""The operator commands topup, balance, checkledger and exportbilling (the operator contract, docs/operations.md):
each success path, and every bad input failing with one line and nothing written."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from billing.exports import COLUMNS
from billing.ledger import post_entry, sum_of_entries
from billing.models import LedgerEntry
from tenants.models import Tenant
from tests.support.command_checks import assert_refused, run
from tests.support.factories import make_channel, make_key, make_log, make_tenant

pytestmark = pytest.mark.django_db


# topup and balance


def test_it_tops_up_through_the_ledger():
    tenant = make_tenant("acme")
    out = run("topup", "acme", "7.25")
    tenant.refresh_from_db()
    assert tenant.balance_usd == Decimal("7.25") == sum_of_entries(tenant)
    assert LedgerEntry.objects.get().kind == LedgerEntry.Kind.TOPUP
    assert "7.25" in out


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["nobody", "5"], "unknown tenant"),
        (["acme", "0"], "more than zero"),
        (["acme", "-5"], "negative"),
        (["acme", "5,00"], "not a number"),
        (["acme", "1.00000000001"], "decimal places"),
    ],
)
def test_it_refuses_a_bad_top_up(args, match):
    make_tenant("acme")
    assert_refused("topup", *args, match=match)


@pytest.mark.parametrize(
    ("entries", "printed"),
    [
        ([], "0.00"),
        (["12.5"], "12.50"),
        (["10", "-0.000123"], "9.999877"),
        (["0.0000000001"], "0.0000000001"),
        (["1234567890.5"], "1234567890.50"),
    ],
)
def test_it_prints_the_exact_balance_on_the_last_line(entries, printed):
    tenant = make_tenant("acme")
    for amount in entries:
        post_entry(tenant.pk, LedgerEntry.Kind.ADJUSTMENT, Decimal(amount))
    out = run("balance", "acme")
    assert out.splitlines()[-1] == printed


def test_it_refuses_a_balance_for_an_unknown_tenant():
    assert_refused("balance", "nobody", match="unknown tenant 'nobody'")


# checkledger


def settled_log(tenant, charge: str, entry: str | None = None, **fields):
    log = make_log(tenant, charge_usd=Decimal(charge), settled_at=timezone.now(), **fields)
    if entry is not None:
        post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal(entry), request_log=log)
    return log


def test_it_passes_a_consistent_ledger():
    tenant = make_tenant("acme")
    run("topup", "acme", "10")
    settled_log(tenant, "0.25", "-0.25")
    settled_log(tenant, "0")  # nothing owed: no entry needed
    make_log(tenant, charge_usd=Decimal("0.5"))  # logged, not settled yet
    make_tenant("empty")
    out = run("checkledger")
    assert out.splitlines()[-1] == "ok: 2 tenants, 2 entries checked"


def check_fails() -> str:
    err = io.StringIO()
    with pytest.raises(CommandError, match="ledger check failed") as caught:
        call_command("checkledger", stdout=io.StringIO(), stderr=err)
    assert caught.value.returncode == 1
    return err.getvalue()


def test_it_finds_a_balance_that_is_not_the_sum_of_entries():
    tenant = make_tenant("acme")
    run("topup", "acme", "10")
    Tenant.objects.filter(pk=tenant.pk).update(balance_usd=Decimal("11"))
    assert "tenant acme: balance 11.00 but its ledger entries sum to 10.00" in check_fails()


def test_it_finds_a_settled_log_without_its_charge():
    tenant = make_tenant("acme")
    settled_log(tenant, "0.3", request_id="req-missing")
    assert "request log req-missing (tenant acme): settled charge 0.30 has no ledger entry" in check_fails()


def test_it_finds_a_charge_of_the_wrong_amount():
    tenant = make_tenant("acme")
    settled_log(tenant, "0.3", "-0.2", request_id="req-wrong")
    assert "req-wrong" in check_fails()


def test_it_finds_a_charge_for_an_unsettled_log():
    tenant = make_tenant("acme")
    log = make_log(tenant, request_id="req-early", charge_usd=Decimal("0.1"))
    post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.1"), request_log=log)
    assert "request log req-early (tenant acme): has charge entry" in check_fails()


def test_it_finds_a_charge_on_another_tenant():
    acme, other = make_tenant("acme"), make_tenant("other")
    log = settled_log(acme, "0.1", request_id="req-moved")
    post_entry(other.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.1"), request_log=log)
    assert "charge entry" in check_fails()


# settle: tests/processes/test_settlement_sweep.py (TestSettleCommand)


# exportbilling


@pytest.fixture
def billing_logs():
    acme, other = make_tenant("acme"), make_tenant("other")
    key, _secret = make_key(acme)
    channel = make_channel("up-1", protocol="anthropic")
    t0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
    first = make_log(
        acme, key, request_id="req-1", created_at=t0, model="claude-x", channel=channel, protocol="anthropic",
        stream=True, status="cancelled", input_tokens=1200, output_tokens=34, cache_read_tokens=5,
        cache_write_tokens=6, usage_estimated=True, charge_usd=Decimal("0.0012345000"), settled_at=t0,
    )
    second = make_log(acme, key, request_id="req-2", created_at=t0 + dt.timedelta(hours=1), status="completed")
    third = make_log(other, request_id="req-3", created_at=t0 + dt.timedelta(days=1), status="rejected",
                     charge_usd=Decimal("0"))
    return key, first, second, third


def test_it_exports_csv_columns_and_values(billing_logs):
    key, *_ = billing_logs
    rows = list(csv.reader(io.StringIO(run("exportbilling"))))
    assert rows[0] == list(COLUMNS)
    assert rows[0][-3:] == ["charge_usd", "settled", "extras"]
    assert [row[0] for row in rows[1:]] == ["req-1", "req-2", "req-3"]
    assert rows[1] == [
        "req-1", "2025-03-01T12:00:00.000000Z", "acme", key.prefix, "claude-x", "up-1", "anthropic", "true",
        "cancelled", "1200", "34", "5", "6", "true", "0.0012345", "true", "",
    ]
    # No channel, charge not computed, not settled.
    assert rows[2][5] == "" and rows[2][7] == "false" and rows[2][-3:] == ["", "false", ""]
    # No key, a zero charge.
    assert rows[3][3] == "" and rows[3][-3:] == ["0.00", "false", ""]


def test_it_exports_jsonl_with_types(billing_logs):
    key, *_ = billing_logs
    lines = run("exportbilling", "--format", "jsonl").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["request_id"] for r in records] == ["req-1", "req-2", "req-3"]
    first = records[0]
    assert list(first) == list(COLUMNS)
    assert first == {
        "request_id": "req-1", "created_at": "2025-03-01T12:00:00.000000Z", "tenant": "acme", "api_key": key.prefix,
        "model": "claude-x", "channel": "up-1", "protocol": "anthropic", "stream": True, "status": "cancelled",
        "input_tokens": 1200, "output_tokens": 34, "cache_read_tokens": 5, "cache_write_tokens": 6,
        "usage_estimated": True, "charge_usd": "0.0012345", "settled": True, "extras": "",
    }
    assert records[1]["stream"] is False and records[1]["charge_usd"] == "" and records[1]["settled"] is False


def test_it_never_exports_a_key_secret():
    tenant = make_tenant("acme")
    key, secret = make_key(tenant)
    make_log(tenant, key)
    assert secret not in run("exportbilling", "--format", "jsonl")
    assert secret not in run("exportbilling")


def export_ids(*args: str) -> list[str]:
    return [json.loads(line)["request_id"] for line in run("exportbilling", "--format", "jsonl", *args).splitlines()]


def test_it_filters_by_tenant_and_time(billing_logs):
    assert export_ids("--tenant", "acme") == ["req-1", "req-2"]
    assert export_ids("--tenant", "other") == ["req-3"]
    assert export_ids("--since", "2025-03-01T12:30:00") == ["req-2", "req-3"]
    assert export_ids("--since", "2025-03-01T13:00:00Z") == ["req-2", "req-3"]  # inclusive
    assert export_ids("--until", "2025-03-01T13:00:00+00:00") == ["req-1"]  # exclusive
    assert export_ids("--since", "2025-03-02", "--until", "2025-03-03") == ["req-3"]
    assert export_ids("--until", "2025-03-01T14:00:00+02:00") == []  # 12:00 UTC, exclusive
    assert export_ids("--until", "2025-03-01T14:00:01+02:00") == ["req-1"]
    assert export_ids("--tenant", "acme", "--since", "2025-03-01T12:00:01") == ["req-2"]


def test_it_writes_an_export_file(billing_logs, tmp_path):
    target = tmp_path / "billing.csv"
    out = run("exportbilling", "-o", str(target), "--tenant", "acme")
    rows = list(csv.DictReader(target.open(newline="", encoding="utf-8")))
    assert [row["request_id"] for row in rows] == ["req-1", "req-2"]
    assert "wrote 2 rows" in out


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--since", "yesterday"], "--since: 'yesterday' is not an ISO 8601"),
        (["--until", "2025-13-01"], "--until.*ISO 8601"),
        (["--since", "2025-03-02", "--until", "2025-03-01"], "earlier than --until"),
        (["--tenant", "nobody"], "unknown tenant 'nobody'"),
        (["--format", "xml"], "--format: 'xml' is not one of csv, jsonl"),
    ],
)
def test_it_refuses_bad_export_options(args, match, tmp_path):
    target = tmp_path / "out.csv"
    assert_refused("exportbilling", *args, "-o", str(target), match=match)
    assert not target.exists()
