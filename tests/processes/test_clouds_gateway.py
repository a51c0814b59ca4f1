"""Cloud channels end to end (C1–C5): the official SDKs against a running
gateway whose channels are the simulator playing Azure OpenAI, Amazon
Bedrock and Google Vertex AI (``CLOUDS`` in tests/conftest.py).

What passes through (Azure for Chat and Responses, Anthropic models on
Bedrock and Vertex for Messages, Gemini on Vertex for Gemini) reaches the
client as the cloud sent it; every other client API is translated. Each
cloud's own failures (Azure's filter chunks and content filter, Bedrock's
exception frames and checksums, Vertex's token exchange) end as table E and
rules F and M say, failover crosses kinds both ways, and every request leaves
exactly one request log with its usage.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import anthropic
import httpx
import openai
import pytest

from billing.models import LedgerEntry, RequestLog
from billing.settlement import Outcome, settle
from channels_pool.models import ChannelHealth
from core.errors import CONTENT_FILTERED_MESSAGE
from simulator import SIM_AWS_ACCESS_KEY_ID
from simulator.cloud_auth import DEFAULT_TOKEN_TTL
from tests.conftest import AZURE_DEPLOYMENT, BEDROCK_CLAUDE, VERTEX_CLAUDE, VERTEX_GEMINI
from tests.support.cloud_clients import AZURE_VERSION, frames
from tests.support.protocol_checks import (
    RequestIds,
    anthropic_client,
    genai_client,
    new_tag,
    openai_client,
    prompt,
    words,
)
from tests.support.relay_checks import GENERIC_ERROR, INTERRUPTED, TERMINALS, client_events, post, stream, stream_errors
from tests.support.settlement_checks import wait_for
from tests.support.translation_clients import CLIENT_APIS, NATIVE, ask, count_tokens
from tests.support.wire import records, sent_bytes, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

# public model -> (the channel's kind, the grammar it speaks for the model, the name it is sent)
SERVED = {
    "cloud-azure": ("azure", "openai", AZURE_DEPLOYMENT),
    "cloud-bedrock": ("bedrock", "anthropic", BEDROCK_CLAUDE),
    "cloud-vertex-gemini": ("vertex", "gemini", VERTEX_GEMINI),
    "cloud-vertex-claude": ("vertex", "anthropic", VERTEX_CLAUDE),
}
# What the simulator records a channel's request as, by the channel's kind and the API that calls it.
UPSTREAM_PROTOCOL = {("azure", "responses"): "azure-responses", ("azure", "chat"): "azure-chat",
                     ("bedrock", "messages"): "bedrock-anthropic", ("vertex", "gemini"): "vertex-gemini",
                     ("vertex", "messages"): "vertex-anthropic"}
CHANNEL_API = {"openai": "chat", "anthropic": "messages", "gemini": "gemini"}


def one_log(request_id: str | None) -> RequestLog:
    """The request's log, which must be its only one (P8)."""
    assert request_id and request_id.startswith("req_"), request_id
    log = wait_for_log(request_id)
    assert log is not None, f"no request log for {request_id}"
    assert RequestLog.objects.filter(request_id=request_id).count() == 1
    return log


def kind_of(record: dict) -> str:
    """The kind of channel that sent a request the simulator recorded."""
    cloud = record["protocol"].split("-")[0]
    return cloud if cloud in ("azure", "bedrock", "vertex") else "vendor"


def tagged(simulator, tag: str) -> list[dict]:
    return sorted(records(simulator.url, tag), key=lambda r: r["started_at"])


def health_of(channel_id: int, condition, what: str) -> ChannelHealth:
    """The channel's health once the gateway has written what ``condition`` looks for (every second)."""
    wait_for(lambda: condition(ChannelHealth.objects.filter(channel_id=channel_id).first()), timeout=5, what=what)
    return ChannelHealth.objects.get(channel_id=channel_id)


