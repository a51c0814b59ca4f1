"""The gateway for OpenAI Chat Completions clients, through the openai SDK (P1, S2, B9).

Shared checks and what they prove: tests/support/protocol_checks.py.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.protocol_checks import (
    TOOL_ARGUMENTS,
    TOOL_NAME,
    WEATHER_TOOL_OPENAI,
    check_credentials,
    check_log,
    check_stream_headers,
    hooked_openai,
    new_tag,
    prompt,
    upstream_record,
    words,
)

pytestmark = pytest.mark.gateway
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)




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
