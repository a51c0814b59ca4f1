"""The gateway per protocol, seen through the official SDKs (P1–P7, S2–S4).

Each test calls a real Daphne gateway with the openai, anthropic or
google-genai SDK, checks what the SDK hands back (against a direct call to
the upstream simulator where that is the point), then checks the request
log the gateway committed and what the simulator recorded of the upstream
request (credentials swapped, nothing of the client's key leaking).

The simulator counts one whitespace-separated word of prompt text as one
input token, directive included, and answers ``tokens`` text tokens plus
``thinking`` thinking tokens, so every expected count here is computed from
the prompt, never read back from the gateway.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types

from billing.models import RequestLog
from channels_pool.models import Channel
from hopbase.models import ApiKey

pytestmark = pytest.mark.gateway

UPSTREAM_SECRET = "sk-upstream-secret"
DIRECT_KEY = "sk-direct-to-simulator"
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = {"city": "Paris", "unit": "celsius"}
WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
    },
}
WEATHER_TOOL_ANTHROPIC = {
    "name": TOOL_NAME,
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
}
# Channel protocol of each request protocol, as RequestLog.protocol names it.
CHANNEL_PROTOCOL = {"chat": "openai", "responses": "openai", "messages": "anthropic", "gemini": "gemini"}


# --------------------------------------------------------------------------- helpers


def new_tag() -> str:
    return "p" + uuid.uuid4().hex[:12]


def prompt(tag: str, **directives: object) -> str:
    pairs = " ".join(f"{k}={v}" for k, v in {"tag": tag, **directives}.items())
    return f"Tell me something short and cheerful please [sim {pairs}]"


def words(*texts: str) -> int:
    """The simulator's tokenizer: one whitespace-separated word is one token."""
    return sum(len(text.split()) for text in texts)


def wait_for_log(request_id: str, timeout: float = 5.0):
    """The gateway writes a request's log row a moment after the response ends."""
    deadline = time.monotonic() + timeout
    while True:
        row = RequestLog.objects.filter(request_id=request_id).first()
        if row is not None:
            return row
        if time.monotonic() >= deadline:
            raise AssertionError(f"no RequestLog for {request_id} within {timeout} s")
        time.sleep(0.05)


def check_log(
    world,
    request_id: str | None,
    *,
    protocol: str,
    stream: bool,
    input_tokens: int,
    output_tokens: int,
    cache_read: int = 0,
    cache_write: int = 0,
    thinking: int = 0,
    model: str = "sim-model",
):
    assert request_id and request_id.startswith("req_"), request_id
    log = wait_for_log(request_id)
    assert log.status == "completed"
    assert log.protocol == protocol
    assert log.model == model
    assert log.stream is stream
    assert log.channel_id == world.channels[f"{CHANNEL_PROTOCOL[protocol]}-{model}-main"]
    assert log.attempts == 1
    key = ApiKey.objects.authenticate(world.key)
    assert (log.api_key_id, log.tenant_id) == (key.pk, key.tenant_id)
    assert (log.input_tokens, log.output_tokens) == (input_tokens, output_tokens)
    assert (log.cache_read_tokens, log.cache_write_tokens) == (cache_read, cache_write)
    assert log.thinking_tokens == thinking
    assert log.usage_estimated is False
    assert log.ttft_ms is not None
    assert log.ttft_ms <= log.duration_ms
    return log


def dump(model) -> dict:
    # Responses stream events hold parsed models pydantic warns about when dumping.
    return model.model_dump(mode="json", warnings=False)


def check_stream_headers(headers) -> None:
    headers = {name.lower(): value for name, value in headers.items()}
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache"
    assert "content-encoding" not in headers  # the SDKs ask for gzip; SSE must stay plain (0.1.4)
    assert headers["x-hopbase-request-id"].startswith("req_")


def upstream_record(sim_records, tag: str) -> dict:
    """The one request the gateway sent upstream for ``tag`` (direct calls use another key)."""
    records = [r for r in sim_records(tag) if r["api_key"] != DIRECT_KEY]
    assert len(records) == 1, records
    return records[0]