# -- every client API to each cloud (C1, T1) ----------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", CLIENT_APIS)
@pytest.mark.parametrize("model", list(SERVED))
def test_every_client_api_reaches_each_cloud(gateway, world, simulator, model, api, stream):
    kind, grammar, upstream = SERVED[model]
    tag = new_tag()
    text = prompt(tag, tokens=5)

    answer = ask(gateway, world.key, api, model, text, stream=stream)

    assert len(answer.text.split()) == 5 and answer.stop == "end"
    assert (answer.input_tokens, answer.output_tokens) == (words(text), 5)
    passes_through = NATIVE[api] == grammar
    # A passed-through answer names the model as the cloud does; a translated one, the public name (T4).
    assert answer.model in ((upstream, f"models/{upstream}") if passes_through else (model,))
    (record,) = tagged(simulator, tag)
    channel_api = api if passes_through else CHANNEL_API[grammar]
    assert record["protocol"] == UPSTREAM_PROTOCOL[kind, channel_api]
    assert record["model"] == upstream and record["completed"] is True
    log = one_log(answer.request_id)
    assert (log.status, log.protocol, log.model, log.upstream_model, log.attempts) == (
        "completed", api, model, upstream, 1)
    assert log.channel_id == world.channels[f"{kind}-{model}-main"]
    assert (log.input_tokens, log.output_tokens, log.usage_estimated) == (words(text), 5, False)


@pytest.mark.parametrize(("api", "model"), [("chat", "cloud-azure"), ("responses", "cloud-azure"),
                                            ("gemini", "cloud-vertex-gemini"), ("messages", "cloud-vertex-claude")])
def test_a_clouds_sse_passes_through_byte_for_byte(gateway, world, simulator, api, model):
    """Where the cloud speaks the caller's grammar in SSE, the client gets its bytes (C1, P6)."""
    tag = new_tag()
    response = stream(gateway, api, world.key, model, prompt(tag, tokens=4))

    assert response.status_code == 200
    (record,) = tagged(simulator, tag)
    assert response.content == sent_bytes(record)
    assert TERMINALS[api] in response.content
    assert one_log(response.headers["x-hopbase-request-id"]).status == "completed"


# -- Azure OpenAI (C2) --------------------------------------------------------


def test_azure_is_addressed_by_deployment_with_its_api_key(gateway, world, simulator):
    tag = new_tag()
    response = stream(gateway, "chat", world.key, "cloud-azure", prompt(tag, tokens=2))

    assert response.status_code == 200
    (record,) = tagged(simulator, tag)
    assert record["path"] == f"/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions"
    assert record["query"] == {"api-version": AZURE_VERSION}
    assert record["headers"]["api-key"] == "azure-upstream-secret"
    assert "authorization" not in record["headers"] and world.key not in json.dumps(record)
    # Azure's first chunk is its filter-only annotation: no choices, the prompt's filter results.
    first = json.loads(client_events(response.content)[0].removeprefix(b"data: "))
    assert first["choices"] == [] and "prompt_filter_results" in first
    log = one_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.upstream_model, log.output_tokens) == ("completed", AZURE_DEPLOYMENT, 2)


def test_azure_responses_go_to_the_v1_path_naming_the_deployment(gateway, world, simulator):
    tag = new_tag()
    client, ids = openai_client(gateway, world.key), RequestIds()
    client = client.with_options(http_client=openai.DefaultHttpxClient(event_hooks={"response": [ids]}))

    response = client.responses.create(model="cloud-azure", input=prompt(tag, tokens=3))

    assert len(response.output_text.split()) == 3 and response.model == AZURE_DEPLOYMENT
    (record,) = tagged(simulator, tag)
    assert (record["path"], record["body"]["model"], record["protocol"]) == (
        "/openai/v1/responses", AZURE_DEPLOYMENT, "azure-responses")
    log = one_log(ids.only)
    assert (log.status, log.protocol, log.output_tokens) == ("completed", "responses", 3)


