"""The budget commands of the operator contract (docs/operations.md): setbudget,
budgets, and createapikey's --tpm and --budget-usd/--budget-period (G1, G4,
G5, G6). Each success path; every bad input fails with one line naming its
flag and writes nothing; a webhook's secret is printed once, on the last
line, stored encrypted and never listed; ``budgets --format jsonl`` spends
what ``exportbilling`` charges for the same rows, to the last digit."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.db import connection
from redis.exceptions import ConnectionError as RedisConnectionError

from billing.budgets import store as budget_store
from billing.budgets.windows import window_at
from billing.exports import utc_iso
from billing.models import Budget
from core.encryption import looks_like_token
from core.money import usd_text
from tenants.models import ApiKey
from tests.support.command_checks import assert_refused, run
from tests.support.factories import make_key, make_log, make_tenant

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2031, 5, 14, 10, 30, 15, tzinfo=dt.UTC)  # a Wednesday
JSONL_KEYS = ["scope", "tenant", "key_prefix", "period", "window_start", "window_end", "limit_usd", "spent_usd",
              "reserved_usd"]


@pytest.fixture(autouse=True)
def no_reservations(monkeypatch):
    """What budget_store holds reserved, as the test sets it (none by default)."""
    held: dict[int, Decimal] = {}
    monkeypatch.setattr(budget_store, "reserved_usd", lambda budget_id, window: held.get(budget_id, Decimal(0)))
    return held


@pytest.fixture
def frozen(monkeypatch):
    monkeypatch.setattr("django.utils.timezone.now", lambda: NOW)
    return NOW


@pytest.fixture
def acme():
    tenant = make_tenant("acme")
    key, _ = make_key(tenant, label="ci")
    return tenant, key


def stored_secret(budget: Budget) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT webhook_secret FROM billing_budget WHERE id = %s", [budget.pk])
        return cursor.fetchone()[0]


def table() -> list[dict]:
    return list(Budget.objects.order_by("pk").values())


# setbudget


def test_it_sets_a_tenants_budget(acme, frozen):
    out = run("setbudget", "--tenant", "acme", "--usd", "12.5", "--period", "1d")
    budget = Budget.objects.get()
    assert (budget.tenant, budget.api_key, budget.period, budget.limit_usd) == (acme[0], None, "1d", Decimal("12.5"))
    assert (budget.alert_at_pct, budget.webhook_url, budget.webhook_secret) == (None, "", "")
    assert "set the daily (1d) budget of tenant acme: 12.50 USD" in out
    assert "from 2031-05-14T00:00:00.000000Z until 2031-05-15T00:00:00.000000Z" in out


def test_it_sets_a_keys_budget_by_a_prefix_and_spells_periods_one_way(acme):
    _, key = acme
    run("setbudget", "--key", key.prefix[:8], "--usd", "3", "--period", "30")
    budget = Budget.objects.get()
    assert (budget.tenant_id, budget.api_key, budget.period, budget.scope) == (key.tenant_id, key, "30s", "key")


def test_it_changes_a_budget_and_keeps_its_alert_and_webhook(acme):
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1w", "--alert-at", "80",
        "--webhook", "https://hooks.example/acme")
    secret = Budget.objects.get().webhook_secret
    out = run("setbudget", "--tenant", "acme", "--usd", "20", "--period", "1w")
    budget = Budget.objects.get()
    assert (budget.limit_usd, budget.alert_at_pct) == (Decimal(20), 80)
    assert budget.webhook_url == "https://hooks.example/acme"
    assert budget.webhook_secret == secret  # the receiver's secret is not changed under it
    assert out.startswith("changed the weekly (1w) budget") and secret not in out


def test_tenant_and_key_budgets_of_one_period_are_apart(acme):
    _, key = acme
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1mo")
    run("setbudget", "--key", key.prefix, "--usd", "2", "--period", "1mo")
    assert sorted((b.scope, b.limit_usd) for b in Budget.objects.all()) == [("key", 2), ("tenant", 10)]


def test_usd_0_removes_that_budget_only(acme):
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d")
    run("setbudget", "--tenant", "acme", "--usd", "50", "--period", "1mo")
    out = run("setbudget", "--tenant", "acme", "--usd", "0", "--period", "1d")
    assert out.strip() == "removed the 1d budget of tenant acme"
    assert list(Budget.objects.values_list("period", flat=True)) == ["1mo"]


def test_removing_a_budget_that_does_not_exist_names_the_period(acme):
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d")
    assert_refused("setbudget", "--tenant", "acme", "--usd", "0", "--period", "1h", match="^--period: .*no 1h budget")


def test_a_webhook_secret_is_printed_once_on_the_last_line_and_stored_encrypted(acme):
    out = run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d", "--alert-at", "75",
              "--webhook", "https://hooks.example/acme")
    *lines, secret = out.splitlines()
    assert len(secret) >= 40 and " " not in secret
    assert all(secret not in line for line in lines)
    budget = Budget.objects.get()
    assert (budget.webhook_secret, budget.alert_at_pct) == (secret, 75)
    raw = stored_secret(budget)
    assert looks_like_token(raw) and secret not in raw
    # Given again, the flag makes another secret.
    again = run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d", "--webhook",
                "https://hooks.example/acme").splitlines()[-1]
    assert again != secret and Budget.objects.get().webhook_secret == again
    # Never listed.
    assert again not in run("budgets") + run("budgets", "--format", "jsonl")


def test_an_alert_threshold_needs_no_webhook(acme):
    out = run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d", "--alert-at", "100")
    assert "alert at: 100%; webhook: none (alerts recorded, not posted)" in out
    assert Budget.objects.get().alert_at_pct == 100


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--tenant", "acme", "--usd", "-1", "--period", "1d"], "^--usd: .*must not be negative"),
        (["--tenant", "acme", "--usd", "ten", "--period", "1d"], "^--usd: .*not a number"),
        (["--tenant", "acme", "--usd", "Infinity", "--period", "1d"], "^--usd: .*finite"),
        (["--tenant", "acme", "--usd", "0.00000000001", "--period", "1d"], "^--usd: .*decimal places"),
        (["--tenant", "acme", "--usd", "5", "--period", "1y"], "^--period: .*not a period"),
        (["--tenant", "acme", "--usd", "5", "--period", "0s"], "^--period: .*not a period"),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--alert-at", "0"], "^--alert-at: .*1 to 100"),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--alert-at", "101"], "^--alert-at: .*1 to 100"),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--alert-at", "50.5"], "^--alert-at: .*1 to 100"),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--webhook", "ftp://hooks.example/x"],
         "^--webhook: .*not an http"),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--webhook", "javascript:alert(1)"],
         "^--webhook: .*not an http"),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--webhook", "hooks.example"], "^--webhook: "),
        (["--tenant", "acme", "--usd", "5", "--period", "1d", "--webhook", "https://h.example/" + "x" * 500],
         "^--webhook: longer than 500"),
        (["--tenant", "nobody", "--usd", "5", "--period", "1d"], "^--tenant: unknown tenant 'nobody'"),
        (["--key", "hb-nothing", "--usd", "5", "--period", "1d"], "^--key: no key has the prefix 'hb-nothing'"),
        (["--key", "hb-", "--usd", "5", "--period", "1d"], "^--key: .*more than one key"),
        (["--tenant", "acme", "--key", "hb-", "--usd", "5", "--period", "1d"], "--tenant NAME or --key PREFIX"),
        (["--usd", "5", "--period", "1d"], "--tenant NAME or --key PREFIX"),
        (["--tenant", "acme", "--usd", "0", "--period", "1d", "--webhook", "https://h.example/"],
         "^--webhook does not apply with --usd 0"),
        (["--tenant", "acme", "--usd", "0", "--period", "1d", "--alert-at", "50"],
         "^--alert-at does not apply with --usd 0"),
        (["--tenant", "acme", "--period", "1d"], "--usd"),
        (["--tenant", "acme", "--usd", "5"], "--period"),
    ],
)
def test_it_refuses_bad_input_naming_the_flag_and_saves_nothing(acme, args, match):
    make_key(acme[0])  # a second key: "hb-" starts both
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d", "--alert-at", "50")
    before = table()
    assert_refused("setbudget", *args, match=match)
    assert table() == before


def test_it_refuses_a_budget_on_a_revoked_key_but_removes_one(acme):
    _, key = acme
    run("setbudget", "--key", key.prefix, "--usd", "1", "--period", "1d")
    key.revoke()
    assert_refused("setbudget", "--key", key.prefix, "--usd", "2", "--period", "1d", match="^--key: .*revoked")
    run("setbudget", "--key", key.prefix, "--usd", "0", "--period", "1d")
    assert not Budget.objects.exists()


# budgets


@pytest.fixture
def spending(acme, frozen):
    """acme spends through two keys in and out of the current windows; bob
    spends beside it. Charges of every shape: unsettled, tiny, none yet."""
    tenant, key = acme
    other_key, _ = make_key(tenant, label="other")
    bob = make_tenant("bob")
    day = window_at("1d", NOW)
    charges = [
        (key, day.start, "0.0000012345", True),
        (key, day.start + dt.timedelta(hours=3), "1.25", False),  # charged, not yet in the ledger
        (key, NOW, None, False),  # no charge computed yet: spends nothing
        (other_key, day.start + dt.timedelta(hours=1), "0.3333333333", True),
        (key, day.start - dt.timedelta(microseconds=1), "7", True),  # yesterday: this month, not today
        (key, dt.datetime(2031, 4, 30, 23, 59, tzinfo=dt.UTC), "100", True),  # last month: total only
    ]
    for owner, created_at, charge, settled in charges:
        make_log(tenant, owner, created_at=created_at, charge_usd=Decimal(charge) if charge else None,
                 settled_at=created_at if settled else None)
    make_log(bob, make_key(bob)[0], created_at=day.start + dt.timedelta(hours=1), charge_usd=Decimal("9"))
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1d")
    run("setbudget", "--tenant", "acme", "--usd", "1000", "--period", "total")
    run("setbudget", "--key", key.prefix, "--usd", "50", "--period", "1mo")
    run("setbudget", "--tenant", "bob", "--usd", "5", "--period", "1d")
    return tenant, key


def exported_sum(since: dt.datetime, until: dt.datetime | None, tenant: str, key_prefix: str | None) -> str:
    """What ``exportbilling`` charges for a budget's rows."""
    args = ["exportbilling", "--format", "jsonl", "--tenant", tenant, "--since", since.isoformat()]
    rows = [json.loads(line) for line in run(*args, *(["--until", until.isoformat()] if until else [])).splitlines()]
    return usd_text(sum((Decimal(row["charge_usd"]) for row in rows
                         if row["charge_usd"] and key_prefix in (None, row["api_key"])), Decimal(0)))


