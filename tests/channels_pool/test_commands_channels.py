"""The operator commands addchannel and setprice (DESIGN.md, operator contract):
each success path, and every bad input failing with one line and nothing written.
addchannel takes every channel kind (rules C1, C6): a cloud's own settings,
its key from a flag or a file (a service-account JSON key), or none for
Bedrock; the secret stored encrypted and never printed."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from billing.models import ModelPrice
from channels_pool.models import SECRET_MAX_LENGTH, Channel
from channels_pool.probe import probe_call
from core import encryption
from providers.kinds import KINDS
from providers.openai.azure import DEFAULT_API_VERSION
from simulator import vertex_service_account
from tests.support.command_checks import assert_refused, run
from tests.support.factories import make_channel, make_price

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


# addchannel: the clouds (azure, bedrock, vertex)

AZURE = ["--protocol", "azure", "--base-url", "https://hopbase-eu.openai.azure.com", "--models", "gpt-4o=prod-gpt-4o"]
BEDROCK = ["--protocol", "bedrock", "--base-url", "https://bedrock-runtime.eu-west-3.amazonaws.com",
           "--models", "claude-sonnet=eu.anthropic.claude-sonnet-4-5-20250929-v1:0"]
VERTEX = ["--protocol", "vertex", "--base-url", "https://us-east5-aiplatform.googleapis.com",
          "--models", "gemini-2.0-flash"]
AWS_PAIR = ("AKIAADDCHANNELTEST01", "aws/secret/key+for-addchannel-tests", "session-token-for-addchannel-tests")
# A service-account key of the size Google issues (about 2,300 characters, most of it the private key).
SERVICE_ACCOUNT = vertex_service_account("https://oauth2.googleapis.com", project_id="hopbase-prod")


def run_both(*args: str) -> tuple[str, str]:
    """The command's stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def stored_column(channel: Channel) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM channels_pool_channel WHERE id = %s", [channel.pk])
        return cursor.fetchone()[0]


def assert_kept_secret(channel: Channel, secret: str, *printed: str) -> None:
    """Stored as a Fernet token of the secret, and no piece of it printed."""
    raw = stored_column(channel)
    assert encryption.looks_like_token(raw) and encryption.decrypt(raw) == secret
    for piece in {secret, *secret.split(":")}:
        assert all(piece not in text for text in printed), piece


def test_it_adds_an_azure_channel_and_says_which_api_version_it_will_use():
    out, err = run_both("addchannel", "azure-eu", *AZURE, "--api-key", "azure-key-0123456789abcdef")
    channel = Channel.objects.get(name="azure-eu")
    assert (channel.protocol, channel.base_url) == ("azure", "https://hopbase-eu.openai.azure.com")
    assert channel.model_map() == {"gpt-4o": "prod-gpt-4o"}
    assert (channel.region, channel.project, channel.location) == ("", "", "")
    assert f"api version {DEFAULT_API_VERSION} (the default)" in out
    # The default is what its requests carry, to the deployment the alias names.
    url = KINDS["azure"].request(channel, probe_call(KINDS["azure"], "prod-gpt-4o")).url
    assert "/openai/deployments/prod-gpt-4o/" in url and f"api-version={DEFAULT_API_VERSION}" in url
    assert_kept_secret(channel, "azure-key-0123456789abcdef", out, err)


def test_it_adds_an_azure_channel_with_its_own_api_version():
    out = run("addchannel", "azure-eu", *AZURE, "--api-key", "azure-key-1", "--api-version", "2025-04-01-preview")
    assert Channel.objects.get(name="azure-eu").api_version == "2025-04-01-preview"
    assert "api version 2025-04-01-preview" in out and "(the default)" not in out


def test_it_adds_a_bedrock_channel_with_a_key_pair_and_session_token():
    secret = ":".join(AWS_PAIR)
    out, err = run_both("addchannel", "bedrock-eu", *BEDROCK, "--region", "eu-west-3", "--api-key", secret)
    channel = Channel.objects.get(name="bedrock-eu")
    assert (channel.protocol, channel.region) == ("bedrock", "eu-west-3")
    assert channel.model_map() == {"claude-sonnet": "eu.anthropic.claude-sonnet-4-5-20250929-v1:0"}
    assert "region eu-west-3" in out
    assert_kept_secret(channel, secret, out, err)