def test_a_whole_azure_answer_names_the_real_completion_not_the_filter_chunk(gateway, world, simulator):
    """Assembled from the stream (F4), the body's id, created, model and
    fingerprint are the completion's, not those of Azure's filter-only
    first chunk (empty id and model, created 0)."""
    tag = new_tag()
    raw = openai_client(gateway, world.key).chat.completions.with_raw_response.create(
        model="cloud-azure", messages=[{"role": "user", "content": prompt(tag, tokens=3, id="azwhole",
                                                                           created=1700000000)}])
    completion = raw.parse()

    (record,) = tagged(simulator, tag)
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in client_events(sent_bytes(record))
              if e != b"data: [DONE]"]
    assert chunks[0]["id"] == "" and chunks[0]["choices"] == []  # the filter-only chunk came first
    assert completion.id == "chatcmpl-azwhole" == chunks[1]["id"]
    assert (completion.created, completion.model) == (1700000000, AZURE_DEPLOYMENT)
    assert completion.system_fingerprint == chunks[1]["system_fingerprint"]
    assert completion.choices[0].finish_reason == "stop" and len(completion.choices[0].message.content.split()) == 3
    log = one_log(raw.headers["x-hopbase-request-id"])
    assert (log.status, log.stream, log.output_tokens) == ("completed", False, 3)


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_azures_filter_only_chunk_does_not_end_the_hold(gateway, world, simulator, api):
    """The Azure channel sends its filter-only chunk, then fails: had that
    chunk ended the hold, the client would get an in-stream error; it gets
    the next channel's clean stream (F1, F2, C2)."""
    tag = new_tag()
    response = stream(gateway, api, world.key, "cloud-azure-failover", prompt(tag, tokens=4))

    assert response.status_code == 200 and stream_errors(response.content) == []
    assert TERMINALS[api] in response.content and b"prompt_filter_results" not in response.content
    failed, served = tagged(simulator, tag)
    assert (kind_of(failed), kind_of(served)) == ("azure", "vendor")
    if api == "chat":  # (Azure's Responses have no filter-only event)
        assert b"prompt_filter_results" in sent_bytes(failed)
    log = one_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts) == ("completed", 2)
    assert log.channel_id == world.channels["openai-cloud-azure-failover-good"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_azure_filter_finish_reaches_the_client_as_content_filter(gateway, world, stream):
    tag = new_tag()
    client, ids = openai_client(gateway, world.key), RequestIds()
    client = client.with_options(http_client=openai.DefaultHttpxClient(event_hooks={"response": [ids]}))
    messages = [{"role": "user", "content": prompt(tag, tokens=3, filter_finish=1)}]

    if stream:
        finishes = [choice.finish_reason for chunk in client.chat.completions.create(
            model="cloud-azure", messages=messages, stream=True) for choice in chunk.choices if choice.finish_reason]
    else:
        finishes = [c.finish_reason for c in client.chat.completions.create(model="cloud-azure",
                                                                            messages=messages).choices]

    assert finishes == ["content_filter"]
    log = one_log(ids.only)
    assert (log.status, log.output_tokens) == ("completed", 3)


def test_an_azure_filter_finish_translated_is_anthropics_refusal(gateway, world):
    ids = RequestIds()
    client = anthropic_client(gateway, world.key, http_client=anthropic.DefaultHttpxClient(
        event_hooks={"response": [ids]}))
    message = client.messages.create(model="cloud-azure", max_tokens=64,
                                     messages=[{"role": "user", "content": prompt(new_tag(), filter_finish=1)}])
    assert message.stop_reason == "refusal"
    assert (one_log(ids.only).status, one_log(ids.only).protocol) == ("completed", "messages")


FILTER_REFUSAL = {
    # client API -> how its own 400 names a request its provider's filter refused (OpenAI's code kept)
    "chat": lambda body: (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error", "content_filter"),
    "responses": lambda body: (body["error"]["type"], body["error"]["code"]) == ("invalid_request_error",
                                                                                 "content_filter"),
    "messages": lambda body: body["type"] == "error" and body["error"]["type"] == "invalid_request_error",
    "gemini": lambda body: body["error"]["status"] == "INVALID_ARGUMENT" and body["error"]["code"] == 400,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", CLIENT_APIS)
def test_an_azure_content_filter_refusal_is_a_400_in_the_callers_format(gateway, world, simulator, api, stream):
    """Azure's refusal is about the prompt: any channel would refuse it, so
    it is not retried on the next (C2, F2), and its words stay Azure's."""
    tag = new_tag()
    response = post(gateway, api, world.key, "cloud-azure-filter", prompt(tag, content_filter=1), stream=stream)

    assert response.status_code == 400
    body = response.json()
    assert FILTER_REFUSAL[api](body)
    assert CONTENT_FILTERED_MESSAGE in response.text
    assert "ResponsibleAIPolicyViolation" not in response.text and "Azure" not in response.text
    assert [kind_of(r) for r in tagged(simulator, tag)] == ["azure"]  # the vendor channel was never asked
    log = one_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.error_kind, log.attempts, log.output_tokens) == ("failed", "content_filter", 1, 0)
    assert log.channel_id == world.channels["azure-cloud-azure-filter-strict"]


def test_a_content_filter_refusal_does_not_count_against_the_channel(gateway, world, simulator):
    strict = world.channels["azure-cloud-azure-filter-strict"]
    refused = post(gateway, "chat", world.key, "cloud-azure-filter", prompt(new_tag(), content_filter=1))
    assert refused.status_code == 400
    served = post(gateway, "chat", world.key, "cloud-azure-filter", prompt(new_tag(), tokens=2))
    assert served.status_code == 200
    # Health is written from one thread, all changes at once: once the later
    # success shows, the refusal would have shown too.
    health = health_of(strict, lambda h: h is not None and h.successes >= 1, "the strict channel's success")
    assert (health.failures, health.last_error_kind, health.state) == (0, "", "closed")
    assert one_log(refused.headers["x-hopbase-request-id"]).status == "failed"
    assert one_log(served.headers["x-hopbase-request-id"]).channel_id == strict


# -- Amazon Bedrock, an Anthropic model (C3) ----------------------------------


def test_bedrock_events_reach_a_messages_client_as_anthropics_own(gateway, world, simulator):
    """Each chunk frame's Anthropic event, exactly as Bedrock carried it, as
    Anthropic's SSE; the request signed with SigV4 in the channel's region."""
    tag = new_tag()
    text = prompt(tag, tokens=4, cached=3, cache_write=2)
    response = stream(gateway, "messages", world.key, "cloud-bedrock", text)

    assert response.status_code == 200
    (record,) = tagged(simulator, tag)
    decoded = [base64.b64decode(json.loads(frame.payload)["bytes"]) for frame in frames(sent_bytes(record))]
    assert response.content == b"".join(
        b"event: " + json.loads(data)["type"].encode() + b"\ndata: " + data + b"\n\n" for data in decoded)
    assert [json.loads(d)["type"] for d in decoded][:2] == ["message_start", "content_block_start"]
    assert record["path"] == f"/model/{BEDROCK_CLAUDE}/invoke-with-response-stream"
    assert record["body"]["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in record["body"] and "stream" not in record["body"]
    assert record["headers"]["authorization"].startswith(
        f"AWS4-HMAC-SHA256 Credential={SIM_AWS_ACCESS_KEY_ID}/") and "/us-east-1/bedrock/aws4_request" in (
        record["headers"]["authorization"])
    log = one_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.input_tokens, log.output_tokens) == ("completed", words(text) - 5, 4)
    assert (log.cache_read_tokens, log.cache_write_tokens, log.usage_estimated) == (3, 2, False)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_anthropic_sdk_reads_bedrock_with_its_cache_usage(gateway, world, stream):
    tag = new_tag()
    text = prompt(tag, tokens=3, cached=4, cache_write=1)
    ids = RequestIds()
    client = anthropic_client(gateway, world.key, http_client=anthropic.DefaultHttpxClient(
        event_hooks={"response": [ids]}))
    request = {"model": "cloud-bedrock", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}
    if stream:
        with client.messages.stream(**request) as events:
            assert len("".join(events.text_stream).split()) == 3
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)

    assert message.id.startswith("msg_bdrk_") and message.model == BEDROCK_CLAUDE
    assert len(message.content[0].text.split()) == 3 and message.stop_reason == "end_turn"
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
            usage.output_tokens) == (words(text) - 5, 4, 1, 3)
    log = one_log(ids.only)
    assert (log.status, log.stream, log.input_tokens, log.output_tokens) == ("completed", stream, words(text) - 5, 3)
    assert (log.cache_read_tokens, log.cache_write_tokens) == (4, 1)