def check_credentials(record: dict, channel_protocol: str, client_key: str) -> None:
    """The channel secret in the provider's own auth header; the client's key nowhere."""
    headers = record["headers"]
    if channel_protocol == "openai":
        assert headers.get("authorization") == f"Bearer {UPSTREAM_SECRET}"
        assert "x-api-key" not in headers and "x-goog-api-key" not in headers
    elif channel_protocol == "anthropic":
        assert headers.get("x-api-key") == UPSTREAM_SECRET
        assert "authorization" not in headers and "x-goog-api-key" not in headers
    else:
        assert headers.get("x-goog-api-key") == UPSTREAM_SECRET
        assert "authorization" not in headers and "x-api-key" not in headers
    assert "key" not in record["query"]
    assert client_key not in json.dumps(headers)
    assert client_key not in json.dumps(record["query"])
    assert client_key not in record["path"]


def openai_client(gateway, key: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=20, **options)


def anthropic_client(gateway, key: str | None, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=20, **options)


def genai_client(base_url: str, key: str, api_version: str = "v1beta") -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base_url, api_version=api_version))


class RequestIds:
    """An httpx response hook: the x-hopbase-request-id of each response, for
    the SDKs' stream helpers, which do not expose raw headers."""

    def __init__(self) -> None:
        self.ids: list[str | None] = []

    def __call__(self, response) -> None:
        self.ids.append(response.headers.get("x-hopbase-request-id"))

    @property
    def only(self) -> str | None:
        assert len(self.ids) == 1, self.ids
        return self.ids[0]


def hooked_openai(gateway, key: str) -> tuple[openai.OpenAI, RequestIds]:
    ids = RequestIds()
    http = openai.DefaultHttpxClient(event_hooks={"response": [ids]})
    return openai_client(gateway, key, http_client=http), ids


@pytest.fixture
def oai(gateway, world) -> openai.OpenAI:
    return openai_client(gateway, world.key)


@pytest.fixture
def direct_oai(simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{simulator.url}/v1", api_key=DIRECT_KEY, max_retries=0, timeout=20)


@pytest.fixture
def claude(gateway, world) -> anthropic.Anthropic:
    return anthropic_client(gateway, world.key)


@pytest.fixture
def direct_claude(simulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=simulator.url, api_key=DIRECT_KEY, max_retries=0, timeout=20)


@pytest.fixture
def gem(gateway, world) -> genai.Client:
    return genai_client(gateway.url, world.key)


@pytest.fixture
def direct_gem(simulator) -> genai.Client:
    return genai_client(simulator.url, DIRECT_KEY)


# --------------------------------------------------------------------------- OpenAI Chat (P1, S2)


def test_it_answers_chat_create_like_the_provider(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=7, id=tag, created=1700000000)
    messages = [{"role": "user", "content": text}]

    raw = oai.chat.completions.with_raw_response.create(model="sim-model", messages=messages)
    completion = raw.parse()
    direct = direct_oai.chat.completions.create(model="sim-model", messages=messages)

    assert raw.status_code == 200
    # F4: the provider's exact non-streaming body, assembled from the channel's stream.
    assert completion.model_dump() == direct.model_dump()
    assert completion.id == f"chatcmpl-{tag}"
    assert completion.created == 1700000000
    assert completion.model == "sim-model"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 7
    assert choice.finish_reason == "stop"
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (words(text), 7)

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="chat", stream=False,
              input_tokens=words(text), output_tokens=7)
    record = upstream_record(sim_records, tag)
    check_credentials(record, "openai", world.key)
    # F4 and S2: the channel is always asked to stream, with usage.
    assert record["path"] == "/v1/chat/completions"
    assert record["body"]["stream"] is True
    assert record["body"]["stream_options"] == {"include_usage": True}


def test_it_streams_chat_with_usage_when_asked(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, id=tag, created=1700000000)
    kwargs = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    raw = oai.chat.completions.with_raw_response.create(**kwargs)
    check_stream_headers(raw.headers)
    chunks = list(raw.parse())
    direct = list(direct_oai.chat.completions.create(**kwargs))

    # P6: the provider's own chunks, unchanged.
    assert [c.model_dump() for c in chunks] == [c.model_dump() for c in direct]
    assert len("".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split()) == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][:-1] == [None] * (len(chunks) - 2)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (words(text), 6)
    assert all(c.choices for c in chunks[:-1])

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="chat", stream=True,
              input_tokens=words(text), output_tokens=6)
    record = upstream_record(sim_records, tag)
    check_credentials(record, "openai", world.key)


