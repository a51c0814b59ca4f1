"""Bedrock's Converse grammar as a translation target (rule C3, T1–T3):
a ``Conversation`` encoded as the ConverseStream body, and the answer's AWS
event-stream messages (decoded by ``ConverseFrames``) marked by
``ConverseWatcher`` and read into pieces by ``ConverseReader``.

Mirrors providers/aws/converse_request.py, converse_stream.py and
providers/aws/converse.py.
"""

from __future__ import annotations

import json

import pytest

from core.sse import Event
from core.vocabulary import WireGrammar
from providers.apis import CHAT, CONVERSE
from providers.aws import converse_request
from providers.aws.converse_stream import ConverseReader
from providers.aws.eventstream import ConverseFrames
from providers.base import Mark, RequestFacts, dumps
from providers.neutral import (
    CannotServe,
    Conversation,
    Image,
    Message,
    OutputFormat,
    Reasoning,
    RedactedThinking,
    Stop,
    StopReason,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ThinkingSignature,
    Tool,
    ToolArguments,
    ToolCall,
    ToolCallStart,
    ToolChoice,
    ToolResult,
)
from providers.openai import chat_request
from simulator import eventstream
from simulator.wire.common import TOOL_ARGUMENTS, TOOL_NAME, Script, deltas
from simulator.wire.converse import ConverseRenderer

MODEL = "amazon.nova-pro-v1:0"
CONVERSE_WIRE = WireGrammar.CONVERSE
PNG = "iVBORw0KGgo="


def conversation(*messages: Message, **fields) -> Conversation:
    return Conversation(model="public", messages=list(messages) or [Message("user", [Text("Hi")])], **fields)


def encoded(c: Conversation) -> dict:
    return converse_request.encode(c, MODEL).body


# -- encode ----------------------------------------------------------------------


def test_it_encodes_a_streamed_request_with_the_model_in_the_route_not_the_body():
    facts = converse_request.encode(conversation(system=["Be brief.", "  "]), MODEL)
    assert facts.body == {"messages": [{"role": "user", "content": [{"text": "Hi"}]}],
                          "system": [{"text": "Be brief."}]}
    assert facts.model == MODEL and facts.route == {"model": MODEL} and facts.stream
    assert json.loads(facts.raw_body) == facts.body
    assert facts.prompt_chars == len("Hi") + len("Be brief.")
    call = CONVERSE.upstream_call(facts, {"user-agent": "sdk"})
    assert (call.operation, call.model, call.content) == ("converse", MODEL, facts.raw_body)


def test_it_merges_turns_of_one_role_and_puts_tool_results_first_in_their_turn():
    c = conversation(
        Message("user", [Text("Weather?"), Text(" ")]),
        Message("assistant", [Text("Let me look."), ToolCall("call:1/x", "weather", '{"city": "Paris"}')]),
        Message("user", [Text("and hurry")]),
        Message("user", [ToolResult("call:1/x", [Text("sunny")]), ToolResult("c2", [], is_error=True)]),
        tools=[Tool("weather", "Looks it up", {"type": "object", "properties": {"city": {"type": "string"}}})],
    )
    body = encoded(c)
    assert body["messages"] == [
        {"role": "user", "content": [{"text": "Weather?"}]},
        {"role": "assistant", "content": [
            {"text": "Let me look."},
            {"toolUse": {"toolUseId": "call_1_x", "name": "weather", "input": {"city": "Paris"}}}]},
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "call_1_x", "content": [{"text": "sunny"}]}},
            {"toolResult": {"toolUseId": "c2", "content": [{"json": {}}], "status": "error"}},
            {"text": "and hurry"}]},
    ]
    assert body["toolConfig"] == {"tools": [{"toolSpec": {
        "name": "weather", "inputSchema": {"json": c.tools[0].parameters}, "description": "Looks it up"}}]}


@pytest.mark.parametrize(("choice", "expected"), [
    (None, None),
    (ToolChoice("auto"), None),
    (ToolChoice("required"), {"any": {}}),
    (ToolChoice("tool", "weather"), {"tool": {"name": "weather"}}),
])
def test_it_encodes_tool_choice(choice, expected):
    body = encoded(conversation(tools=[Tool("weather")], tool_choice=choice))
    assert body["toolConfig"].get("toolChoice") == expected