def test_a_bedrock_answer_is_charged_for_its_cache_reads_and_writes(gateway, world):
    text = prompt(new_tag(), tokens=3, cached=4, cache_write=1)
    response = post(gateway, "messages", world.key, "cloud-bedrock", text)
    assert response.status_code == 200

    log = one_log(response.headers["x-hopbase-request-id"])
    # Settled here if the gateway has not yet (with Redis, a worker's task would): once either way (B6).
    assert settle(log.pk) in (Outcome.CHARGED, Outcome.ALREADY)
    log.refresh_from_db()
    fresh = words(text) - 5
    # cloud-bedrock's price per million: 3 input, 15 output, 0.3 a cache read, 3.75 a cache write.
    per_million = fresh * Decimal(3) + 3 * Decimal(15) + 4 * Decimal("0.3") + 1 * Decimal("3.75")
    assert log.charge_usd == per_million / 1_000_000 * log.price_multiplier
    assert LedgerEntry.objects.get(request_log=log).amount_usd == -log.charge_usd


BEDROCK_EXCEPTIONS = {
    # the exception frame's type -> the Anthropic error type the client gets (M3)
    "throttlingException": "overloaded_error",
    "serviceUnavailableException": "overloaded_error",
    "internalServerException": "api_error",
    "modelStreamErrorException": "api_error",
}


