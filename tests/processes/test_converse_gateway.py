"""A Bedrock model that speaks Converse (rule C3), through a running gateway
with the official SDKs: every client API, streamed and whole, translated
to and from ConverseStream; its exact usage in the log; and the stream
rules on it (M2 a stall, M3 an exception frame, a bad checksum) in the
caller's format. The world's ``via-converse`` is served by one Bedrock
channel only (amazon.nova-pro-v1:0, signed with the simulator's key pair).
The translation itself is test_translation_converse.py's.
"""

from __future__ import annotations

import json
from decimal import Decimal

import httpx
import pytest

from billing.exports import export_rows, for_export
from billing.models import RequestLog
from billing.settlement import settle
from tests.support.protocol_checks import new_tag, prompt, words
from tests.support.relay_checks import STALLED, stream, stream_errors
from tests.support.translation_clients import CLIENT_APIS, ask
from tests.support.wire import records, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

MODEL = "via-converse"
NOVA = "amazon.nova-pro-v1:0"


@pytest.mark.parametrize("stream_it", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", CLIENT_APIS)
def test_every_client_api_reaches_a_converse_model(gateway, world, simulator, api, stream_it):
    tag = new_tag()
    text = prompt(tag, tokens=4)
    answer = ask(gateway, world.key, api, MODEL, text, stream=stream_it)
    assert answer.text.split() and len(answer.text.split()) == 4
    upstream = records(simulator.url, tag)
    assert [(r["protocol"], r["path"]) for r in upstream] == [("bedrock-converse", f"/model/{NOVA}/converse-stream")]
    assert upstream[0]["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 ")
    assert upstream[0]["body"]["messages"][-1]["content"] == [{"text": text}]
    log = wait_for_log(answer.request_id)
    assert (log.status, log.model, log.upstream_model, log.output_tokens) == ("completed", MODEL, NOVA, 4)
    assert log.input_tokens == words(text) and not log.usage_estimated


@pytest.mark.parametrize("api", CLIENT_APIS)
def test_a_tool_call_from_converse_reaches_each_client(gateway, world, api):
    answer = ask(gateway, world.key, api, MODEL, prompt(new_tag(), tokens=2, tool=1), stream=True, tool=True)
    assert [name for name, _ in answer.tool_calls] == ["get_weather"]
    assert answer.stop == "tool"


def test_converse_cache_usage_is_kept_apart_and_exported(gateway, world):
    text = prompt(new_tag(), tokens=3, cached=4, cache_write=2)
    answer = ask(gateway, world.key, "messages", MODEL, text, stream=True)
    log = wait_for_log(answer.request_id)
    assert (log.cache_read_tokens, log.cache_write_tokens, log.input_tokens) == (4, 2, words(text) - 6)
    settle(log.pk)  # as the worker would
    [row] = export_rows(for_export(RequestLog.objects.filter(request_id=answer.request_id)))
    assert (row["protocol"], row["channel"], row["cache_read_tokens"], row["cache_write_tokens"]) == (
        "messages", "bedrock-via-converse-main", 4, 2)
    # cloud prices: 3 input, 15 output, 0.3 a cache read, 3.75 a cache write, per million.
    per_million = log.input_tokens * 3 + 3 * 15 + 4 * Decimal("0.3") + 2 * Decimal("3.75")
    assert Decimal(row["charge_usd"]) == per_million / 1_000_000 and row["settled"]


def test_a_converse_stream_that_stalls_ends_with_the_callers_stall_event(gateway, world):
    response = stream(gateway, "chat", world.key, MODEL, prompt(new_tag(), tokens=6, stall_after=2))
    errors = stream_errors(response.content)
    assert [e["error"]["message"] for e in errors] == [STALLED]
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.usage_estimated) == ("stalled", True)


@pytest.mark.parametrize(("exception", "kind"), [("throttlingException", "overloaded_error"),
                                                  ("modelStreamErrorException", "api_error")])
def test_an_exception_frame_mid_converse_is_the_callers_error_event(gateway, world, exception, kind):
    response = stream(gateway, "messages", world.key, MODEL,
                      prompt(new_tag(), tokens=6, exception_after=2, exception=exception))
    assert [e["error"]["type"] for e in stream_errors(response.content)] == [kind]
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "interrupted"


def test_a_bad_checksum_mid_converse_is_an_interruption(gateway, world):
    response = stream(gateway, "gemini", world.key, MODEL, prompt(new_tag(), tokens=6, bad_crc_after=2))
    errors = stream_errors(response.content)
    assert len(errors) == 1 and json.dumps(errors[0]).count("UNAVAILABLE") == 1
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "interrupted"


def test_a_converse_model_counts_tokens_with_bedrocks_count_tokens(gateway, world, simulator):
    tag = new_tag()
    text = prompt(tag)
    response = httpx.post(f"{gateway.url}/v1/messages/count_tokens", timeout=20,
                          headers={"x-api-key": world.key, "anthropic-version": "2023-06-01"},
                          json={"model": MODEL, "system": "be brief", "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200 and "x-hopbase-estimated" not in response.headers
    assert response.json() == {"input_tokens": words(text) + 2}  # the system prompt's two words too
    (record,) = records(simulator.url, tag)
    assert (record["protocol"], record["path"]) == ("bedrock-converse", f"/model/{NOVA}/count-tokens")
    assert record["body"]["input"]["converse"]["system"] == [{"text": "be brief"}]