def test_tool_choice_none_offers_no_tools_unless_earlier_turns_used_them():
    assert "toolConfig" not in encoded(conversation(tools=[Tool("weather")], tool_choice=ToolChoice("none")))
    with_calls = conversation(
        Message("user", [Text("Weather?")]), Message("assistant", [ToolCall("c1", "weather", "{}")]),
        Message("user", [ToolResult("c1", [Text("sunny")])]),
        tools=[Tool("weather")], tool_choice=ToolChoice("none"))
    # Bedrock refuses toolUse blocks without the tools defined: the nearest is auto.
    assert encoded(with_calls)["toolConfig"] == {"tools": [{"toolSpec": {
        "name": "weather", "inputSchema": {"json": {"type": "object", "properties": {}}}}}]}


def test_it_encodes_the_inference_config_with_temperature_in_bedrocks_range():
    body = encoded(conversation(max_tokens=100, temperature=1.6, top_p=0.9, stop=["END", ""]))
    assert body["inferenceConfig"] == {"maxTokens": 100, "temperature": 1.0, "topP": 0.9, "stopSequences": ["END"]}
    assert "inferenceConfig" not in encoded(conversation())


def test_json_output_is_asked_for_in_the_system_prompt_with_its_schema():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    any_json = encoded(conversation(output=OutputFormat()))
    assert any_json["system"] == [{"text": converse_request.JSON_INSTRUCTION}]
    with_schema = encoded(conversation(system=["Be brief."], output=OutputFormat(schema)))
    assert with_schema["system"][0] == {"text": "Be brief."}
    assert json.dumps(schema, separators=(",", ":")) in with_schema["system"][1]["text"]


def test_reasoning_is_left_to_the_model():
    facts = converse_request.encode(conversation(reasoning=Reasoning(budget_tokens=4096)), MODEL)
    assert set(facts.body) == {"messages"} and not facts.thinking


def test_it_sends_images_inline_and_refuses_them_by_url():
    c = conversation(Message("user", [Image(url=f"data:image/png;base64,{PNG}"),
                                      Image(media_type="image/jpeg", data=PNG), Text("What is it?")]))
    assert encoded(c)["messages"][0]["content"][:2] == [
        {"image": {"format": "png", "source": {"bytes": PNG}}},
        {"image": {"format": "jpeg", "source": {"bytes": PNG}}}]
    with pytest.raises(CannotServe) as refused:
        encoded(conversation(Message("user", [Image(url="https://example.com/cat.png")])))
    assert refused.value.field == "image"
    with pytest.raises(CannotServe):
        encoded(conversation(Message("user", [Image(media_type="image/tiff", data=PNG)])))


def test_only_converse_state_goes_back_to_converse():
    c = conversation(
        Message("user", [Text("Hi")]),
        Message("assistant", [Thinking("mine", "c2ln", CONVERSE_WIRE), Thinking("", "cmVk", CONVERSE_WIRE, redacted=True),
                              Thinking("theirs", "other", WireGrammar.ANTHROPIC), Thinking("unsigned"),
                              Text("Hello")]),
        Message("user", [Text("More")]))
    assert encoded(c)["messages"][1]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "mine", "signature": "c2ln"}}},
        {"reasoningContent": {"redactedContent": "cmVk"}},
        {"text": "Hello"}]


def test_it_refuses_what_only_the_callers_protocol_can_honour():
    with pytest.raises(CannotServe) as refused:
        encoded(conversation(untranslatable=["n"]))
    assert refused.value.field == "n"


def test_a_chat_request_reaches_converse_whole():
    raw = dumps({"model": "public", "stream": True, "max_completion_tokens": 50, "temperature": 0.2,
                 "messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Weather in Paris?"}],
                 "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
                 "tool_choice": "required"})
    facts: RequestFacts = CHAT.parse(json.loads(raw), raw, {})
    body = converse_request.encode(chat_request.decode(facts), MODEL).body
    assert body == {
        "messages": [{"role": "user", "content": [{"text": "Weather in Paris?"}]}],
        "system": [{"text": "Be brief."}],
        "toolConfig": {"tools": [{"toolSpec": {"name": "weather", "inputSchema": {"json": {"type": "object"}}}}],
                       "toolChoice": {"any": {}}},
        "inferenceConfig": {"maxTokens": 50, "temperature": 0.2},
    }


# -- the answer: frames -> watcher marks and usage, reader pieces ------------------


def script(tool: bool, thinking: int = 3, text: int = 4, cached: int = 0, cache_write: int = 0) -> Script:
    return Script(model=MODEL, thinking=deltas(thinking, ("hmm", "so")), text=deltas(text, ("Hello", "world")),
                  tool=tool, input_tokens=20, stem="stem", created=0, cached=cached, cache_write=cache_write)