@pytest.mark.parametrize("exception", list(BEDROCK_EXCEPTIONS))
def test_an_exception_frame_mid_stream_is_a_generic_error_event(gateway, world, exception):
    tag = new_tag()
    response = stream(gateway, "messages", world.key, "cloud-bedrock",
                      prompt(tag, tokens=6, exception_after=2, exception=exception))

    assert response.status_code == 200
    (error,) = stream_errors(response.content)
    assert error == {"type": "error", "error": {"type": BEDROCK_EXCEPTIONS[exception], "message": GENERIC_ERROR}}
    assert b"simulated" not in response.content and TERMINALS["messages"] not in response.content
    log = one_log(response.headers["x-hopbase-request-id"])
    assert log.status == "interrupted" and log.output_tokens >= 2


@pytest.mark.parametrize(("exception", "status"), [("throttlingException", 529), ("internalServerException", 500)])
def test_an_exception_frame_in_an_answer_taken_whole_is_table_es_error(gateway, world, exception, status):
    tag = new_tag()
    response = post(gateway, "messages", world.key, "cloud-bedrock",
                    prompt(tag, tokens=6, exception_after=2, exception=exception))

    assert response.status_code == status
    assert response.json()["error"]["type"] == ("overloaded_error" if status == 529 else "api_error")
    assert "simulated" not in response.text
    assert one_log(response.headers["x-hopbase-request-id"]).status == "interrupted"


def test_a_frame_with_a_bad_checksum_cuts_the_stream(gateway, world):
    tag = new_tag()
    response = stream(gateway, "messages", world.key, "cloud-bedrock", prompt(tag, tokens=6, bad_crc_after=2))

    assert response.status_code == 200
    (error,) = stream_errors(response.content)
    assert error["error"] == {"type": "api_error", "message": INTERRUPTED}
    assert TERMINALS["messages"] not in response.content
    log = one_log(response.headers["x-hopbase-request-id"])
    assert log.status == "interrupted" and log.output_tokens >= 2
    # The gateway read on: the next request on the channel is served.
    assert post(gateway, "messages", world.key, "cloud-bedrock", prompt(new_tag(), tokens=2)).status_code == 200


def test_a_bad_checksum_in_an_answer_taken_whole_is_an_interruption(gateway, world):
    response = post(gateway, "messages", world.key, "cloud-bedrock", prompt(new_tag(), tokens=6, bad_crc_after=2))

    assert response.status_code == 500
    assert response.json()["error"] == {"type": "api_error", "message": INTERRUPTED}
    assert one_log(response.headers["x-hopbase-request-id"]).status == "interrupted"


# -- Google Vertex AI (C4) ----------------------------------------------------


def test_vertex_gemini_is_called_with_an_exchanged_token(gateway, world, simulator):
    tag = new_tag()
    client = genai_client(gateway.url, world.key)
    chunks = list(client.models.generate_content_stream(model="cloud-vertex-gemini", contents=prompt(tag, tokens=3)))

    assert len("".join(c.text or "" for c in chunks).split()) == 3
    (record,) = tagged(simulator, tag)
    assert record["path"] == (f"/v1/projects/hopbase-sim/locations/us-east5/publishers/google/models/"
                              f"{VERTEX_GEMINI}:streamGenerateContent")
    assert record["query"] == {"alt": "sse"}
    assert record["headers"]["authorization"].startswith("Bearer ya29.sim.")
    assert "x-goog-api-key" not in record["headers"] and world.key not in json.dumps(record)
    log = one_log(chunks[0].sdk_http_response.headers["x-hopbase-request-id"])
    assert (log.status, log.protocol, log.upstream_model, log.output_tokens) == (
        "completed", "gemini", VERTEX_GEMINI, 3)


