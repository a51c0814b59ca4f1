"""Any well-formed stream of one protocol, translated, is one the caller's
official SDK parses, with the same text and tool calls.

A channel's stream is made from random pieces by that protocol's own writer
(the grammar its provider sends: Chat chunks, Anthropic events, Gemini
chunks), cut into events, watched and translated exactly as the relay does
(``TranslatingWatcher``: the channel's watcher, its reader, the client's
writer) and handed to the client API's SDK through a mock transport.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import httpx2
import openai
import pytest
from google import genai
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.sse import EventSplitter
from core.usage import Usage
from core.vocabulary import ApiName
from providers.anthropic.stream import AnthropicWriter
from providers.apis import CHAT, GEMINI, MESSAGES, RESPONSES
from providers.base import Mark, RequestFacts, dumps
from providers.google.stream import GeminiWriter
from providers.neutral import Stop, StopReason, TextDelta, ThinkingDelta, ToolArguments, ToolCallStart
from providers.openai.chat_stream import ChatWriter
from providers.registry import CLIENT_SIDES, GRAMMARS
from providers.translating_watcher import TranslatingWatcher

TOOL = {"name": "lookup", "description": "Look up", "parameters": {"type": "object", "properties": {}}}
CLIENT_BODIES = {
    ApiName.CHAT: (CHAT, {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                          "messages": [{"role": "user", "content": "hi"}],
                          "tools": [{"type": "function", "function": TOOL}]}),
    ApiName.RESPONSES: (RESPONSES, {"model": "m", "stream": True, "input": "hi", "tools": [{"type": "function", **TOOL}]}),
    ApiName.MESSAGES: (MESSAGES, {"model": "m", "stream": True, "max_tokens": 64,
                                  "messages": [{"role": "user", "content": "hi"}]}),
    ApiName.GEMINI: (GEMINI, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                              "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}),
}
GEMINI_ROUTE = {"version": "v1beta", "model": "m", "action": "streamGenerateContent", "alt": "sse"}
# The writer that speaks as a provider of each protocol would.
PROVIDER_WRITERS = {"openai": (ChatWriter, ApiName.CHAT), "anthropic": (AnthropicWriter, ApiName.MESSAGES),
                    "gemini": (GeminiWriter, ApiName.GEMINI)}
NATIVE = {ApiName.CHAT: "openai", ApiName.RESPONSES: "openai", ApiName.MESSAGES: "anthropic", ApiName.GEMINI: "gemini"}
PAIRS = [(api, wire) for api in CLIENT_BODIES for wire in PROVIDER_WRITERS if NATIVE[api] != wire]

words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12)
arguments = st.dictionaries(st.text("abcxyz", min_size=1, max_size=5), st.integers() | words, max_size=3)


@st.composite
def answers(draw) -> tuple[list, list[tuple[str, dict]], str, Usage]:
    """Pieces of a well-formed answer: thinking, then text, then tool calls
    (arguments cut anywhere); the text and calls they carry; the usage."""
    pieces: list = [ThinkingDelta(t) for t in draw(st.lists(words, max_size=3))]
    texts = draw(st.lists(words, max_size=4))
    pieces += [TextDelta(t) for t in texts]
    calls = [(f"tool_{i}", draw(arguments)) for i in range(draw(st.integers(0, 2)))]
    for index, (name, args) in enumerate(calls):
        pieces.append(ToolCallStart(index, f"call_{index}", name))
        raw = json.dumps(args)
        cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=3)))
        for start, end in zip([0, *cuts], [*cuts, len(raw)]):
            if end > start:
                pieces.append(ToolArguments(index, raw[start:end]))
    pieces.append(Stop(StopReason.TOOL_USE if calls else draw(st.sampled_from([StopReason.END, StopReason.LENGTH]))))
    usage = Usage(input_tokens=draw(st.integers(0, 10_000)), cache_read_tokens=draw(st.integers(0, 500)),
                  output_tokens=draw(st.integers(0, 5_000)), input_reported=True, output_reported=True)
    return pieces, calls, "".join(texts), usage


def client_facts(api: ApiName) -> RequestFacts:
    protocol, body = CLIENT_BODIES[api]
    return protocol.parse(body, dumps(body), GEMINI_ROUTE if api == ApiName.GEMINI else {})


def provider_stream(wire: str, pieces: list, usage: Usage) -> bytes:
    writer_class, as_api = PROVIDER_WRITERS[wire]
    writer = writer_class(client_facts(as_api), "upstream-model", "req_upstream")
    return b"".join(writer.write([piece]) for piece in pieces) + writer.finish(usage)


def translated(api: ApiName, wire: str, stream: bytes) -> tuple[bytes, TranslatingWatcher]:
    """What the relay sends the client for this channel stream."""
    side = GRAMMARS[wire]
    upstream_facts = side.api.parse(*_channel_request(wire))
    facts = client_facts(api)
    watcher = TranslatingWatcher(side.api.new_watcher(upstream_facts), side.reader(),
                                 CLIENT_SIDES[api].writer(facts, "public-model", "req_0123456789"))
    out = []
    splitter = EventSplitter()
    for event in splitter.feed(stream):
        mark = watcher.mark(event)
        assert not mark & Mark.ERROR
        out.append(watcher.client_bytes(event))
        if mark & Mark.TERMINAL:
            out.append(watcher.end_of_stream())
            break
    else:
        raise AssertionError("the channel's stream never ended")
    return b"".join(out), watcher


def _channel_request(wire: str) -> tuple[dict, bytes, dict]:
    if wire == "gemini":
        body = {"contents": []}
        return body, dumps(body), GEMINI_ROUTE
    body = {"model": "upstream-model", "stream": True, "stream_options": {"include_usage": True}, "messages": [],
            "max_tokens": 1}
    return body, dumps(body), {}


def parsed_by_sdk(api: ApiName, content: bytes) -> tuple[str, list[tuple[str, dict]]]:
    """The text and tool calls the client's SDK accumulates from ``content``."""
    if api == ApiName.GEMINI:
        http = httpx.Client(transport=httpx.MockTransport(
            lambda request: httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})))
        client = genai.Client(api_key="k", http_options=types.HttpOptions(
            base_url="http://hopbase.test", api_version="v1beta", httpx_client=http))
        text, calls = "", []
        for chunk in client.models.generate_content_stream(model="m", contents="hi"):
            for part in (chunk.candidates[0].content.parts if chunk.candidates[0].content else None) or ():
                if part.function_call:
                    calls.append((part.function_call.name, dict(part.function_call.args or {})))
                elif part.text and not part.thought:
                    text += part.text
        return text, calls
    http2 = httpx2.Client(transport=httpx2.MockTransport(
        lambda request: httpx2.Response(200, content=content, headers={"content-type": "text/event-stream"})))
    if api == ApiName.MESSAGES:
        claude = anthropic.Anthropic(api_key="k", base_url="http://hopbase.test", http_client=http2, max_retries=0)
        with claude.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as events:
            message = events.get_final_message()
        return ("".join(b.text for b in message.content if b.type == "text"),
                [(b.name, b.input) for b in message.content if b.type == "tool_use"])
    oai = openai.OpenAI(api_key="k", base_url="http://hopbase.test/v1", http_client=http2, max_retries=0)
    if api == ApiName.RESPONSES:
        # Not the stream helper: it wants response.completed, and a stop at
        # the length limit ends in response.incomplete (as OpenAI's does).
        final = [event.response for event in oai.responses.create(model="m", input="hi", stream=True)
                 if event.type in ("response.completed", "response.incomplete")]
        (response,) = final
        return (response.output_text,
                [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"])
    text, calls = "", {}
    for chunk in oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, ["", ""])
                slot[0] += (call.function.name or "") if call.function else ""
                slot[1] += (call.function.arguments or "") if call.function else ""
    return text, [(name, json.loads(args)) for name, args in (calls[i] for i in sorted(calls))]


@pytest.mark.parametrize(("api", "wire"), PAIRS, ids=[f"{a.value}<-{w}" for a, w in PAIRS])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=answers())
def test_any_channel_stream_translates_into_one_the_callers_sdk_parses(api, wire, answer):
    pieces, calls, text, usage = answer

    content, watcher = translated(api, wire, provider_stream(wire, pieces, usage))

    assert parsed_by_sdk(api, content) == (text, calls)
    # The usage the relay bills is the channel's, exactly.
    assert (watcher.usage.input_tokens, watcher.usage.cache_read_tokens) == (usage.input_tokens,
                                                                              usage.cache_read_tokens)
    assert watcher.usage.output_tokens == usage.output_tokens