def test_it_streams_chat_without_a_usage_chunk_yet_logs_the_usage(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=5, id=tag, created=1700000000)
    messages = [{"role": "user", "content": text}]

    raw = oai.chat.completions.with_raw_response.create(model="sim-model", messages=messages, stream=True)
    check_stream_headers(raw.headers)
    chunks = list(raw.parse())
    direct = list(direct_oai.chat.completions.create(model="sim-model", messages=messages, stream=True))

    # S2: no chunk with empty choices, so chunk.choices[0] never raises.
    assert chunks and all(len(c.choices) == 1 for c in chunks)
    assert all(c.usage is None for c in chunks)
    # The same chunks as the provider sends a client that did not ask for usage
    # ("usage":null on each is the one tolerated difference, invisible here).
    assert [c.model_dump() for c in chunks] == [c.model_dump() for c in direct]
    assert len("".join(c.choices[0].delta.content or "" for c in chunks).split()) == 5
    assert chunks[-1].choices[0].finish_reason == "stop"

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="chat", stream=True,
              input_tokens=words(text), output_tokens=5)
    record = upstream_record(sim_records, tag)
    # HopBase asked the channel for usage anyway (S2).
    assert record["body"]["stream_options"] == {"include_usage": True}
    check_credentials(record, "openai", world.key)


def test_it_returns_a_chat_tool_call(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=0, tool=1, id=tag, created=1700000000)
    kwargs = {"model": "sim-model", "messages": [{"role": "user", "content": text}], "tools": [WEATHER_TOOL_OPENAI]}

    raw = oai.chat.completions.with_raw_response.create(**kwargs)
    completion = raw.parse()

    assert completion.model_dump() == direct_oai.chat.completions.create(**kwargs).model_dump()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id == f"call_{tag}"
    assert call.type == "function"
    assert call.function.name == TOOL_NAME
    assert json.loads(call.function.arguments) == TOOL_ARGUMENTS
    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="chat", stream=False,
              input_tokens=words(text), output_tokens=0)
    record = upstream_record(sim_records, tag)
    assert record["body"]["tools"] == [WEATHER_TOOL_OPENAI]
    check_credentials(record, "openai", world.key)


def test_it_streams_a_chat_tool_call(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=2, tool=1, id=tag, created=1700000000)
    kwargs = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": text}],
        "tools": [WEATHER_TOOL_OPENAI],
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    raw = oai.chat.completions.with_raw_response.create(**kwargs)
    chunks = list(raw.parse())
    direct = list(direct_oai.chat.completions.create(**kwargs))

    assert [c.model_dump() for c in chunks] == [c.model_dump() for c in direct]

    names, arguments = [], []
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                assert call.index == 0
                if call.function and call.function.name:
                    names.append(call.function.name)
                if call.function and call.function.arguments:
                    arguments.append(call.function.arguments)
    assert names == [TOOL_NAME]
    assert json.loads("".join(arguments)) == TOOL_ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == 2

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="chat", stream=True,
              input_tokens=words(text), output_tokens=2)
    check_credentials(upstream_record(sim_records, tag), "openai", world.key)


def test_it_serves_the_chat_stream_helper(gateway, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=4)
    messages = [{"role": "user", "content": text}]
    client, ids = hooked_openai(gateway, world.key)

    with client.chat.completions.stream(model="sim-model", messages=messages) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()

    expected = direct_oai.chat.completions.create(model="sim-model", messages=messages).choices[0].message.content
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == expected == "".join(deltas)
    check_log(world, ids.only, protocol="chat", stream=True, input_tokens=words(text), output_tokens=4)
    record = upstream_record(sim_records, tag)
    assert record["body"]["stream_options"] == {"include_usage": True}
    check_credentials(record, "openai", world.key)


# --------------------------------------------------------------------------- OpenAI Responses (P2, S3)


def test_it_answers_responses_create_like_the_provider(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=5, id=tag, created=1700000000)

    raw = oai.responses.with_raw_response.create(model="sim-model", input=text)
    response = raw.parse()
    direct = direct_oai.responses.create(model="sim-model", input=text)

    assert response.model_dump() == direct.model_dump()
    assert response.id == f"resp_{tag}"
    assert response.status == "completed"
    assert len(response.output_text.split()) == 5
    assert (response.usage.input_tokens, response.usage.output_tokens) == (words(text), 5)

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="responses", stream=False,
              input_tokens=words(text), output_tokens=5)
    record = upstream_record(sim_records, tag)
    assert record["path"] == "/v1/responses"
    assert record["body"]["stream"] is True
    check_credentials(record, "openai", world.key)