def test_vertex_claude_gets_vertexs_anthropic_version_and_no_model(gateway, world, simulator):
    tag = new_tag()
    ids = RequestIds()
    client = anthropic_client(gateway, world.key, http_client=anthropic.DefaultHttpxClient(
        event_hooks={"response": [ids]}))
    with client.messages.stream(
            model="cloud-vertex-claude", max_tokens=64, messages=[{"role": "user", "content": prompt(tag, tokens=3)}]
    ) as events:
        message = events.get_final_message()

    assert message.id.startswith("msg_vrtx_") and len(message.content[0].text.split()) == 3
    (record,) = tagged(simulator, tag)
    assert record["path"] == (f"/v1/projects/hopbase-sim/locations/us-east5/publishers/anthropic/models/"
                              f"{VERTEX_CLAUDE}:streamRawPredict")
    assert record["body"]["anthropic_version"] == "vertex-2023-10-16" and "model" not in record["body"]
    assert record["headers"]["authorization"].startswith("Bearer ya29.sim.")
    assert "anthropic-version" not in record["headers"]
    log = one_log(ids.only)
    assert (log.status, log.upstream_model, log.output_tokens) == ("completed", VERTEX_CLAUDE, 3)


BURST_ACCOUNT = "sim-account-burst@hopbase-sim.iam.gserviceaccount.com"  # cloud-vertex-burst's key alone


def test_one_token_exchange_serves_many_concurrent_requests(gateway, world, simulator):
    def exchanges() -> int:
        return httpx.get(f"{simulator.url}/_sim/tokens", timeout=5).json()["by_client"].get(BURST_ACCOUNT, 0)

    assert exchanges() == 0  # the channel's first requests are these
    count = 12
    start = threading.Barrier(count, timeout=10)

    def ask_once(_: int) -> httpx.Response:
        start.wait()  # all at once, before any token is known
        return post(gateway, "gemini", world.key, "cloud-vertex-burst", prompt(new_tag(), tokens=2), stream=True)

    with ThreadPoolExecutor(count) as pool:
        responses = list(pool.map(ask_once, range(count)))

    assert [r.status_code for r in responses] == [200] * count
    assert exchanges() == 1
    logs = [one_log(r.headers["x-hopbase-request-id"]) for r in responses]
    assert {(log.status, log.attempts, log.output_tokens) for log in logs} == {("completed", 1, 2)}


EXPIRING_ACCOUNT = "sim-account-expiring@hopbase-sim.iam.gserviceaccount.com"  # cloud-vertex-expiring's key


def test_a_token_is_exchanged_anew_shortly_before_it_expires_mid_run(gateway, world, simulator):
    def exchanges() -> int:
        return httpx.get(f"{simulator.url}/_sim/tokens", timeout=5).json()["by_client"].get(EXPIRING_ACCOUNT, 0)

    def answered() -> bool:
        response = post(gateway, "gemini", world.key, "cloud-vertex-expiring", prompt(new_tag(), tokens=2))
        return response.status_code == 200

    # Tokens issued from now live 61 s: renewed a minute before expiry, each serves for 1 s.
    httpx.post(f"{simulator.url}/_sim/tokens", params={"ttl": 61}, timeout=5)
    try:
        assert answered() and exchanges() == 1
        exchanged_at = time.monotonic()
        assert answered() and exchanges() == 1  # still good: one exchange serves on
        time.sleep(max(0.0, exchanged_at + 1.2 - time.monotonic()))  # nothing to await but the clock
        assert answered() and exchanges() == 2  # renewed before it expired, without a failed request
    finally:
        httpx.post(f"{simulator.url}/_sim/tokens", params={"ttl": DEFAULT_TOKEN_TTL}, timeout=5)


def test_a_refused_token_exchange_fails_over_and_tells_only_the_operator(gateway, world, simulator):
    tag = new_tag()
    text = prompt(tag, tokens=3)
    client = genai_client(gateway.url, world.key)
    chunks = list(client.models.generate_content_stream(model="cloud-vertex-refused", contents=text))

    assert len("".join(c.text or "" for c in chunks).split()) == 3
    # The Vertex channel never got as far as a model call: only the next channel's is recorded.
    assert [kind_of(r) for r in tagged(simulator, tag)] == ["vendor"]
    request_id = chunks[0].sdk_http_response.headers["x-hopbase-request-id"]
    log = one_log(request_id)
    assert (log.status, log.attempts, log.output_tokens) == ("completed", 2, 3)
    assert log.channel_id == world.channels["gemini-cloud-vertex-refused-good"]
    bad = world.channels["vertex-cloud-vertex-refused-bad"]
    health = health_of(bad, lambda h: h is not None and h.failures >= 1, "the refused channel's failure")
    assert health.last_error_kind == "auth"
    assert "invalid_grant" in health.last_error and "token exchange refused (400)" in health.last_error