def test_it_adds_a_bedrock_channel_with_a_bedrock_api_key():
    out, err = run_both("addchannel", "bedrock-eu", *BEDROCK, "--region", "eu-west-3",
                        "--api-key", "ABSKQmVkcm9ja0FQSUtleS10ZXN0LWtleQ==")
    assert_kept_secret(Channel.objects.get(name="bedrock-eu"), "ABSKQmVkcm9ja0FQSUtleS10ZXN0LWtleQ==", out, err)


def test_a_bedrock_channel_without_a_key_uses_the_gateways_own_aws_credentials():
    out = run("addchannel", "bedrock-eu", *BEDROCK, "--region", "eu-west-3")
    channel = Channel.objects.get(name="bedrock-eu")
    assert (channel.secret, channel.region) == ("", "eu-west-3")
    assert "no key: the gateway's own AWS credentials" in out


def test_it_reads_a_key_from_a_file_without_its_trailing_newline(tmp_path):
    key_file = tmp_path / "bedrock.key"
    key_file.write_text(":".join(AWS_PAIR) + "\n")
    out, err = run_both("addchannel", "bedrock-eu", *BEDROCK, "--region", "eu-west-3", "--api-key-file", str(key_file))
    assert_kept_secret(Channel.objects.get(name="bedrock-eu"), ":".join(AWS_PAIR), out, err)


def test_it_adds_a_vertex_channel_with_a_service_account_key_file(tmp_path):
    key_file = tmp_path / "service-account.json"
    key_file.write_text(json.dumps(SERVICE_ACCOUNT, indent=2) + "\n")  # as the console downloads it
    out, err = run_both("addchannel", "vertex-us", *VERTEX, "--project", "hopbase-prod", "--location", "us-east5",
                        "--api-key-file", str(key_file))
    channel = Channel.objects.get(name="vertex-us")
    assert (channel.protocol, channel.project, channel.location) == ("vertex", "hopbase-prod", "us-east5")
    assert json.loads(channel.secret) == SERVICE_ACCOUNT
    assert_kept_secret(channel, channel.secret, out, err)
    assert SERVICE_ACCOUNT["private_key_id"] not in out + err
    assert "project hopbase-prod" in out and "location us-east5" in out


@pytest.mark.parametrize(
    ("args", "match"),
    [
        # A setting the kind needs, named by its flag.
        ([*BEDROCK, "--api-key", ":".join(AWS_PAIR)], "^--region is required for a bedrock channel$"),
        ([*VERTEX, "--location", "us-east5", "--api-key", "{}"], "^--project is required for a vertex channel$"),
        ([*VERTEX, "--project", "hopbase-prod", "--api-key", "{}"], "^--location is required for a vertex channel$"),
        ([*VERTEX, "--project", "hopbase-prod", "--location", "us-east5"],
         r"^--api-key \(or --api-key-file\) is required for a vertex channel$"),
        (["--protocol", "openai", "--base-url", "http://127.0.0.1:9100/v1", "--models", "gpt-a"],
         r"^--api-key \(or --api-key-file\) is required for an openai channel$"),
        # A setting of another kind: the operator meant another kind of channel.
        ([*CHANNEL_ARGS, "--region", "us-east-1"], "^--region does not apply to an openai channel$"),
        ([*AZURE, "--api-key", "k", "--project", "p"], "^--project does not apply to an azure channel$"),
        ([*BEDROCK, "--region", "eu-west-3", "--api-version", "2024-10-21"],
         "^--api-version does not apply to a bedrock channel$"),
        ([*VERTEX, "--project", "p", "--location", "us-east5", "--region", "us-east5", "--api-key", "{}"],
         "^--region does not apply to a vertex channel$"),
        # A setting the kind cannot use.
        ([*BEDROCK, "--region", "eu west 3"], "^--region: 'eu west 3' is not an AWS region"),
        ([*AZURE, "--api-key", "k", "--api-version", "2024/10/21"],
         "^--api-version: '2024/10/21' is not an API version"),
        ([*VERTEX, "--project", "hopbase prod", "--location", "us-east5", "--api-key", "{}"],
         "^--project: 'hopbase prod' is not a Google Cloud project"),
        # A key the kind cannot use, named by the flag it came from.
        ([*BEDROCK, "--region", "eu-west-3", "--api-key", "AKIAADDCHANNELTEST01:"],
         "^--api-key: a bedrock key pair is"),
        ([*VERTEX, "--project", "p", "--location", "us-east5", "--api-key", "not-a-json-key-0123"],
         "^--api-key: a vertex key must be a service-account JSON key"),
    ],
)
def test_it_refuses_a_channel_its_kind_cannot_use_naming_the_flag(args, match):
    error = assert_refused("addchannel", "cloud-1", *args, match=match)
    for secret in ("AKIAADDCHANNELTEST01", "not-a-json-key-0123"):
        assert secret not in str(error)


