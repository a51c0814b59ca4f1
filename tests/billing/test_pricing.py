"""Pricing: tokens x prices in exact decimals, one rounding, the price in
force when the request was made; and the hot path's cached books."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from billing.balances import BalanceBook, load_exhausted_tenants
from billing.ledger import post_entry, top_up
from billing.models import ModelPrice, RequestLog
from billing.pricing import (
    PriceBook,
    PriceHistory,
    Unpriced,
    charge_for,
    is_priced,
    load_priced_models,
    price_at,
)
from tests.support.factories import make_price, make_tenant

ONE = Decimal("1")


def price(input="3", output="15", cache_read="0.3", cache_write="3.75") -> ModelPrice:
    return ModelPrice(
        model="m",
        input_usd_per_mtok=Decimal(input),
        output_usd_per_mtok=Decimal(output),
        cache_read_usd_per_mtok=Decimal(cache_read),
        cache_write_usd_per_mtok=Decimal(cache_write),
    )


def log(status="completed", input=0, output=0, cache_read=0, cache_write=0, **fields) -> RequestLog:
    return RequestLog(
        status=status, input_tokens=input, output_tokens=output, cache_read_tokens=cache_read,
        cache_write_tokens=cache_write, model="m", created_at=timezone.now(), **fields,
    )


def test_it_prices_each_token_class_per_million():
    charge = charge_for(log(input=1000, output=333, cache_read=2000, cache_write=100), price(), ONE)
    # 1000*3 + 333*15 + 2000*0.3 + 100*3.75 = 3000 + 4995 + 600 + 375 = 8970 micro-USD
    assert charge == Decimal("0.008970")


def test_thinking_is_billed_inside_output_not_on_top():
    assert charge_for(log(output=100, thinking_tokens=60), price(), ONE) == Decimal("0.0015")


def test_it_applies_the_tenant_multiplier():
    assert charge_for(log(input=1_000_000), price(), Decimal("0.8")) == Decimal("2.4")
    assert charge_for(log(input=1_000_000), price(), Decimal("1.2345")) == Decimal("3.7035")
    assert charge_for(log(input=1_000_000), price(), Decimal("0")) == 0


def test_the_charge_has_the_ledgers_ten_decimal_places():
    charge = charge_for(log(input=7), price(input="0.123457"), ONE)
    assert charge == Decimal("0.0000008642") and charge.as_tuple().exponent == -10


@pytest.mark.parametrize(
    "rate,expected",
    [
        ("0.000050", "0.0000000001"),  # exactly half of the last place: up
        ("0.000049", "0.0000000000"),  # just under half: down
        ("0.000150", "0.0000000002"),  # 1.5 places: up (not to even)
        ("0.000149", "0.0000000001"),
    ],
)
def test_it_rounds_half_up_at_the_tenth_decimal(rate, expected):
    assert charge_for(log(input=1), price(input=rate), ONE) == Decimal(expected)


def test_it_rounds_once_after_summing_not_per_token_class():
    # Each class alone is 0.4e-10 (rounds to 0); together 1.2e-10 -> 1e-10.
    rates = price(input="0.000040", output="0.000040", cache_read="0.000040", cache_write="0")
    assert charge_for(log(input=1, output=1, cache_read=1), rates, ONE) == Decimal("1E-10")


def test_it_rounds_after_the_multiplier():
    # 1 token at 0.00005/M = 0.5e-10; x3 = 1.5e-10 -> 2e-10 (rounding first would give 3e-10).
    assert charge_for(log(input=1), price(input="0.000050"), Decimal("3")) == Decimal("2E-10")


def test_it_stays_exact_for_huge_counts_and_prices():
    # 10^15 x 99999999.999999 / 10^6 + (10^15 + 1) x 1 / 10^6, to the last digit.
    charge = charge_for(log(input=10**15, output=10**15 + 1), price(input="99999999.999999", output="1"), ONE)
    assert charge == Decimal("100000000999999000.000001")


@pytest.mark.parametrize("status", ["failed", "rejected"])
def test_failed_and_rejected_requests_cost_nothing_and_need_no_price(status):
    assert charge_for(log(status, input=1000, output=1000), None, ONE) == 0


def test_a_request_without_tokens_costs_nothing_and_needs_no_price():
    assert charge_for(log("cancelled"), None, ONE) == 0


def test_a_billable_request_without_a_price_is_refused():
    with pytest.raises(Unpriced):
        charge_for(log(input=1), None, ONE)


# Price history


@pytest.fixture
def history(db):
    t0 = timezone.now() - dt.timedelta(days=10)
    t1 = t0 + dt.timedelta(days=5)
    make_price("gpt-h", input_usd_per_mtok=Decimal("1"), effective_from=t0)
    make_price("gpt-h", input_usd_per_mtok=Decimal("2"), effective_from=t1)
    make_price("gpt-h", input_usd_per_mtok=Decimal("9"), effective_from=timezone.now() + dt.timedelta(days=1))
    make_price("other", input_usd_per_mtok=Decimal("5"), effective_from=t0)
    return t0, t1


@pytest.mark.django_db
def test_it_uses_the_price_in_force_when_the_request_was_made(history):
    t0, t1 = history
    cases = {
        t0 - dt.timedelta(seconds=1): None,
        t0: Decimal("1"),  # effective_from is inclusive
        t1 - dt.timedelta(microseconds=1): Decimal("1"),
        t1: Decimal("2"),
        timezone.now(): Decimal("2"),  # the future price is not in force yet
    }
    book = PriceHistory.load(["gpt-h"])
    for moment, expected in cases.items():
        for found in (price_at("gpt-h", moment), book.at("gpt-h", moment)):
            assert (found.input_usd_per_mtok if found else None) == expected, moment
    assert book.at("other", t1) is None  # not loaded


@pytest.mark.django_db
def test_it_knows_which_models_are_priced_now(history):
    assert is_priced("gpt-h") and is_priced("other") and not is_priced("nope")
    make_price("later", effective_from=timezone.now() + dt.timedelta(hours=1))
    assert not is_priced("later")
    assert load_priced_models() == {"gpt-h", "other"}


# The hot path's books


class CountingLoader:
    def __init__(self, value):
        self.value = value
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.value


def test_the_price_book_asks_the_database_once_per_ttl(settings):
    settings.HOPBASE_CONFIG_TTL = 3600
    loader = CountingLoader(frozenset({"gpt-a"}))
    book = PriceBook(loader)
    assert async_to_sync(book.is_priced)("gpt-a")
    assert not async_to_sync(book.is_priced)("gpt-b")
    assert loader.calls == 1
    loader.value = frozenset({"gpt-a", "gpt-b"})
    book.clear()
    assert async_to_sync(book.is_priced)("gpt-b") and loader.calls == 2


def test_the_price_book_reloads_after_the_ttl(settings):
    settings.HOPBASE_CONFIG_TTL = 0.000001
    loader = CountingLoader(frozenset())
    book = PriceBook(loader)
    async_to_sync(book.models)()
    async_to_sync(book.models)()
    assert loader.calls == 2


def test_a_book_keeps_its_last_answer_when_the_database_fails(settings, caplog):
    settings.HOPBASE_CONFIG_TTL = 0.000001
    answers = iter([frozenset({"gpt-a"}), RuntimeError("database down"), frozenset({"gpt-b"})])

    def loader():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    book = PriceBook(loader)
    assert async_to_sync(book.is_priced)("gpt-a")
    assert async_to_sync(book.is_priced)("gpt-a")  # the refresh failed: the last list stands
    assert "could not refresh" in caplog.text
    assert async_to_sync(book.is_priced)("gpt-b")


def test_a_book_that_never_loaded_raises():
    def loader():
        raise RuntimeError("database down")

    with pytest.raises(RuntimeError):
        async_to_sync(PriceBook(loader).models)()


def test_the_balance_book_says_who_is_exhausted(settings):
    settings.HOPBASE_CONFIG_TTL = 3600
    loader = CountingLoader(frozenset({7}))
    book = BalanceBook(loader)
    assert async_to_sync(book.exhausted)(7)
    assert not async_to_sync(book.exhausted)(8)
    assert loader.calls == 1


@pytest.mark.django_db
def test_a_tenant_at_or_below_zero_is_exhausted():
    empty, negative, funded = make_tenant(), make_tenant(), make_tenant()
    top_up(negative, Decimal("1"))
    post_entry(negative.pk, "adjustment", Decimal("-1.0000000001"))
    top_up(funded, Decimal("0.0000000001"))
    assert load_exhausted_tenants() >= {empty.pk, negative.pk}
    assert funded.pk not in load_exhausted_tenants()