def test_it_serves_the_responses_stream_helper(gateway, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, id=tag, created=1700000000)
    client, ids = hooked_openai(gateway, world.key)

    with client.responses.stream(model="sim-model", input=text) as stream:
        events = list(stream)
        final = stream.get_final_response()
    with direct_oai.responses.stream(model="sim-model", input=text) as stream:
        direct = list(stream)

    assert [dump(e) for e in events] == [dump(e) for e in direct]
    assert [e.sequence_number for e in events] == list(range(len(events)))

    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 6
    assert final.status == "completed"
    assert final.output_text == "".join(deltas)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (words(text), 6)
    assert final.id == events[0].response.id

    check_log(world, ids.only, protocol="responses", stream=True, input_tokens=words(text), output_tokens=6)
    check_credentials(upstream_record(sim_records, tag), "openai", world.key)


def test_it_streams_a_responses_reasoning_summary(gateway, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3, thinking=3)
    client, ids = hooked_openai(gateway, world.key)

    with client.responses.stream(
        model="sim-model", input=text, reasoning={"effort": "low", "summary": "auto"}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()

    summary = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert len(summary) == 3
    types_in_order = [e.type for e in events]
    assert types_in_order.index("response.reasoning_summary_text.delta") < types_in_order.index(
        "response.output_text.delta"
    )
    reasoning = [item for item in final.output if item.type == "reasoning"]
    assert reasoning[0].summary[0].text == "".join(summary)
    assert final.usage.output_tokens == 6
    assert final.usage.output_tokens_details.reasoning_tokens == 3

    check_log(world, ids.only, protocol="responses", stream=True, input_tokens=words(text), output_tokens=6,
              thinking=3)
    record = upstream_record(sim_records, tag)
    assert record["body"]["reasoning"] == {"effort": "low", "summary": "auto"}
    check_credentials(record, "openai", world.key)


# --------------------------------------------------------------------------- Anthropic Messages (P3, S4)


def claude_call(client: anthropic.Anthropic, stream: bool, **kwargs):
    """(final message, x-hopbase-request-id, streamed events) via the stream helper or create."""
    if stream:
        with client.messages.stream(**kwargs) as manager:
            events = list(manager)
            return manager.get_final_message(), manager.response.headers.get("x-hopbase-request-id"), events
    raw = client.messages.with_raw_response.create(**kwargs)
    return raw.parse(), raw.headers.get("x-hopbase-request-id"), []


def test_it_answers_messages_create_like_the_provider(claude, direct_claude, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=5, id=tag)
    kwargs = {"model": "claude-sim", "max_tokens": 256, "messages": [{"role": "user", "content": text}]}

    raw = claude.messages.with_raw_response.create(**kwargs)
    message = raw.parse()
    direct = direct_claude.messages.create(**kwargs)

    # F4: the exact non-streaming body, assembled from the channel's stream.
    assert message.model_dump() == direct.model_dump()
    assert message.id == f"msg_{tag}"
    assert [block.type for block in message.content] == ["text"]
    assert len(message.content[0].text.split()) == 5
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (words(text), 5)

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="messages", stream=False,
              input_tokens=words(text), output_tokens=5, model="claude-sim")
    record = upstream_record(sim_records, tag)
    assert record["path"] == "/v1/messages"
    assert record["body"]["stream"] is True
    check_credentials(record, "anthropic", world.key)


