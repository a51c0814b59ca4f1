"""The gateway for Anthropic Messages clients, through the anthropic SDK (P3, S4, B9).

Shared checks and what they prove: tests/support/protocol_checks.py.
"""

from __future__ import annotations

import anthropic
import pytest

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.protocol_checks import (
    TOOL_ARGUMENTS,
    TOOL_NAME,
    WEATHER_TOOL_ANTHROPIC,
    anthropic_client,
    check_credentials,
    check_log,
    check_stream_headers,
    new_tag,
    prompt,
    upstream_record,
    words,
)

pytestmark = pytest.mark.gateway
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)




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
        # Anthropic's own API gets every flag, Claude Code's own among them (clouds keep an allow-list).
        betas=["interleaved-thinking-2025-05-14", "claude-code-20250219"],
    ) as stream:
        final = stream.get_final_message()
        request_id = stream.response.headers.get("x-hopbase-request-id")

    assert final.stop_reason == "end_turn"
    record = upstream_record(sim_records, tag)
    assert record["headers"]["anthropic-beta"] == "interleaved-thinking-2025-05-14,claude-code-20250219"
    assert record["headers"]["anthropic-version"] == claude.default_headers["anthropic-version"]
    check_credentials(record, "anthropic", world.key)
    check_log(world, request_id, protocol="messages", stream=True, input_tokens=words(text), output_tokens=3,
              model="claude-sim")


# --------------------------------------------------------------------------- cached usage (B9)


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