@pytest.mark.parametrize("api", CLIENT_APIS)
def test_a_refused_token_exchange_on_the_only_channel_is_hopbases_error(gateway, world, api):
    response = post(gateway, api, world.key, "cloud-vertex-refused-alone", prompt(new_tag()), stream=True)

    # Every channel failed, none busy: table E's "otherwise" row, in the caller's format.
    assert response.status_code == (503 if api == "gemini" else 500)
    assert "invalid_grant" not in response.text and "token" not in response.text.lower()
    assert "hopbase-sim" not in response.text
    log = one_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts, log.error_kind) == ("failed", 1, "auth")


# -- failover across kinds (C1, F2) -------------------------------------------

FAILOVER = {
    # public model -> (the kinds the simulator sees asked, in order; the channel that serves)
    "cloud-azure-failover": (["azure", "vendor"], "openai-cloud-azure-failover-good"),
    "cloud-bedrock-busy": (["bedrock", "vendor"], "anthropic-cloud-bedrock-busy-good"),
    "cloud-bedrock-throttled": (["bedrock", "vendor"], "anthropic-cloud-bedrock-throttled-good"),
    "cloud-vertex-refused": (["vendor"], "gemini-cloud-vertex-refused-good"),  # no token: no model call
    "cloud-vendor-then-bedrock": (["vendor", "bedrock"], "bedrock-cloud-vendor-then-bedrock-good"),
    "cloud-vendor-then-vertex": (["vendor", "vertex"], "vertex-cloud-vendor-then-vertex-good"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", CLIENT_APIS)
@pytest.mark.parametrize("model", list(FAILOVER))
def test_a_failing_channel_of_one_kind_fails_over_to_another_unseen(gateway, world, simulator, model, api, stream):
    asked, serving = FAILOVER[model]
    tag = new_tag()
    text = prompt(tag, tokens=4)

    answer = ask(gateway, world.key, api, model, text, stream=stream)

    assert len(answer.text.split()) == 4 and answer.stop == "end"
    assert (answer.input_tokens, answer.output_tokens) == (words(text), 4)
    assert [kind_of(r) for r in tagged(simulator, tag)] == asked
    log = one_log(answer.request_id)
    assert (log.status, log.attempts, log.model) == ("completed", 2, model)
    assert log.channel_id == world.channels[serving]
    assert (log.input_tokens, log.output_tokens) == (words(text), 4)


@pytest.mark.parametrize("model", [
    "cloud-bedrock-slow", "cloud-vertex-slow"])
def test_claude_slow_to_start_on_a_cloud_is_abandoned_for_the_next_channel(gateway, world, simulator, model):
    """F3 holds on the clouds unchanged (C1): a Claude model without thinking
    that has not started within its limit (1 s here) is left for the next channel."""
    tag = new_tag()
    response = stream(gateway, "messages", world.key, model, prompt(tag, tokens=2))

    assert response.status_code == 200 and stream_errors(response.content) == []
    log = one_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts, log.channel_id) == ("completed", 2, world.channels[f"anthropic-{model}-fast"])
    slow, fast = tagged(simulator, tag)
    assert (kind_of(slow), kind_of(fast)) == (model.split("-")[1], "vendor")
    # The slow channel was hung up on, not left to answer (the simulator notes it as it sees it).
    wait_for(lambda: tagged(simulator, tag)[0]["client_closed_at"] is not None, timeout=5, what="the hang-up")


def test_a_throttled_bedrock_channel_is_shown_to_operators_as_busy(gateway, world):
    response = post(gateway, "messages", world.key, "cloud-bedrock-busy", prompt(new_tag(), tokens=2))
    assert response.status_code == 200 and "Throttling" not in response.text
    assert one_log(response.headers["x-hopbase-request-id"]).attempts == 2
    bad = world.channels["bedrock-cloud-bedrock-busy-bad"]
    health = health_of(bad, lambda h: h is not None and h.failures >= 1, "the throttled channel's failure")
    assert health.last_error_kind == "http_429" and "simulated" in health.last_error


# -- Vertex's tokens refused by the cloud ------------------------------------
# Revoking every token the simulator issued touches each Vertex channel of
# the session: this test is last, and each Vertex channel exchanges anew
# after its next refusal.


def test_a_token_the_cloud_no_longer_takes_fails_over_then_is_exchanged_anew(gateway, world, simulator):
    def exchanges() -> int:
        return httpx.get(f"{simulator.url}/_sim/tokens", timeout=5).json()["exchanges"]

    vertex = world.channels["vertex-cloud-vertex-first-main"]
    warm = post(gateway, "gemini", world.key, "cloud-vertex-first", prompt(new_tag()), stream=True)
    assert one_log(warm.headers["x-hopbase-request-id"]).channel_id == vertex  # it holds a live token
    before = exchanges()
    assert httpx.post(f"{simulator.url}/_sim/tokens", params={"revoke": 1}, timeout=5).status_code == 200

    # Vertex refuses the token (401): a channel failure, so the request moves on, unseen.
    moved = post(gateway, "gemini", world.key, "cloud-vertex-first", prompt(new_tag(), tokens=2), stream=True)
    assert moved.status_code == 200 and stream_errors(moved.content) == []
    log = one_log(moved.headers["x-hopbase-request-id"])
    assert (log.attempts, log.channel_id) == (2, world.channels["gemini-cloud-vertex-first-good"])
    health = health_of(vertex, lambda h: h is not None and h.failures >= 1, "the refused token's failure")
    assert health.last_error_kind == "http_401" and "UNAUTHENTICATED" in health.last_error
    assert exchanges() == before  # nothing exchanged yet: the refused token was only dropped

    # The next request exchanges the key for a new token, once, and is served by Vertex again.
    served = post(gateway, "gemini", world.key, "cloud-vertex-first", prompt(new_tag(), tokens=2), stream=True)
    log = one_log(served.headers["x-hopbase-request-id"])
    assert (served.status_code, log.attempts, log.channel_id) == (200, 1, vertex)
    assert exchanges() == before + 1


# -- counting tokens through a cloud ------------------------------------------

# public model -> where the simulator is asked to count, as it records it (None: no counting endpoint)
COUNTED_AT = {
    "cloud-azure": None,
    "cloud-bedrock": ("bedrock-anthropic", f"/model/{BEDROCK_CLAUDE[BEDROCK_CLAUDE.find('anthropic.'):]}/count-tokens"),
    "cloud-vertex-gemini": ("gemini", f"/publishers/google/models/{VERTEX_GEMINI}:countTokens"),
    "cloud-vertex-claude": ("anthropic", "/publishers/anthropic/models/count-tokens:rawPredict"),
}


@pytest.mark.parametrize("api", ["messages", "gemini"])
@pytest.mark.parametrize("model", list(SERVED))
def test_tokens_are_counted_by_the_cloud_serving_the_model(gateway, world, simulator, model, api):
    tag = new_tag()
    text = prompt(tag)
    response, counted = count_tokens(gateway, world.key, api, model, text)
    assert response.status_code == 200
    if COUNTED_AT[model] is None:
        assert response.headers["x-hopbase-estimated"] == "true" and counted == -(-len(text) // 4)
        assert tagged(simulator, tag) == []
        return
    assert "x-hopbase-estimated" not in response.headers and counted == words(text)
    # (One more before it, a 401, where an earlier test made the cloud forget Vertex's tokens.)
    *refused, record = tagged(simulator, tag)
    protocol, path_end = COUNTED_AT[model]
    assert record["protocol"] == protocol and record["path"].endswith(path_end), record["path"]
    assert record["status"] == 200 and [r["status"] for r in refused] in ([], [401])


def test_a_count_whose_token_the_cloud_no_longer_takes_is_asked_again_with_a_new_one(gateway, world, simulator):
    assert httpx.post(f"{simulator.url}/_sim/tokens", params={"revoke": "1"}).status_code == 200
    tag = new_tag()
    text = prompt(tag)
    response, counted = count_tokens(gateway, world.key, "messages", "cloud-vertex-claude", text)
    assert response.status_code == 200 and "x-hopbase-estimated" not in response.headers and counted == words(text)
    assert [r["status"] for r in tagged(simulator, tag)] == [401, 200]