def test_it_serves_the_messages_stream_helper(claude, direct_claude, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, id=tag)
    kwargs = {"model": "claude-sim", "max_tokens": 256, "messages": [{"role": "user", "content": text}]}

    with claude.messages.stream(**kwargs) as stream:
        check_stream_headers(stream.response.headers)
        events = list(stream)
        final = stream.get_final_message()
        request_id = stream.response.headers.get("x-hopbase-request-id")
    with direct_claude.messages.stream(**kwargs) as stream:
        direct_events = list(stream)
        direct = stream.get_final_message()

    assert [e.model_dump() for e in events] == [e.model_dump() for e in direct_events]
    assert final.model_dump() == direct.model_dump()
    streamed_text = "".join(e.text for e in events if e.type == "text")
    assert final.content[0].type == "text"
    assert final.content[0].text == streamed_text
    assert final.stop_reason == "end_turn"
    # message_delta usage is cumulative: output_tokens is the whole answer.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (words(text), 6)

    check_log(world, request_id, protocol="messages", stream=True, input_tokens=words(text), output_tokens=6,
              model="claude-sim")
    check_credentials(upstream_record(sim_records, tag), "anthropic", world.key)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_returns_a_messages_tool_use(claude, direct_claude, world, sim_records, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=2, tool=1, id=tag)
    kwargs = {
        "model": "claude-sim",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": text}],
        "tools": [WEATHER_TOOL_ANTHROPIC],
    }

    message, request_id, events = claude_call(claude, stream, **kwargs)
    direct, _, direct_events = claude_call(direct_claude, stream, **kwargs)

    assert message.model_dump() == direct.model_dump()
    assert [e.model_dump() for e in events] == [e.model_dump() for e in direct_events]
    assert [block.type for block in message.content] == ["text", "tool_use"]
    tool_use = message.content[1]
    assert tool_use.name == TOOL_NAME
    assert tool_use.input == TOOL_ARGUMENTS
    assert tool_use.id == f"toolu_{tag}"
    assert message.stop_reason == "tool_use"
    check_log(world, request_id, protocol="messages", stream=stream, input_tokens=words(text), output_tokens=2,
              model="claude-sim")
    record = upstream_record(sim_records, tag)
    assert record["body"]["tools"] == [WEATHER_TOOL_ANTHROPIC]
    check_credentials(record, "anthropic", world.key)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_returns_messages_thinking_then_text(claude, direct_claude, world, sim_records, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=4, thinking=3, id=tag)
    kwargs = {
        "model": "claude-sim",
        "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": text}],
    }

    message, request_id, events = claude_call(claude, stream, **kwargs)
    direct, _, direct_events = claude_call(direct_claude, stream, **kwargs)

    assert message.model_dump() == direct.model_dump()
    assert [e.model_dump() for e in events] == [e.model_dump() for e in direct_events]
    if stream:
        assert len([e.thinking for e in events if e.type == "thinking"]) == 3
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert len(message.content[0].thinking.split()) == 3
    assert message.content[0].signature
    assert len(message.content[1].text.split()) == 4
    assert message.usage.output_tokens == 7
    # Anthropic reports no separate thinking count; the thinking is inside output.
    check_log(world, request_id, protocol="messages", stream=stream, input_tokens=words(text), output_tokens=7,
              model="claude-sim")
    assert upstream_record(sim_records, tag)["body"]["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_it_accepts_an_anthropic_x_api_key(gateway, world, sim_records, committed_db, monkeypatch):
    # Without an api_key the SDK would fall back to these and add a Bearer header.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    tag = new_tag()
    text = prompt(tag, tokens=3)
    client = anthropic_client(gateway, None, default_headers={"x-api-key": world.key})

    raw = client.messages.with_raw_response.create(
        model="claude-sim", max_tokens=64, messages=[{"role": "user", "content": text}]
    )
    message = raw.parse()

    assert "authorization" not in {k.lower() for k in raw.http_request.headers}
    assert raw.http_request.headers["x-api-key"] == world.key
    assert len(message.content[0].text.split()) == 3
    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="messages", stream=False,
              input_tokens=words(text), output_tokens=3, model="claude-sim")
    check_credentials(upstream_record(sim_records, tag), "anthropic", world.key)


def test_it_forwards_anthropic_beta(claude, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3)

    with claude.beta.messages.stream(
        model="claude-sim",
        max_tokens=64,
        messages=[{"role": "user", "content": text}],
        betas=["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"],
    ) as stream:
        final = stream.get_final_message()
        request_id = stream.response.headers.get("x-hopbase-request-id")

    assert final.stop_reason == "end_turn"
    record = upstream_record(sim_records, tag)
    assert record["headers"]["anthropic-beta"] == "interleaved-thinking-2025-05-14,context-1m-2025-08-07"
    assert record["headers"]["anthropic-version"] == claude.default_headers["anthropic-version"]
    check_credentials(record, "anthropic", world.key)
    check_log(world, request_id, protocol="messages", stream=True, input_tokens=words(text), output_tokens=3,
              model="claude-sim")


# --------------------------------------------------------------------------- Gemini (P4)


