"""The operator commands createtenant and createapikey (the operator contract, docs/operations.md):
each success path, and every bad input failing with one line and nothing written."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.ledger import sum_of_entries
from billing.models import LedgerEntry
from tenants.models import ApiKey, Tenant
from tests.support.command_checks import assert_refused, run
from tests.support.factories import make_tenant

pytestmark = pytest.mark.django_db


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
    assert (key.allowed_models, key.rpm, key.concurrency, key.expires_at) == ([], None, None, None)


def test_it_issues_a_key_that_expires():
    from datetime import datetime, timezone

    make_tenant("acme")
    out = run("createapikey", "acme", "--expires", "2031-05-01T12:00")
    key = ApiKey.objects.authenticate(out.splitlines()[-1])
    assert key.expires_at == datetime(2031, 5, 1, 12, tzinfo=timezone.utc)
    assert "expires: 2031-05-01T12:00:00+00:00" in out


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
        (["acme", "--expires", "next week"], "--expires.*not an ISO 8601"),
        (["acme", "--expires", "2020-01-01"], "--expires.*already past"),
    ],
)
def test_it_refuses_bad_key_options(args, match):
    make_tenant("acme")
    assert_refused("createapikey", *args, match=match)
