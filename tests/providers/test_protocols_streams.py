"""Every protocol's watcher, and every translated answer's writer: a
stream's text is counted as it passes and never kept (a long answer would
hold tens of bytes a token for as long as its stream is open), while an
answer the client takes whole is assembled from the same events (F4)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable

import pytest

from core.sse import Event
from core.usage import Usage
from providers.anthropic.stream import AnthropicWriter
from providers.apis import CHAT, GEMINI, MESSAGES
from providers.base import Api, RequestFacts
from providers.google.stream import GeminiWriter
from providers.neutral import TextDelta
from providers.openai.chat_stream import ChatWriter

DELTAS = 4000
WORD = "word "


def chat_facts(stream: bool) -> RequestFacts:
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return CHAT.parse(body, json.dumps(body).encode(), {})


def messages_facts(stream: bool) -> RequestFacts:
    body = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return MESSAGES.parse(body, json.dumps(body).encode(), {})


def gemini_facts(stream: bool) -> RequestFacts:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    action = "streamGenerateContent" if stream else "generateContent"
    route = {"model": "gemini-test", "action": action, "version": "v1beta", "alt": "sse"}
    return GEMINI.parse(body, json.dumps(body).encode(), route)


def sse(data: dict, name: str | None = None) -> bytes:
    return (f"event: {name}\n" if name else "").encode() + b"data: " + json.dumps(data).encode() + b"\n\n"


def chat_delta(i: int) -> bytes:
    return sse({"id": "c", "choices": [{"index": 0, "delta": {"content": WORD}}]})


def messages_delta(i: int) -> bytes:
    return sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": WORD}},
               "content_block_delta")


def gemini_delta(i: int) -> bytes:
    return sse({"candidates": [{"content": {"role": "model", "parts": [{"text": WORD}]}}]})


MESSAGES_START = sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                     "content_block_start")
CASES = {
    "chat": (CHAT, chat_facts, [], chat_delta),
    "messages": (MESSAGES, messages_facts, [MESSAGES_START], messages_delta),
    "gemini": (GEMINI, gemini_facts, [], gemini_delta),
}


def watch(api: Api, facts: RequestFacts, opening: list[bytes], delta: Callable[[int], bytes]) -> tuple[object, int]:
    """The watcher after DELTAS text deltas, and the memory it grew by."""
    watcher = api.watcher(facts)
    for raw in opening:
        watcher.mark(Event(raw))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(DELTAS):
            watcher.mark(Event(delta(i)))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return watcher, grown


@pytest.mark.parametrize("name", CASES)
def test_a_stream_is_counted_not_kept(name):
    api, facts, opening, delta = CASES[name]
    watcher, grown = watch(api, facts(stream=True), opening, delta)
    assert watcher.sent_chars == DELTAS * len(WORD)
    assert grown < DELTAS * len(WORD) // 4  # far less than the text itself


@pytest.mark.parametrize("name", CASES)
def test_an_answer_taken_whole_is_assembled_from_every_delta(name):
    api, facts, opening, delta = CASES[name]
    watcher, _ = watch(api, facts(stream=False), opening, delta)
    assert watcher.sent_chars == DELTAS * len(WORD)
    assert json.dumps(json.loads(watcher.assembled_body())).count(WORD) == DELTAS


WRITERS = {"chat": (ChatWriter, chat_facts), "messages": (AnthropicWriter, messages_facts),
           "gemini": (GeminiWriter, gemini_facts)}


def write(name: str, stream: bool) -> tuple[object, int, bytes]:
    """A writer after DELTAS text pieces, the memory it grew by, and the bytes it wrote."""
    kind, facts = WRITERS[name]
    writer = kind(facts(stream=stream), "public-model", "req_0123abcd")
    written = bytearray(writer.write([TextDelta(WORD)]))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(DELTAS - 1):
            writer.write([TextDelta(WORD)])
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return writer, grown, bytes(written)


@pytest.mark.parametrize("name", WRITERS)
def test_a_translated_stream_is_written_not_kept(name):
    writer, grown, first = write(name, stream=True)
    assert WORD.encode() in first
    assert grown < DELTAS * len(WORD) // 4


@pytest.mark.parametrize("name", WRITERS)
def test_a_translated_answer_taken_whole_has_every_piece(name):
    writer, _, _ = write(name, stream=False)
    assert json.dumps(json.loads(writer.body(Usage()))).count(WORD) == DELTAS


def chat_event(delta: dict, finish: str | None = None, index: int = 0) -> Event:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
             "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}
    return Event(b"data: " + json.dumps(chunk).encode() + b"\n\n")


def test_a_chat_answer_taken_whole_keeps_every_kind_of_delta():
    watcher = CHAT.new_watcher(chat_facts(stream=False))
    events = [
        chat_event({"role": "assistant", "content": ""}),
        chat_event({"reasoning_content": "Think "}),
        chat_event({"reasoning_content": "hard."}),
        chat_event({"content": "Hel"}),
        chat_event({"content": "lo", "refusal": None}),
        chat_event({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "get_", "arguments": '{"ci'}}]}),
        chat_event({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": 'ty":1}'}}]}),
        chat_event({"content": "Other"}, index=1),
        chat_event({}, finish="tool_calls"),
        chat_event({"refusal": "No."}, finish="stop", index=1),
    ]
    marks = [watcher.mark(event) for event in events]
    body = json.loads(watcher.assembled_body())
    first, second = body["choices"]
    assert marks[0] == 0 and all(marks[1:8]) and marks[8] == 0
    assert first["message"]["role"] == "assistant"
    assert first["message"]["reasoning_content"] == "Think hard."
    assert first["message"]["content"] == "Hello"
    assert first["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":1}'}}]
    assert first["finish_reason"] == "tool_calls"
    assert second["message"] == {"role": "assistant", "content": "Other", "refusal": "No.", "annotations": []}
    assert second["finish_reason"] == "stop"
    assert watcher.sent_chars == len("Think hard.Hello" + '{"city":1}' + "OtherNo.")
