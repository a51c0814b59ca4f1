"""The simulator's wire formats, checked with the official SDKs the gateway's clients use.

If the simulator's bytes drift from what OpenAI, Anthropic and Google send, every
gateway test built on it proves nothing; so each protocol is parsed here by its
own SDK, whole and streamed, and its error bodies are checked for the exception
each SDK raises. No database is touched.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from simulator.wire import THINKING_WORDS, TOOL_ARGUMENTS
from tests.support.simulator_harness import PROMPT, Sim, chat, expected_text, serving, sse_blocks, words_in

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with serving() as server:
        yield server


# --------------------------------------------------------------------------- OpenAI Chat


def test_it_counts_words_as_tokens_not_characters(sim: Sim) -> None:
    prompt = f"{PROMPT} [sim tag=chat-plain cached=3]"
    reply = sim.openai().chat.completions.create(model="gpt-x", messages=[
        {"role": "system", "content": "Be brief"}, {"role": "user", "content": prompt}])
    text = reply.choices[0].message.content
    assert text == expected_text(12)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == 12 != len(text) // 4
    assert reply.usage.prompt_tokens == words_in("Be brief", prompt) == 12
    assert reply.usage.prompt_tokens != len("Be brief" + prompt) // 4
    assert reply.usage.prompt_tokens_details.cached_tokens == 3
    record = sim.record("chat-plain")
    assert (record["protocol"], record["model"], record["stream"], record["status"]) == ("chat", "gpt-x", False, 200)
    assert record["completed"] is True and record["tokens_sent"] == 12
    assert json.loads(base64.b64decode(record["sent_b64"]))["usage"]["completion_tokens"] == 12


def test_it_streams_chat_with_a_usage_chunk_only_when_asked(sim: Sim) -> None:
    client = sim.openai()
    chunks = list(client.chat.completions.create(
        model="m", stream=True, stream_options={"include_usage": True},
        messages=chat(f"{PROMPT} [sim tag=chat-usage id=abc created=1700000000]")))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_text(12)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 11
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {"chatcmpl-abc"} and chunks[0].created == 1700000000
    blocks = sse_blocks(sim.sent("chat-usage"))
    assert blocks[-1] == "data: [DONE]"
    assert all('"usage":null' in b for b in blocks[:-2])

    plain = list(client.chat.completions.create(model="m", stream=True, messages=chat("[sim tag=chat-nousage]")))
    assert all(c.choices for c in plain)
    assert plain[-1].choices[0].finish_reason == "stop"
    assert '"usage"' not in sim.sent("chat-nousage").decode()


def test_it_streams_chat_thinking_and_a_tool_call(sim: Sim) -> None:
    stream = sim.openai().chat.completions.create(
        model="m", stream=True, stream_options={"include_usage": True}, tools=[TOOL],
        messages=chat("[sim thinking=3 tokens=2 tool=1]"))
    reasoning, text, arguments, finish, usage = "", "", "", None, None
    fragments = 0
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        text += delta.content or ""
        for call in delta.tool_calls or []:
            arguments += call.function.arguments or ""
            fragments += bool(call.function.arguments)
            assert call.index == 0
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == expected_text(3, THINKING_WORDS)
    assert text == expected_text(2)
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"} and fragments >= 3
    assert finish == "tool_calls"
    assert usage.completion_tokens == 5 and usage.completion_tokens_details.reasoning_tokens == 3

    whole = sim.openai().chat.completions.create(model="m", messages=chat("[sim thinking=3 tokens=0 tool=1]"))
    message = whole.choices[0].message
    assert message.content is None and message.model_extra["reasoning_content"] == expected_text(3, THINKING_WORDS)
    assert message.tool_calls[0].function.name == "get_weather"
    assert message.tool_calls[0].function.arguments == TOOL_ARGUMENTS
    assert whole.choices[0].finish_reason == "tool_calls" and whole.usage.completion_tokens == 3


# --------------------------------------------------------------------------- OpenAI Responses


def test_it_answers_responses_whole_and_streamed_alike(sim: Sim) -> None:
    client = sim.openai()
    prompt = f"{PROMPT} [sim thinking=2 tool=1 id=r1 created=1700000001 cached=2 tag=resp]"
    whole = client.responses.create(model="m", instructions="Be brief", input=prompt)
    assert whole.id == "resp_r1" and whole.status == "completed"
    assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output_text == expected_text(12)
    assert whole.output[0].summary[0].text == expected_text(2, THINKING_WORDS)
    assert whole.output[2].arguments == TOOL_ARGUMENTS and whole.output[2].call_id == "call_r1"
    assert whole.usage.input_tokens == words_in("Be brief", prompt)
    assert whole.usage.output_tokens == 14 and whole.usage.output_tokens_details.reasoning_tokens == 2
    assert whole.usage.input_tokens_details.cached_tokens == 2

    with client.responses.stream(model="m", instructions="Be brief", input=prompt) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected_text(12)
    assert sum(e.type == "response.function_call_arguments.delta" for e in events) >= 3
    assert final.output_text == whole.output_text and final.usage == whole.usage
    # The terminal event carries exactly the body a non-streaming call gets.
    whole_record, stream_record = sim.records("resp")
    completed = sse_blocks(base64.b64decode(stream_record["sent_b64"]))[-1]
    assert completed.startswith("event: response.completed\ndata: ")
    terminal = json.loads(completed.split("data: ", 1)[1])
    assert terminal["response"] == json.loads(base64.b64decode(whole_record["sent_b64"]))


# --------------------------------------------------------------------------- Anthropic


def test_it_answers_anthropic_whole_and_streamed_alike(sim: Sim) -> None:
    client = sim.anthropic()
    prompt = f"{PROMPT} [sim thinking=2 tool=1 id=a1 cached=3 cache_write=1 tag=ant]"
    kwargs: dict[str, Any] = {"model": "claude-x", "max_tokens": 2048, "system": "Be brief",
                              "messages": chat(prompt), "thinking": {"type": "enabled", "budget_tokens": 1024}}
    whole = client.messages.create(**kwargs)
    assert whole.id == "msg_a1" and whole.stop_reason == "tool_use"
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.content[0].thinking == expected_text(2, THINKING_WORDS) and whole.content[0].signature
    assert whole.content[1].text == expected_text(12)
    assert whole.content[2].input == {"city": "Paris", "unit": "celsius"}
    # Anthropic's input_tokens excludes cache reads and writes; together they are the prompt.
    prompt_words = words_in("Be brief", prompt)
    assert (whole.usage.input_tokens, whole.usage.cache_read_input_tokens, whole.usage.cache_creation_input_tokens) \
        == (prompt_words - 4, 3, 1)
    assert whole.usage.output_tokens == 14

    with client.messages.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.model_dump() == whole.model_dump()
    blocks = sse_blocks(base64.b64decode(sim.records("ant")[1]["sent_b64"]))
    assert blocks[1] == 'event: ping\ndata: {"type":"ping"}'
    start = json.loads(blocks[0].split("data: ", 1)[1])
    assert start["message"]["usage"]["output_tokens"] == 1  # message_delta's cumulative count replaces it


def test_it_answers_anthropic_text_only_by_default(sim: Sim) -> None:
    reply = sim.anthropic().messages.create(model="c", max_tokens=50, messages=chat(PROMPT))
    assert [b.type for b in reply.content] == ["text"] and reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens == 12 and reply.usage.input_tokens == 7


# --------------------------------------------------------------------------- Gemini


def test_it_answers_gemini_whole_and_streamed_alike(sim: Sim) -> None:
    client = sim.gemini()
    prompt = f"{PROMPT} [sim thinking=2 tool=1 id=g1 cached=2 tag=gem]"
    config = genai_types.GenerateContentConfig(system_instruction="Be brief")
    whole = client.models.generate_content(model="gemini-2.5-flash", contents=prompt, config=config)
    parts = whole.candidates[0].content.parts
    assert [bool(p.thought) for p in parts[:2]] == [True, False]
    assert parts[1].text == expected_text(12) and parts[0].text == expected_text(2, THINKING_WORDS)
    assert parts[2].function_call.name == "get_weather"
    assert parts[2].function_call.args == {"city": "Paris", "unit": "celsius"}
    usage = whole.usage_metadata
    assert usage.prompt_token_count == words_in("Be brief", prompt) and usage.cached_content_token_count == 2
    assert (usage.candidates_token_count, usage.thoughts_token_count) == (12, 2)
    assert usage.total_token_count == usage.prompt_token_count + 14
    assert whole.response_id == "g1" and whole.candidates[0].finish_reason == "STOP"

    chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents=prompt, config=config))
    thoughts = "".join(p.text for c in chunks for p in c.candidates[0].content.parts if p.thought)
    text = "".join(p.text or "" for c in chunks for p in c.candidates[0].content.parts if not p.thought)
    assert (thoughts, text) == (expected_text(2, THINKING_WORDS), expected_text(12))
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    assert chunks[-1].usage_metadata.model_dump() == usage.model_dump()
    assert chunks[-1].candidates[0].content.parts[0].function_call.args == {"city": "Paris", "unit": "celsius"}
    records = sim.records("gem")
    assert records[1]["query"] == {"alt": "sse"} and records[1]["stream"] is True
    raw = base64.b64decode(records[1]["sent_b64"])
    assert raw.startswith(b"data: {") and raw.endswith(b"}\r\n\r\n") and b"\n\n" not in raw


def test_it_routes_gemini_v1_and_the_json_array_stream(sim: Sim) -> None:
    reply = sim.gemini(version="v1").models.generate_content(model="gemini-2.5-flash", contents="[sim tokens=3]")
    assert reply.text == expected_text(3)
    response = sim.http.post(f"{sim.base}/v1alpha/models/gemini-x:streamGenerateContent",
                          json={"contents": [{"role": "user", "parts": [{"text": "one two [sim tokens=2]"}]}]})
    assert response.headers["content-type"].startswith("application/json")
    assert re.fullmatch(rb"\[\{.*\}\n,\r\n\{.*\}\n,\r\n\{.*\}\n\]", response.content, re.S)
    chunks = response.json()
    assert [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks] == ["héllo", " world", ""]
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == 2
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] == 4


# --------------------------------------------------------------------------- HTTP errors


@pytest.mark.parametrize(("status", "error_class"), [
    (429, openai.RateLimitError), (529, openai.InternalServerError), (401, openai.AuthenticationError)])
def test_it_fails_openai_with_the_status_class(sim: Sim, status: int, error_class: type[Exception]) -> None:
    with pytest.raises(error_class) as caught:
        sim.openai(f"sim:status={status}").chat.completions.create(model="m", messages=chat("hi"), stream=True)
    assert caught.value.status_code == status and "simulated" in caught.value.message
    with pytest.raises(error_class):
        sim.openai().responses.create(model="m", input=f"[sim status={status}]")


@pytest.mark.parametrize(("status", "error_class", "error_type"), [
    (529, anthropic.OverloadedError, "overloaded_error"), (429, anthropic.RateLimitError, "rate_limit_error"),
    (500, anthropic.InternalServerError, "api_error"), (400, anthropic.BadRequestError, "invalid_request_error")])
def test_it_fails_anthropic_with_the_status_class(sim: Sim, status: int, error_class: type[Exception],
                                                    error_type: str) -> None:
    with pytest.raises(error_class) as caught:
        sim.anthropic(f"sim:status={status}").messages.create(model="c", max_tokens=5, messages=chat("hi"))
    assert caught.value.status_code == status
    assert caught.value.body["error"]["type"] == error_type
    assert "simulated" in caught.value.body["error"]["message"]


def test_it_fails_gemini_with_google_error_bodies(sim: Sim) -> None:
    with pytest.raises(genai_errors.ClientError) as caught:
        sim.gemini("sim:status=429").models.generate_content(model="g", contents="hi")
    assert (caught.value.code, caught.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert "simulated" in caught.value.message
    with pytest.raises(genai_errors.ServerError) as caught:
        list(sim.gemini().models.generate_content_stream(model="g", contents="[sim status=503]"))
    assert (caught.value.code, caught.value.status) == (503, "UNAVAILABLE")
    with pytest.raises(genai_errors.ClientError) as caught:
        sim.gemini("sim:status=400,reason=API_KEY_INVALID").models.generate_content(model="g", contents="hi")
    assert caught.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"
