"""The operator commands (DESIGN.md, operator contract): each success path, and
every bad input failing with one line and nothing written."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import subprocess
import sys
from decimal import Decimal

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from billing.exports import COLUMNS
from billing.ledger import post_entry, sum_of_entries
from billing.models import LedgerEntry, ModelPrice, RequestLog
from channels_pool.models import Channel
from hopbase.models import ApiKey, Tenant
from tests.factories import make_channel, make_key, make_log, make_price, make_tenant

pytestmark = pytest.mark.django_db

ALL_MODELS = (Tenant, ApiKey, Channel, ModelPrice, LedgerEntry, RequestLog)


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in ALL_MODELS}


def assert_refused(*args: str, match: str) -> CommandError:
    """The command fails with one clear line and writes nothing."""
    before = counts()
    with pytest.raises(CommandError, match=match) as caught:
        run(*args)
    message = str(caught.value)
    assert message and "\n" not in message
    assert counts() == before
    return caught.value


# createtenant


def test_it_creates_a_tenant():
    out = run("createtenant", "acme")
    tenant = Tenant.objects.get(name="acme")
    assert tenant.balance_usd == 0
    assert not LedgerEntry.objects.exists()
    assert "acme" in out


def test_it_funds_a_new_tenant_through_the_ledger():
    run("createtenant", "acme", "--balance", "12.5")
    tenant = Tenant.objects.get(name="acme")
    entry = LedgerEntry.objects.get(tenant=tenant)
    assert entry.kind == LedgerEntry.Kind.TOPUP
    assert entry.amount_usd == Decimal("12.5")
    assert tenant.balance_usd == Decimal("12.5") == sum_of_entries(tenant)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--balance", "-1"], "--balance.*negative"),
        (["--balance", "ten"], "--balance.*not a number"),
        (["--balance", "NaN"], "--balance.*finite"),
        (["--balance", "0.00000000001"], "--balance.*decimal places"),
        (["--balance", "1e12"], "--balance.*too large"),
    ],
)
def test_it_refuses_a_bad_opening_balance(args, match):
    assert_refused("createtenant", "acme", *args, match=match)


def test_it_refuses_a_duplicate_tenant():
    make_tenant("acme")
    assert_refused("createtenant", "acme", "--balance", "5", match="already exists")


def test_it_refuses_an_empty_tenant_name():
    assert_refused("createtenant", "  ", match="must not be empty")


# createapikey


def test_it_issues_a_key_whose_secret_is_printed_last_and_not_stored():
    tenant = make_tenant("acme")
    out = run("createapikey", "acme", "--name", "ci", "--models", "gpt-a, gpt-b", "--rpm", "60", "--concurrency", "4")
    secret = out.splitlines()[-1]
    key = ApiKey.objects.authenticate(secret)
    assert key is not None and key.tenant == tenant
    assert (key.label, key.allowed_models, key.rpm, key.concurrency) == ("ci", ["gpt-a", "gpt-b"], 60, 4)
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    assert all(secret not in str(value) for value in row.values())
    assert secret.startswith(row["prefix"])
    assert secret not in "\n".join(out.splitlines()[:-1])


def test_it_issues_an_unlimited_key_for_every_model_by_default():
    make_tenant("acme")
    secret = run("createapikey", "acme").splitlines()[-1]
    key = ApiKey.objects.authenticate(secret)
    assert (key.allowed_models, key.rpm, key.concurrency) == ([], None, None)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["nobody"], "unknown tenant 'nobody'"),
        (["acme", "--models", " , "], "--models.*at least one model"),
        (["acme", "--rpm", "0"], "--rpm.*at least 1"),
        (["acme", "--rpm", "-3"], "--rpm.*at least 1"),
        (["acme", "--rpm", "fast"], "--rpm.*not a whole number"),
        (["acme", "--concurrency", "0"], "--concurrency.*at least 1"),
        (["acme", "--concurrency", "99999999999"], "--concurrency.*too large"),
        (["acme", "--name", "x" * 101], "--name.*longer than"),
    ],
)
def test_it_refuses_bad_key_options(args, match):
    make_tenant("acme")
    assert_refused("createapikey", *args, match=match)


# addchannel

CHANNEL_ARGS = ["--protocol", "openai", "--base-url", "http://127.0.0.1:9100/v1", "--api-key", "sk-up-123",
                "--models", "gpt-a,gpt-b"]


def test_it_adds_a_channel_without_echoing_its_secret():
    out = run("addchannel", "up-1", *CHANNEL_ARGS, "--priority", "5", "--weight", "3", "--max-concurrency", "10")
    channel = Channel.objects.get(name="up-1")
    assert channel.protocol == "openai"
    assert channel.base_url == "http://127.0.0.1:9100/v1"
    assert channel.secret == "sk-up-123"
    assert channel.served_models == ["gpt-a", "gpt-b"]
    assert (channel.priority, channel.weight, channel.max_concurrency, channel.enabled) == (5, 3, 10, True)
    assert "sk-up-123" not in out


def test_it_adds_a_channel_with_defaults_and_a_single_label_host():
    run("addchannel", "sim", "--protocol", "anthropic", "--base-url", "http://simulator:9000",
        "--api-key", "k", "--models", "claude-x", "--priority", "-2")
    channel = Channel.objects.get(name="sim")
    assert (channel.priority, channel.weight, channel.max_concurrency) == (-2, 1, None)


@pytest.mark.parametrize(
    ("replace", "match"),
    [
        ({"--protocol": "grpc"}, "--protocol: 'grpc' is not one of openai, anthropic, gemini"),
        ({"--base-url": "ftp://host/v1"}, "--base-url.*not an http"),
        ({"--base-url": "http:///v1"}, "--base-url.*names no host"),
        ({"--base-url": "localhost:8000"}, "--base-url.*not an http"),
        ({"--base-url": "http://host:port/v1"}, "--base-url.*bad port"),
        ({"--models": ","}, "--models.*at least one model"),
        ({"--api-key": " "}, "--api-key must not be empty"),
    ],
)
def test_it_refuses_bad_channel_options(replace, match):
    args = list(CHANNEL_ARGS)
    for option, value in replace.items():
        args[args.index(option) + 1] = value
    error = assert_refused("addchannel", "up-1", *args, match=match)
    assert "sk-up-123" not in str(error)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--weight", "0"], "--weight.*at least 1"),
        (["--weight", "-1"], "--weight.*at least 1"),
        (["--max-concurrency", "0"], "--max-concurrency.*at least 1"),
        (["--priority", "high"], "--priority.*not a whole number"),
    ],
)
def test_it_refuses_bad_channel_numbers(extra, match):
    assert_refused("addchannel", "up-1", *CHANNEL_ARGS, *extra, match=match)


def test_it_refuses_a_duplicate_channel():
    make_channel("up-1")
    assert_refused("addchannel", "up-1", *CHANNEL_ARGS, match="already exists")


# setprice


def test_it_adds_a_price_row_and_keeps_the_old_one():
    old = make_price("gpt-a", effective_from=timezone.now() - dt.timedelta(days=1))
    run("setprice", "gpt-a", "--input", "2.5", "--output", "10", "--cache-read", "1.25", "--cache-write", "3.125")
    assert ModelPrice.objects.filter(model="gpt-a").count() == 2
    old_again = ModelPrice.objects.get(pk=old.pk)
    assert (old_again.input_usd_per_mtok, old_again.output_usd_per_mtok) == (Decimal("1"), Decimal("2"))
    current = ModelPrice.objects.in_force()["gpt-a"]
    assert current.pk != old.pk
    assert current.input_usd_per_mtok == Decimal("2.5")
    assert current.output_usd_per_mtok == Decimal("10")
    assert current.cache_read_usd_per_mtok == Decimal("1.25")
    assert current.cache_write_usd_per_mtok == Decimal("3.125")


def test_it_prices_cache_tokens_at_zero_unless_told():
    run("setprice", "gpt-a", "--input", "1", "--output", "2")
    price = ModelPrice.objects.get(model="gpt-a")
    assert price.cache_read_usd_per_mtok == price.cache_write_usd_per_mtok == 0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--input", "-1", "--output", "2"], "--input.*negative"),
        (["--input", "1", "--output", "two"], "--output.*not a number"),
        (["--input", "1", "--output", "2", "--cache-read", "-0.5"], "--cache-read.*negative"),
        (["--input", "1", "--output", "2", "--cache-write", "inf"], "--cache-write.*finite"),
        (["--input", "0.0000001", "--output", "2"], "--input.*decimal places"),
    ],
)
def test_it_refuses_bad_prices(args, match):
    assert_refused("setprice", "gpt-a", *args, match=match)


def test_it_refuses_a_bad_model_name():
    assert_refused("setprice", "gpt a", "--input", "1", "--output", "2", match="whitespace")
    assert_refused("setprice", "a,b", "--input", "1", "--output", "2", match="not one model name")


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


# settle: tests/test_settlement.py (TestSettleCommand)


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
    assert rows[0][-1] == "settled" and rows[0][-2] == "charge_usd"
    assert [row[0] for row in rows[1:]] == ["req-1", "req-2", "req-3"]
    assert rows[1] == [
        "req-1", "2025-03-01T12:00:00.000000Z", "acme", key.prefix, "claude-x", "up-1", "anthropic", "true",
        "cancelled", "1200", "34", "5", "6", "true", "0.0012345", "true",
    ]
    # No channel, charge not computed, not settled.
    assert rows[2][5] == "" and rows[2][7] == "false" and rows[2][-2:] == ["", "false"]
    # No key, a zero charge.
    assert rows[3][3] == "" and rows[3][-2:] == ["0.00", "false"]


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
        "usage_estimated": True, "charge_usd": "0.0012345", "settled": True,
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


# From the command line: exit status and a single stderr line.


def manage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )


def test_a_bad_value_exits_non_zero_with_one_line():
    result = manage("setprice", "gpt-a", "--input", "-1", "--output", "1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["CommandError: --input: '-1' must not be negative"]


@pytest.mark.parametrize(
    "argv",
    [["topup"], ["balance"], ["createapikey"], ["addchannel", "x"], ["setprice", "m", "--input", "1"], ["checkledger", "--nope"]],
)
def test_a_usage_mistake_is_one_line_on_stderr_and_a_failed_exit(argv):
    import subprocess
    import sys

    from django.conf import settings

    done = subprocess.run([sys.executable, "manage.py", *argv], cwd=settings.BASE_DIR, capture_output=True, text=True)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""