def frames_of(renderer: ConverseRenderer) -> bytes:
    return b"".join(e.data for e in renderer.events())


def events_of(wire: bytes, read_size: int) -> list[Event]:
    """The answer's events as the channel's splitter gives them, ``read_size`` bytes a read."""
    splitter = ConverseFrames()
    events = [e for i in range(0, len(wire), read_size) for e in splitter.feed(wire[i:i + read_size])]
    return events + splitter.finish()


def watched(events: list[Event]):
    facts = converse_request.encode(conversation(), MODEL)
    watcher, reader = CONVERSE.new_watcher(facts), ConverseReader()
    marks, pieces = [], []
    for event in events:
        marks.append(watcher.mark(event))
        pieces += reader.read(event)
    return watcher, marks, pieces


@pytest.mark.parametrize("read_size", [1, 7, 1 << 20])
def test_thinking_text_and_a_tool_call_read_whatever_the_reads(read_size):
    s = script(tool=True)
    watcher, marks, pieces = watched(events_of(frames_of(ConverseRenderer(s)), read_size))
    assert "".join(p.text for p in pieces if isinstance(p, ThinkingDelta)) == s.full_thinking
    assert "".join(p.text for p in pieces if isinstance(p, TextDelta)) == s.full_text
    assert [p for p in pieces if isinstance(p, ThinkingSignature)] == [
        ThinkingSignature(ConverseRenderer(s).signature, CONVERSE_WIRE)]
    start = next(p for p in pieces if isinstance(p, ToolCallStart))
    assert (start.index, start.call_id, start.name) == (0, "tooluse_stem", TOOL_NAME)
    arguments = "".join(p.fragment for p in pieces if isinstance(p, ToolArguments))
    assert json.loads(arguments) == json.loads(TOOL_ARGUMENTS)
    assert pieces[-1] == Stop(StopReason.TOOL_USE)
    assert watcher.sent_chars == len(s.full_thinking) + len(s.full_text) + len(arguments)


def test_the_hold_ends_at_the_first_token_and_the_answer_at_its_usage():
    s = script(tool=False, thinking=0, cached=5, cache_write=3)
    watcher, marks, _ = watched(events_of(frames_of(ConverseRenderer(s)), 1 << 20))
    # messageStart is preamble; the first text delta is content; metadata, after messageStop, ends it.
    assert marks[0] == Mark.PREAMBLE and marks[1] == Mark.CONTENT
    assert marks[-1] == Mark.TERMINAL and Mark.TERMINAL not in marks[:-1]
    usage = watcher.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (
        20 - 5 - 3, s.output_tokens, 5, 3)
    assert usage.input_reported and usage.output_reported


@pytest.mark.parametrize(("reason", "stop"), [
    ("end_turn", StopReason.END), ("max_tokens", StopReason.LENGTH), ("stop_sequence", StopReason.STOP_SEQUENCE),
    ("guardrail_intervened", StopReason.CONTENT_FILTER), ("content_filtered", StopReason.CONTENT_FILTER),
    ("tool_use", StopReason.TOOL_USE),
])
def test_the_reader_maps_stop_reasons(reason, stop):
    event = Event.named("messageStop", dumps({"stopReason": reason}))
    assert ConverseReader().read(event) == [Stop(stop)]


def test_redacted_reasoning_is_kept_for_its_origin():
    event = Event.named("contentBlockDelta", dumps({"contentBlockIndex": 0,
                                                    "delta": {"reasoningContent": {"redactedContent": "cmVk"}}}))
    assert ConverseReader().read(event) == [RedactedThinking("cmVk", CONVERSE_WIRE)]


@pytest.mark.parametrize(("exception", "busy"), [
    ("throttlingException", True), ("serviceUnavailableException", True), ("modelStreamErrorException", False),
])
def test_an_exception_frame_is_a_provider_error_busy_or_not(exception, busy):
    wire = eventstream.event("messageStart", {"role": "assistant"}) + eventstream.exception(
        exception, {"message": "no"})
    watcher, marks, pieces = watched(events_of(wire, 5))
    assert marks == [Mark.PREAMBLE, Mark.ERROR]
    assert watcher.busy_error is busy
    assert pieces == []


def test_an_empty_text_delta_is_not_content():
    event = Event.named("contentBlockDelta", dumps({"contentBlockIndex": 0, "delta": {"text": ""}}))
    assert CONVERSE.new_watcher(converse_request.encode(conversation(), MODEL)).mark(event) == Mark.PREAMBLE
    assert ConverseReader().read(event) == []