def without_http(response: types.GenerateContentResponse) -> dict:
    return response.model_dump(exclude={"sdk_http_response"})


def request_id_of(response: types.GenerateContentResponse) -> str | None:
    headers = response.sdk_http_response.headers if response.sdk_http_response else {}
    return {k.lower(): v for k, v in (headers or {}).items()}.get("x-hopbase-request-id")


def test_it_answers_gemini_generate_content_like_the_provider(gem, direct_gem, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=5, id=tag)

    response = gem.models.generate_content(model="sim-model", contents=text)
    direct = direct_gem.models.generate_content(model="sim-model", contents=text)

    assert without_http(response) == without_http(direct)
    assert len(response.text.split()) == 5
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    usage = response.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count) == (
        words(text), 5, words(text) + 5
    )
    assert usage.model_dump() == direct.usage_metadata.model_dump()

    check_log(world, request_id_of(response), protocol="gemini", stream=False, input_tokens=words(text),
              output_tokens=5)
    record = upstream_record(sim_records, tag)
    assert record["path"] == "/v1beta/models/sim-model:streamGenerateContent"
    assert record["query"] == {"alt": "sse"}
    check_credentials(record, "gemini", world.key)


def test_it_streams_gemini_generate_content(gem, direct_gem, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, id=tag)

    chunks = list(gem.models.generate_content_stream(model="sim-model", contents=text))
    direct = list(direct_gem.models.generate_content_stream(model="sim-model", contents=text))

    assert [without_http(c) for c in chunks] == [without_http(c) for c in direct]
    check_stream_headers(chunks[0].sdk_http_response.headers)
    assert len("".join(c.text or "" for c in chunks).split()) == 6
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    usage = chunks[-1].usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count) == (words(text), 6)

    check_log(world, request_id_of(chunks[0]), protocol="gemini", stream=True, input_tokens=words(text),
              output_tokens=6)
    check_credentials(upstream_record(sim_records, tag), "gemini", world.key)


@pytest.mark.parametrize("api_version", ["v1", "v1alpha"])
def test_it_routes_every_gemini_api_version(gateway, world, sim_records, committed_db, api_version):
    tag = new_tag()
    text = prompt(tag, tokens=3)
    client = genai_client(gateway.url, world.key, api_version=api_version)

    response = client.models.generate_content(model="sim-model", contents=text)

    assert len(response.text.split()) == 3
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    record = upstream_record(sim_records, tag)
    assert record["path"] == f"/{api_version}/models/sim-model:streamGenerateContent"
    check_log(world, request_id_of(response), protocol="gemini", stream=False, input_tokens=words(text),
              output_tokens=3)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_returns_gemini_thoughts(gem, direct_gem, world, sim_records, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=4, thinking=3, id=tag)
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))

    if stream:
        chunks = list(gem.models.generate_content_stream(model="sim-model", contents=text, config=config))
        direct = direct_gem.models.generate_content_stream(model="sim-model", contents=text, config=config)
        assert [without_http(c) for c in chunks] == [without_http(c) for c in direct]
        check_stream_headers(chunks[0].sdk_http_response.headers)
        parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts or ()]
        thoughts = [p.text for p in parts if p.thought]
        answer = [p.text for p in parts if not p.thought and p.text]
        assert len(thoughts) == 3
        last, first = chunks[-1], chunks[0]
        assert first.candidates[0].content.parts[0].thought is True
    else:
        last = first = gem.models.generate_content(model="sim-model", contents=text, config=config)
        direct = direct_gem.models.generate_content(model="sim-model", contents=text, config=config)
        assert without_http(last) == without_http(direct)
        parts = last.candidates[0].content.parts
        assert [bool(p.thought) for p in parts] == [True, False]
        thoughts, answer = [parts[0].text], [parts[1].text]

    assert len("".join(thoughts).split()) == 3
    assert len("".join(answer).split()) == 4
    assert last.usage_metadata.thoughts_token_count == 3
    assert last.usage_metadata.candidates_token_count == 4
    # Billed output is candidates + thoughts.
    check_log(world, request_id_of(first), protocol="gemini", stream=stream, input_tokens=words(text),
              output_tokens=7, thinking=3)
    body = upstream_record(sim_records, tag)["body"]
    assert body["generationConfig"]["thinkingConfig"] in ({"includeThoughts": True}, {"include_thoughts": True})