@pytest.mark.parametrize("size", [SECRET_MAX_LENGTH + 1, 2 * SECRET_MAX_LENGTH, 100 * SECRET_MAX_LENGTH])
def test_it_refuses_a_key_file_too_long_and_never_keeps_part_of_it(tmp_path, size):
    key_file = tmp_path / "bedrock.key"
    key_file.write_text("\n\n" + "A" * size + "\n")  # blank lines first: the key is still too long
    assert_refused("addchannel", "bedrock-eu", *BEDROCK, "--region", "eu-west-3", "--api-key-file", str(key_file),
                   match=f"^--api-key-file is too long \\(at most {SECRET_MAX_LENGTH} characters\\)$")


def test_a_key_file_may_hold_the_longest_key_and_blank_lines_around_it(tmp_path):
    key_file = tmp_path / "bedrock.key"
    key_file.write_text("\n\n" + "A" * SECRET_MAX_LENGTH + "\n\n")
    run("addchannel", "bedrock-eu", *BEDROCK, "--region", "eu-west-3", "--api-key-file", str(key_file))
    assert Channel.objects.get(name="bedrock-eu").secret == "A" * SECRET_MAX_LENGTH


def test_it_refuses_a_key_flag_and_a_key_file_together(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-a-file-123")
    error = assert_refused("addchannel", "up-1", *CHANNEL_ARGS, "--api-key-file", str(key_file),
                           match="--api-key-file: not allowed with argument --api-key")
    assert "sk-up-123" not in str(error) and "sk-from-a-file-123" not in str(error)


def test_it_refuses_a_key_file_it_cannot_read_or_that_holds_no_key(tmp_path):
    vertex = [*VERTEX, "--project", "p", "--location", "us-east5"]
    missing = tmp_path / "nowhere.json"
    assert_refused("addchannel", "vertex-us", *vertex, "--api-key-file", str(missing),
                   match=f"^--api-key-file: cannot read {missing}: No such file or directory$")
    assert_refused("addchannel", "vertex-us", *vertex, "--api-key-file", str(tmp_path),
                   match=f"^--api-key-file: cannot read {tmp_path}: Is a directory$")
    binary = tmp_path / "key.p12"
    binary.write_bytes(b"\x30\x82\xff\xfe\x00binary")
    assert_refused("addchannel", "vertex-us", *vertex, "--api-key-file", str(binary), match="is not UTF-8 text")
    empty = tmp_path / "empty.json"
    empty.write_text("\n")
    assert_refused("addchannel", "vertex-us", *vertex, "--api-key-file", str(empty),
                   match="^--api-key-file must not be empty$")
    wrong = tmp_path / "notes.txt"
    wrong.write_text("the key is in the vault\n")
    error = assert_refused("addchannel", "vertex-us", *vertex, "--api-key-file", str(wrong),
                           match="^--api-key-file: a vertex key must be a service-account JSON key")
    assert "vault" not in str(error)


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