def test_budgets_jsonl_has_the_contracts_keys_and_spends_what_the_export_charges(spending, no_reservations):
    tenant, key = spending
    no_reservations[Budget.objects.get(api_key=key).pk] = Decimal("0.0421")
    objects = [json.loads(line) for line in run("budgets", "--tenant", "acme", "--format", "jsonl").splitlines()]
    assert [list(found) for found in objects] == [JSONL_KEYS] * 3
    day, month = window_at("1d", NOW), window_at("1mo", NOW)
    assert objects == [
        {"scope": "tenant", "tenant": "acme", "key_prefix": None, "period": "1d",
         "window_start": "2031-05-14T00:00:00.000000Z", "window_end": "2031-05-15T00:00:00.000000Z",
         "limit_usd": "10.00", "spent_usd": "1.5833345678", "reserved_usd": "0.00"},
        {"scope": "tenant", "tenant": "acme", "key_prefix": None, "period": "total",
         "window_start": "1970-01-01T00:00:00.000000Z", "window_end": None,
         "limit_usd": "1000.00", "spent_usd": "108.5833345678", "reserved_usd": "0.00"},
        {"scope": "key", "tenant": "acme", "key_prefix": key.prefix, "period": "1mo",
         "window_start": utc_iso(month.start), "window_end": "2031-06-01T00:00:00.000000Z",
         "limit_usd": "50.00", "spent_usd": "8.2500012345", "reserved_usd": "0.0421"},
    ]
    assert objects[0]["spent_usd"] == exported_sum(day.start, day.end, "acme", None)
    assert objects[1]["spent_usd"] == exported_sum(dt.datetime(1970, 1, 1, tzinfo=dt.UTC), None, "acme", None)
    assert objects[2]["spent_usd"] == exported_sum(month.start, month.end, "acme", key.prefix)