def test_it_accepts_a_gemini_query_key_and_keeps_it_off_the_upstream_url(gateway, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3)

    response = httpx.post(
        f"{gateway.url}/v1beta/models/sim-model:generateContent",
        params={"key": world.key},
        json={"contents": [{"role": "user", "parts": [{"text": text}]}]},
        timeout=20,
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["candidates"][0]["finishReason"] == "STOP"
    assert len(body["candidates"][0]["content"]["parts"][0]["text"].split()) == 3
    record = upstream_record(sim_records, tag)
    assert record["query"] == {"alt": "sse"}
    check_credentials(record, "gemini", world.key)
    check_log(world, response.headers.get("x-hopbase-request-id"), protocol="gemini", stream=False,
              input_tokens=words(text), output_tokens=3)


# --------------------------------------------------------------------------- model lists (P5)


def served_models(channel_protocol: str) -> list[str]:
    """Every model a channel of this protocol serves: what a key for every model may list."""
    names = {m for c in Channel.objects.filter(protocol=channel_protocol) for m in c.served_models}
    assert {"sim-model", "claude-sim"} <= names
    return sorted(names)


def test_it_lists_models_for_openai(oai, gateway, world, committed_db):
    raw = oai.models.with_raw_response.list()
    page = raw.parse()
    assert raw.headers["x-hopbase-request-id"].startswith("req_")
    assert [m.id for m in page.data] == served_models("openai")
    assert {m.object for m in page.data} == {"model"}

    limited = openai_client(gateway, world.limited_key).models.list()
    assert [m.id for m in limited.data] == ["sim-model"]


def test_it_lists_models_for_anthropic(claude, gateway, world, committed_db):
    raw = claude.models.with_raw_response.list()
    page = raw.parse()
    assert raw.headers["x-hopbase-request-id"].startswith("req_")
    assert [m.id for m in page.data] == served_models("anthropic")
    assert {m.type for m in page.data} == {"model"}
    assert page.has_more is False

    limited = anthropic_client(gateway, world.limited_key).models.list()
    assert [m.id for m in limited.data] == ["sim-model"]


@pytest.mark.parametrize("api_version", ["v1beta", "v1"])
def test_it_lists_models_for_gemini(gateway, world, committed_db, api_version):
    # Keep each client referenced: a collected genai client closes its transport.
    client = genai_client(gateway.url, world.key, api_version)
    assert [m.name for m in client.models.list()] == [f"models/{m}" for m in served_models("gemini")]

    limited = genai_client(gateway.url, world.limited_key, api_version)
    assert [m.name for m in limited.models.list()] == ["models/sim-model"]


def test_each_sdk_looks_up_one_model_it_may_use(oai, claude, gateway, world, committed_db):
    assert oai.models.retrieve("sim-model").id == "sim-model"
    assert claude.models.retrieve("sim-model").id == "sim-model"
    client = genai_client(gateway.url, world.key)
    assert client.models.get(model="sim-model").name == "models/sim-model"
    with pytest.raises(openai.NotFoundError):
        openai_client(gateway, world.limited_key).models.retrieve("claude-sim")
    with pytest.raises(anthropic.NotFoundError):
        claude.models.retrieve("no-such-model")


# --------------------------------------------------------------------------- cached usage (B9)


def test_it_bills_chat_input_without_cached_tokens(oai, world, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3, cached=2)

    raw = oai.chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": text}], stream=True,
        stream_options={"include_usage": True},
    )
    usage = list(raw.parse())[-1].usage

    assert usage.prompt_tokens == words(text)
    assert usage.prompt_tokens_details.cached_tokens == 2
    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="chat", stream=True,
              input_tokens=words(text) - 2, output_tokens=3, cache_read=2)


