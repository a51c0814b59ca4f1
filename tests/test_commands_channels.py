"""The operator commands addchannel and setprice (DESIGN.md, operator contract):
each success path, and every bad input failing with one line and nothing written."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import ModelPrice
from channels_pool.models import Channel
from tests.command_checks import assert_refused, run
from tests.factories import make_channel, make_price

pytestmark = pytest.mark.django_db


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