def test_budgets_lists_every_tenant_one_line_each_in_text(spending, no_reservations):
    _, key = spending
    no_reservations[Budget.objects.get(api_key=key).pk] = Decimal("0.5")
    lines = run("budgets").splitlines()
    assert len(lines) == 4
    assert lines[0] == ("tenant acme - 1d 2031-05-14T00:00:00Z -> 2031-05-15T00:00:00Z limit 10.00 "
                        "spent 1.5833345678 reserved 0.00 USD")
    assert lines[1].startswith("tenant acme - total 1970-01-01T00:00:00Z -> never limit 1000.00")
    assert lines[2] == (f"key    acme {key.prefix} 1mo 2031-05-01T00:00:00Z -> 2031-06-01T00:00:00Z limit 50.00 "
                        "spent 8.2500012345 reserved 0.50 USD")
    assert lines[3].startswith("tenant bob - 1d") and "spent 9.00 " in lines[3]


def test_budgets_says_when_reservations_are_unknown(spending, monkeypatch):
    def unreachable(budget_id, window):
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(budget_store, "reserved_usd", unreachable)
    objects = [json.loads(line) for line in run("budgets", "--format", "jsonl").splitlines()]
    assert [found["reserved_usd"] for found in objects] == [None] * 4
    assert "reserved unknown" in run("budgets").splitlines()[0]