def test_it_bills_responses_input_without_cached_tokens(oai, world, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3, cached=2)

    raw = oai.responses.with_raw_response.create(model="sim-model", input=text)
    response = raw.parse()

    assert response.usage.input_tokens_details.cached_tokens == 2
    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="responses", stream=False,
              input_tokens=words(text) - 2, output_tokens=3, cache_read=2)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_bills_gemini_input_without_cached_tokens(gem, world, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=3, cached=2)

    if stream:
        chunks = list(gem.models.generate_content_stream(model="sim-model", contents=text))
        first, usage = chunks[0], chunks[-1].usage_metadata
    else:
        first = gem.models.generate_content(model="sim-model", contents=text)
        usage = first.usage_metadata

    assert (usage.prompt_token_count, usage.cached_content_token_count) == (words(text), 2)
    check_log(world, request_id_of(first), protocol="gemini", stream=stream, input_tokens=words(text) - 2,
              output_tokens=3, cache_read=2)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_bills_anthropic_cache_reads_and_writes_apart(claude, world, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=3, cache_write=3, cached=2)
    kwargs = {"model": "claude-sim", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}

    if stream:
        with claude.messages.stream(**kwargs) as manager:
            usage = manager.get_final_message().usage
            request_id = manager.response.headers.get("x-hopbase-request-id")
    else:
        raw = claude.messages.with_raw_response.create(**kwargs)
        usage, request_id = raw.parse().usage, raw.headers.get("x-hopbase-request-id")

    # Anthropic's input_tokens already excludes cache reads and writes.
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (
        words(text) - 5, 2, 3
    )
    check_log(world, request_id, protocol="messages", stream=stream, input_tokens=words(text) - 5, output_tokens=3,
              cache_read=2, cache_write=3, model="claude-sim")


# --------------------------------------------------------------------------- hygiene (0.3)


def call_each_protocol(gateway, world, protocol: str, text: str) -> None:
    # The customer's own OpenAI org and project mean nothing to HopBase's account.
    customer = {"organization": "org-customer", "project": "proj_customer"}
    if protocol == "chat":
        list(openai_client(gateway, world.key, **customer).chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": text}], stream=True))
    elif protocol == "responses":
        openai_client(gateway, world.key, **customer).responses.create(model="sim-model", input=text)
    elif protocol == "messages":
        with anthropic_client(gateway, world.key).messages.stream(
            model="claude-sim", max_tokens=64, messages=[{"role": "user", "content": text}]
        ) as stream:
            stream.get_final_message()
    else:
        client = genai_client(gateway.url, world.key)
        client.models.generate_content(model="sim-model", contents=text)


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "gemini"])
def test_it_sends_upstream_only_the_channel_secret(gateway, world, sim_records, protocol):
    tag = new_tag()

    call_each_protocol(gateway, world, protocol, prompt(tag, tokens=2))

    record = upstream_record(sim_records, tag)
    check_credentials(record, CHANNEL_PROTOCOL[protocol], world.key)
    assert "openai-organization" not in record["headers"]
    assert "openai-project" not in record["headers"]


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "gemini"])
def test_it_does_not_ask_the_channel_for_compression(gateway, world, sim_records, protocol):
    tag = new_tag()

    call_each_protocol(gateway, world, protocol, prompt(tag, tokens=2))

    # The relay reads the channel's raw bytes (no decoding) to split events and
    # inject keep-alives between them, so it must not ask for compression (0.3, 0.1.4).
    accept_encoding = upstream_record(sim_records, tag)["headers"].get("accept-encoding", "identity")
    assert {coding.strip() for coding in accept_encoding.split(",")} <= {"identity", ""}, accept_encoding


# --------------------------------------------------------------------------- headers back to the client (0.3)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_passes_on_the_provider_request_id(oai, claude, stream):
    """protocols.md 0.3: the provider's x-request-id (openai) and request-id
    (anthropic) reach the client, where the SDKs expose them as ``request_id``."""
    tag = new_tag()
    ids = re.compile(r"req_[0-9a-f]{24}")

    raw = oai.chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": prompt(tag, tokens=2)}], stream=stream
    )
    completion = raw.parse()
    if stream:
        list(completion)
    else:
        assert completion._request_id == raw.headers.get("x-request-id")
    assert ids.fullmatch(raw.headers.get("x-request-id") or ""), dict(raw.headers)
    assert raw.headers["x-request-id"] != raw.headers["x-hopbase-request-id"]

    kwargs = {"model": "claude-sim", "max_tokens": 64, "messages": [{"role": "user", "content": prompt(tag, tokens=2)}]}
    if stream:
        with claude.messages.stream(**kwargs) as manager:
            manager.get_final_message()
            request_id, ours = manager.request_id, manager.response.headers.get("x-hopbase-request-id")
    else:
        raw = claude.messages.with_raw_response.create(**kwargs)
        request_id, ours = raw.parse()._request_id, raw.headers.get("x-hopbase-request-id")
    assert ids.fullmatch(request_id or ""), request_id
    assert request_id != ours
