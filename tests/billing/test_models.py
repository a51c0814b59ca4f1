"""What the database itself guarantees, and the model methods built on it."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from billing.ledger import post_entry, sum_of_entries, top_up
from billing.models import LedgerEntry, ModelPrice
from channels_pool.models import Channel
from tenants.models import ApiKey, Tenant, hash_secret
from tests.support.factories import make_channel, make_key, make_log, make_price, make_tenant

pytestmark = pytest.mark.django_db


def refused(create) -> None:
    """The write is refused by the database (inside a savepoint, so the
    test's transaction stays usable)."""
    with pytest.raises(IntegrityError), transaction.atomic():
        create()


# Keys


def test_it_refuses_a_duplicate_key_hash():
    key, _secret = make_key()
    refused(lambda: ApiKey.objects.create(tenant=key.tenant, prefix="hb-x", key_hash=key.key_hash))


def test_it_refuses_a_key_hash_that_is_not_sha256():
    tenant = make_tenant()
    refused(lambda: ApiKey.objects.create(tenant=tenant, prefix="hb-x", key_hash="plain-secret"))


def test_it_refuses_a_zero_rate_limit():
    tenant = make_tenant()
    refused(lambda: ApiKey.objects.issue(tenant, rpm=0))
    refused(lambda: ApiKey.objects.issue(tenant, concurrency=0))


def test_it_stores_only_the_hash_of_a_key():
    key, secret = make_key()
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    assert row["key_hash"] == hash_secret(secret)
    assert all(secret not in str(value) for value in row.values())


def test_it_authenticates_a_live_key():
    key, secret = make_key()
    found = ApiKey.objects.authenticate(secret)
    assert found == key and found.tenant == key.tenant


def test_it_ignores_revoked_keys():
    key, secret = make_key()
    key.revoke()
    assert ApiKey.objects.authenticate(secret) is None


def test_it_ignores_unknown_and_foreign_looking_secrets():
    _key, secret = make_key()
    assert ApiKey.objects.authenticate(secret + "x") is None
    assert ApiKey.objects.authenticate("sk-" + secret[3:]) is None
    assert ApiKey.objects.authenticate("") is None


# Channels


def test_it_refuses_a_non_positive_weight():
    refused(lambda: make_channel(weight=0))


def test_it_refuses_an_unknown_protocol():
    refused(lambda: make_channel(protocol="grpc"))


def test_it_refuses_a_zero_channel_capacity():
    refused(lambda: make_channel(max_concurrency=0))


def test_it_refuses_a_duplicate_channel_name():
    make_channel("up-1")
    refused(lambda: make_channel("up-1"))


def test_it_lists_enabled_channels_serving_a_model():
    serving = make_channel("a", served_models=["m1", "m2"])
    make_channel("b", served_models=["m2"], enabled=False)
    make_channel("c", served_models=["m3"])
    assert Channel.objects.enabled().serving("m1") == [serving]


# Prices


def test_it_refuses_a_negative_price():
    refused(lambda: make_price(input_usd_per_mtok=Decimal("-1")))
    refused(lambda: make_price(cache_write_usd_per_mtok=Decimal("-0.01")))


def test_it_refuses_two_prices_for_one_model_at_one_moment():
    moment = timezone.now()
    make_price("m", effective_from=moment)
    refused(lambda: make_price("m", effective_from=moment))


def test_it_picks_the_price_in_force_at_a_moment():
    now = timezone.now()
    old = make_price("m", effective_from=now - dt.timedelta(days=10), input_usd_per_mtok=Decimal("1"))
    new = make_price("m", effective_from=now - dt.timedelta(days=1), input_usd_per_mtok=Decimal("2"))
    future = make_price("m", effective_from=now + dt.timedelta(days=1), input_usd_per_mtok=Decimal("3"))
    other = make_price("n", effective_from=now - dt.timedelta(days=5))
    assert ModelPrice.objects.in_force()["m"] == new
    assert ModelPrice.objects.in_force(now - dt.timedelta(days=5))["m"] == old
    assert ModelPrice.objects.in_force(now - dt.timedelta(days=1))["m"] == new  # from its first moment
    assert ModelPrice.objects.in_force(now + dt.timedelta(days=2))["m"] == future
    assert "m" not in ModelPrice.objects.in_force(now - dt.timedelta(days=11))
    assert ModelPrice.objects.in_force()["n"] == other


# Request logs and the ledger


def test_it_refuses_an_unknown_log_status():
    refused(lambda: make_log(status="lost"))


def test_it_refuses_a_second_charge_for_one_request_log():
    tenant = make_tenant()
    log = make_log(tenant, charge_usd=Decimal("0.1"))
    post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.1"), request_log=log)
    refused(lambda: post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.1"), request_log=log))
    tenant.refresh_from_db()
    assert tenant.balance_usd == Decimal("-0.1") == sum_of_entries(tenant)


def test_it_refuses_a_charge_that_credits():
    tenant = make_tenant()
    log = make_log(tenant)
    refused(lambda: post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("0.5"), request_log=log))
    assert not LedgerEntry.objects.exists()
    tenant.refresh_from_db()
    assert tenant.balance_usd == 0


def test_it_refuses_a_charge_without_a_request_log():
    tenant = make_tenant()
    refused(lambda: post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.5")))


def test_it_refuses_a_top_up_that_debits():
    tenant = make_tenant()
    refused(lambda: post_entry(tenant.pk, LedgerEntry.Kind.TOPUP, Decimal("-5")))
    with pytest.raises(ValueError):
        top_up(tenant, Decimal("0"))


def test_it_refuses_an_unknown_entry_kind():
    tenant = make_tenant()
    refused(lambda: post_entry(tenant.pk, "gift", Decimal("5")))


def test_posting_keeps_the_balance_equal_to_the_sum_of_entries():
    tenant = make_tenant()
    top_up(tenant, Decimal("10"))
    logs = [make_log(tenant, charge_usd=Decimal(c)) for c in ("0.0000000001", "1.2345678901", "3")]
    for log in logs:
        post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, -log.charge_usd, request_log=log)
    post_entry(tenant.pk, LedgerEntry.Kind.ADJUSTMENT, Decimal("0.25"), note="goodwill")
    tenant.refresh_from_db()
    expected = Decimal("10") - Decimal("4.2345678902") + Decimal("0.25")
    assert tenant.balance_usd == expected == sum_of_entries(tenant)
    last = LedgerEntry.objects.order_by("-id").first()
    assert last.balance_after_usd == expected


def test_each_entry_records_the_balance_right_after_it():
    tenant = make_tenant()
    top_up(tenant, Decimal("5"))
    top_up(tenant, Decimal("2.5"))
    post_entry(tenant.pk, LedgerEntry.Kind.ADJUSTMENT, Decimal("-1"))
    assert list(LedgerEntry.objects.order_by("id").values_list("balance_after_usd", flat=True)) == [
        Decimal("5"), Decimal("7.5"), Decimal("6.5"),
    ]


def test_a_tenant_with_history_cannot_be_deleted():
    tenant = make_tenant()
    top_up(tenant, Decimal("1"))
    with pytest.raises(ProtectedError), transaction.atomic():
        tenant.delete()
    assert Tenant.objects.filter(pk=tenant.pk).exists()