def test_budgets_of_none_is_empty():
    make_tenant("acme")
    assert run("budgets", "--tenant", "acme", "--format", "jsonl") == ""


@pytest.mark.parametrize(
    ("args", "match"),
    [(["--tenant", "nobody"], "^--tenant: unknown tenant 'nobody'"), (["--format", "xml"], "^--format: 'xml'")],
)
def test_budgets_refuses_bad_input_naming_the_flag(args, match):
    assert_refused("budgets", *args, match=match)


# createapikey --tpm --budget-usd --budget-period


def test_createapikey_sets_tpm_and_makes_the_keys_budget():
    tenant = make_tenant("acme")
    out = run("createapikey", "acme", "--tpm", "20000", "--budget-usd", "25.5", "--budget-period", "1MO")
    key = ApiKey.objects.authenticate(out.splitlines()[-1])
    assert key.tpm == 20000
    budget = Budget.objects.get()
    assert (budget.tenant, budget.api_key, budget.period, budget.limit_usd) == (tenant, key, "1mo", Decimal("25.5"))
    assert "tpm: 20000" in out and "budget: 25.50 USD monthly (1mo)" in out


def test_createapikey_without_budget_flags_makes_no_budget():
    make_tenant("acme")
    key = ApiKey.objects.authenticate(run("createapikey", "acme").splitlines()[-1])
    assert key.tpm is None and not Budget.objects.exists()


def test_createapikey_makes_no_key_when_its_budget_cannot_be_made(monkeypatch):
    make_tenant("acme")

    def broken(**fields):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(Budget.objects, "create", broken)
    with pytest.raises(RuntimeError):
        run("createapikey", "acme", "--budget-usd", "1", "--budget-period", "1d")
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--tpm", "0"], "^--tpm: .*at least 1"),
        (["--tpm", "many"], "^--tpm: .*not a whole number"),
        (["--tpm", "99999999999"], "^--tpm: .*too large"),
        (["--budget-usd", "5"], "^--budget-period is required with --budget-usd"),
        (["--budget-period", "1d"], "^--budget-usd is required with --budget-period"),
        (["--budget-usd", "-5", "--budget-period", "1d"], "^--budget-usd: .*must not be negative"),
        (["--budget-usd", "0", "--budget-period", "1d"], "^--budget-usd: .*more than zero"),
        (["--budget-usd", "five", "--budget-period", "1d"], "^--budget-usd: .*not a number"),
        (["--budget-usd", "5", "--budget-period", "fortnight"], "^--budget-period: .*not a period"),
    ],
)
def test_createapikey_refuses_bad_tpm_and_budget_flags(args, match):
    make_tenant("acme")
    assert_refused("createapikey", "acme", *args, match=match)
