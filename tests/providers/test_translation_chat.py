"""Translation for OpenAI Chat Completions: a Chat caller's request
decoded into the neutral form, the neutral form encoded for an ``openai``
channel, that channel's chunks read as pieces, and pieces written back as
the chunks and bodies the official ``openai`` SDK parses.

No database, no processes: the SDK is answered through ``httpx2.MockTransport``
with the writer's bytes, and the channel's events are the simulator's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ErrorKind, GatewayError
from core.sse import Event
from core.usage import Usage
from providers.apis import CHAT
from providers.base import RequestFacts, dumps
from providers.neutral import (
    CannotServe,
    Conversation,
    Effort,
    Image,
    Message,
    OutputFormat,
    Piece,
    Reasoning,
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
from providers.openai.chat_request import decode, encode
from providers.openai.chat_stream import ChatReader, ChatWriter
from simulator.wire.common import (
    TEXT_WORDS,
    THINKING_WORDS,
    TOOL_ARGUMENTS,
    TOOL_NAME,
    Script,
    deltas,
)
from simulator.wire.openai import ChatRenderer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
PNG = "iVBORw0KGgo="
USAGE = Usage(input_tokens=100, cache_read_tokens=40, cache_write_tokens=10, output_tokens=30, thinking_tokens=12)


def facts_for(**body: Any) -> RequestFacts:
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "Hi"}], **body}
    raw = dumps(body)
    return CHAT.parse(json.loads(raw), raw, {})


def decoded(**body: Any) -> Conversation:
    return decode(facts_for(**body))


# -- decode: a Chat caller's request -> Conversation ---------------------------------------


def test_it_decodes_system_and_developer_messages_into_the_system_prompt():
    conversation = decoded(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
        {"role": "user", "content": "Hi"},
    ])
    assert conversation.system == ["Be brief.", "Use French."]
    assert conversation.messages == [Message("user", [Text("Hi")])]
    assert conversation.model == "gpt-x"


def test_it_decodes_user_text_and_images_by_url_and_by_data_url():
    conversation = decoded(messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
    ]}])
    assert conversation.messages[0].parts == [
        Text("What is this?"),
        Image(url="https://example.com/cat.png"),
        Image(media_type="image/png", data=PNG),
    ]


def test_it_decodes_assistant_tool_calls_and_tool_results_with_the_tools_name():
    conversation = decoded(messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
        {"role": "user", "content": "Thanks"},
    ])
    assert conversation.messages == [
        Message("user", [Text("Weather in Paris and Rome?")]),
        Message("assistant", [Text("Checking."), ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                              ToolCall("call_2", "get_weather", '{"city":"Rome"}')]),
        Message("user", [ToolResult("call_1", [Text("18C")], name="get_weather"),
                         ToolResult("call_2", [Text("21C")], name="get_weather")]),
        Message("user", [Text("Thanks")]),
    ]


def test_it_decodes_reasoning_text_a_compatible_server_gave_as_unsigned_thinking():
    conversation = decoded(messages=[{"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}])
    assert conversation.messages[1].parts == [Thinking(text="greet"), Text("Hello")]


def test_it_decodes_legacy_functions_as_tools():
    conversation = decoded(
        messages=[{"role": "user", "content": "Paris?"},
                  {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
                  {"role": "function", "name": "get_weather", "content": "18C"}],
        functions=[WEATHER["function"]], function_call={"name": "get_weather"},
    )
    call = conversation.messages[1].parts[0]
    assert isinstance(call, ToolCall) and call.name == "get_weather"
    assert conversation.messages[2].parts == [ToolResult(call.call_id, [Text("18C")], name="get_weather")]
    assert [t.name for t in conversation.tools] == ["get_weather"]
    assert conversation.tool_choice == ToolChoice("tool", "get_weather")


def test_it_decodes_function_tools_and_every_tool_choice():
    conversation = decoded(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert conversation.tools == [Tool("get_weather", "Weather now", WEATHER["function"]["parameters"])]
    assert conversation.tool_choice == ToolChoice("required")
    assert conversation.parallel_tool_calls is False
    assert decoded(tools=[WEATHER], tool_choice="none").tool_choice == ToolChoice("none")
    assert decoded(tools=[WEATHER], tool_choice="auto").tool_choice == ToolChoice("auto")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert decoded(tools=[WEATHER], tool_choice=named).tool_choice == ToolChoice("tool", "get_weather")
    assert decoded(tools=[WEATHER]).tool_choice is None


def test_it_decodes_allowed_tools_as_offering_only_those():
    other = {"type": "function", "function": {"name": "get_time"}}
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_time"}}]}}
    conversation = decoded(tools=[WEATHER, other], tool_choice=choice)
    assert [t.name for t in conversation.tools] == ["get_time"]
    assert conversation.tool_choice == ToolChoice("required")


def test_it_decodes_limits_sampling_stops_and_the_user():
    conversation = decoded(max_completion_tokens=500, max_tokens=9, temperature=0.2, top_p=1, stop="END", user="u-1")
    assert (conversation.max_tokens, conversation.temperature, conversation.top_p) == (500, 0.2, 1.0)
    assert conversation.stop == ["END"]
    assert conversation.user == "u-1"
    assert decoded(max_tokens=64, stop=["a", "b"]).max_tokens == 64
    assert decoded(stop=["a", "b"]).stop == ["a", "b"]
    assert decoded(stream=True).stream is True


@pytest.mark.parametrize(("response_format", "output"), [
    ({"type": "text"}, None),
    ({"type": "json_object"}, OutputFormat()),
    ({"type": "json_schema", "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": True}},
     OutputFormat(schema={"type": "object"}, name="city", strict=True)),
])
def test_it_decodes_response_formats(response_format, output):
    assert decoded(response_format=response_format).output == output


@pytest.mark.parametrize(("effort", "reasoning"), [
    ("none", Reasoning(enabled=False)),
    ("minimal", Reasoning(effort=Effort.MINIMAL)),
    ("low", Reasoning(effort=Effort.LOW)),
    ("medium", Reasoning(effort=Effort.MEDIUM)),
    ("high", Reasoning(effort=Effort.HIGH)),
    ("xhigh", Reasoning(effort=Effort.HIGH)),
])
def test_it_decodes_reasoning_effort(effort, reasoning):
    assert decoded(reasoning_effort=effort).reasoning == reasoning


@pytest.mark.parametrize(("body", "field"), [
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"]}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"tools": [{"type": "custom", "custom": {"name": "grammar"}}]}, "tools"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "input_audio"),
])
def test_it_names_what_no_other_protocol_can_honour(body, field):
    conversation = decoded(**body)
    assert conversation.untranslatable[0] == field
    with pytest.raises(CannotServe) as caught:
        encode(conversation, "gpt-up")
    assert caught.value.field == field


def test_it_drops_fields_that_only_tune_and_keeps_n_of_one():
    conversation = decoded(n=1, seed=7, frequency_penalty=0.5, metadata={"a": "b"}, store=True, service_tier="flex",
                           logprobs=False, stream_options={"include_usage": True})
    assert conversation.untranslatable == []


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools"),
])
def test_it_refuses_what_it_cannot_read_naming_the_field(body, param):
    with pytest.raises(GatewayError) as caught:
        decoded(**body)
    assert caught.value.kind is ErrorKind.MALFORMED
    assert caught.value.param == param


# -- encode: Conversation -> the request for an openai channel ------------------------------


def test_it_encodes_a_streaming_request_that_always_reports_usage():
    facts = encode(Conversation(model="public", messages=[Message("user", [Text("Hi")])],
                                system=["Be brief.", "Use French."], max_tokens=300), "gpt-up")
    assert facts.model == "gpt-up" and facts.stream is True
    assert json.loads(facts.raw_body) == facts.body
    assert facts.body == {
        "model": "gpt-up",
        "messages": [{"role": "system", "content": "Be brief.\n\nUse French."}, {"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 300,
    }
    assert facts.prompt_chars == len("Be brief.\n\nUse French.Hi")


def test_it_encodes_images_tool_calls_and_tool_results():
    conversation = Conversation(model="public", messages=[
        Message("user", [Text("Look"), Image(url="https://example.com/a.png"), Image(media_type="image/png", data=PNG)]),
        Message("assistant", [Thinking("hmm", signature="sig", origin="anthropic"), Text("Calling."),
                              ToolCall("toolu_1", "get_weather", '{"city":"Paris"}')]),
        Message("user", [ToolResult("toolu_1", [Text("18C"), Image(url="https://example.com/map.png")]),
                         Text("And now?")]),
    ])
    assert encode(conversation, "gpt-up").body["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "Look"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]},
        {"role": "assistant", "content": "Calling.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/map.png"}},
                                     {"type": "text", "text": "And now?"}]},
    ]


def test_it_drops_a_turn_that_was_only_thinking():
    conversation = Conversation(model="m", messages=[
        Message("user", [Text("Hi")]), Message("assistant", [Thinking("hmm", signature="s", origin="gemini")])])
    assert encode(conversation, "gpt-up").body["messages"] == [{"role": "user", "content": "Hi"}]


def test_it_encodes_tools_choice_sampling_stops_output_and_user():
    conversation = Conversation(
        model="m", messages=[Message("user", [Text("Hi")])],
        tools=[Tool("get_weather", "Weather now", {"type": "object"}), Tool("noop")],
        tool_choice=ToolChoice("tool", "get_weather"), parallel_tool_calls=False,
        temperature=0.5, top_p=0.9, stop=["END"], user="u-1",
        output=OutputFormat(schema={"type": "object"}, name="city", strict=True),
    )
    body = encode(conversation, "gpt-up").body
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"},
                                          "description": "Weather now"}},
        {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert (body["temperature"], body["top_p"], body["stop"], body["user"]) == (0.5, 0.9, ["END"], "u-1")
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": True}}
    plain = Conversation(model="m", messages=[], output=OutputFormat(), tool_choice=ToolChoice("required"),
                         tools=[Tool("noop")])
    assert encode(plain, "g").body["response_format"] == {"type": "json_object"}
    assert encode(plain, "g").body["tool_choice"] == "required"


@pytest.mark.parametrize(("reasoning", "effort"), [
    (Reasoning(effort=Effort.LOW), "low"),
    (Reasoning(budget_tokens=20000), "high"),
    (Reasoning(budget_tokens=1024), "minimal"),
    (Reasoning(), "medium"),
    (Reasoning(enabled=False), None),  # unsaid: models without reasoning refuse any effort
])
def test_it_encodes_reasoning_as_an_effort(reasoning, effort):
    facts = encode(Conversation(model="m", messages=[], reasoning=reasoning), "gpt-up")
    assert facts.body.get("reasoning_effort") == effort
    assert facts.thinking is (effort is not None)


def test_what_it_decodes_it_encodes_back():
    body = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ], "tools": [WEATHER], "tool_choice": "auto", "max_completion_tokens": 50, "reasoning_effort": "low"}
    encoded = encode(decoded(**body), "gpt-up").body
    assert encoded["messages"] == body["messages"]
    assert encoded["tools"] == body["tools"]
    assert (encoded["tool_choice"], encoded["max_completion_tokens"], encoded["reasoning_effort"]) == ("auto", 50, "low")


# -- ChatReader: an openai channel's chunks -> pieces ----------------------------------------


def script(thinking: int = 3, text: int = 4, tool: bool = True) -> Script:
    return Script(model="gpt-up", thinking=deltas(thinking, THINKING_WORDS), text=deltas(text, TEXT_WORDS), tool=tool,
                  input_tokens=20, stem="abc", created=1700000000, cached=5, include_usage=True)


def read_all(reader: ChatReader, raws: list[bytes]) -> list[Piece]:
    return [piece for raw in raws for piece in reader.read(Event(raw))]


def test_it_reads_the_simulators_chunks_as_thinking_text_a_tool_call_and_the_stop():
    s = script()
    pieces = read_all(ChatReader(), [e.data for e in ChatRenderer(s).events()])
    assert "".join(p.text for p in pieces if isinstance(p, ThinkingDelta)) == s.full_thinking
    assert "".join(p.text for p in pieces if isinstance(p, TextDelta)) == s.full_text
    assert [p for p in pieces if isinstance(p, ToolCallStart)] == [ToolCallStart(0, "call_abc", TOOL_NAME)]
    assert "".join(p.fragment for p in pieces if isinstance(p, ToolArguments)) == TOOL_ARGUMENTS
    assert pieces[-1] == Stop(StopReason.TOOL_USE)
    assert sum(isinstance(p, Stop) for p in pieces) == 1


def test_it_reads_nothing_from_the_role_chunk_the_usage_chunk_and_done():
    events = ChatRenderer(script(thinking=0, text=0, tool=False)).events()
    reader = ChatReader()
    assert [reader.read(Event(e.data)) for e in events] == [[], [Stop(StopReason.END)], [], []]


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return b"data: " + dumps({"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}) + b"\n\n"


@pytest.mark.parametrize(("finish", "reason"), [
    ("stop", StopReason.END), ("length", StopReason.LENGTH), ("tool_calls", StopReason.TOOL_USE),
    ("function_call", StopReason.TOOL_USE), ("content_filter", StopReason.CONTENT_FILTER),
])
def test_it_maps_finish_reasons(finish, reason):
    assert ChatReader().read(Event(chunk({}, finish))) == [Stop(reason)]


def test_it_reads_refusals_as_text_and_reasoning_under_either_name():
    reader = ChatReader()
    assert read_all(reader, [chunk({"refusal": "No."}), chunk({"reasoning": "hm"}),
                             chunk({"content": "a", "reasoning_content": "b"}, "stop")]) == [
        TextDelta("No."), ThinkingDelta("hm"), TextDelta("a"), ThinkingDelta("b"), Stop(StopReason.END)]


def test_it_starts_a_call_when_its_name_appears_and_makes_up_a_missing_id():
    reader = ChatReader()
    pieces = read_all(reader, [
        chunk({"tool_calls": [{"index": 3, "function": {"arguments": '{"a"'}}]}),
        chunk({"tool_calls": [{"index": 3, "function": {"name": "f", "arguments": ":1}"}}]}),
        chunk({"tool_calls": [{"index": 5, "id": "call_x", "function": {"name": "g", "arguments": "{}"}},
                              {"index": 3, "function": {"name": "f"}}]}),
    ])
    start = pieces[0]
    assert isinstance(start, ToolCallStart) and start.call_id.startswith("call_") and start.name == "f"
    assert pieces[1:] == [ToolArguments(0, '{"a":1}'), ToolCallStart(1, "call_x", "g"), ToolArguments(1, "{}")]
    assert ChatReader().read(Event(chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]})))[0] != start


def test_it_tells_calls_apart_by_id_when_a_compatible_server_leaves_out_the_index():
    pieces = read_all(ChatReader(), [
        chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{"}}]}),
        chunk({"tool_calls": [{"function": {"arguments": "}"}}]}),
        chunk({"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": "{}"}}]}),
    ])
    assert pieces == [ToolCallStart(0, "a", "f"), ToolArguments(0, "{"), ToolArguments(0, "}"),
                      ToolCallStart(1, "b", "g"), ToolArguments(1, "{}")]


# -- ChatWriter: pieces -> what the openai SDK parses ------------------------------------------

TOOL_PIECES: list[Piece] = [
    ThinkingDelta("Let me "), ThinkingDelta("see."), ThinkingSignature("sig", "anthropic"),
    TextDelta("Héllo "), TextDelta("wörld 🚀"),
    ToolCallStart(0, "toolu_1", "get_weather"), ToolArguments(0, '{"city":'), ToolArguments(0, '"Paris"}'),
    ToolCallStart(1, "toolu_2", "get_time"), ToolArguments(1, "{}"),
    Stop(StopReason.TOOL_USE),
]


def answering(pieces: list[Piece], usage: Usage, seen: list[bytes] | None = None) -> openai.OpenAI:
    """An SDK client whose every call is answered by a ChatWriter writing ``pieces``."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        raw = request.read()
        facts = CHAT.parse(json.loads(raw), raw, {})
        writer = ChatWriter(facts, "public-model", "req_0123abcd")
        if not facts.stream:
            writer.write(pieces)
            return httpx2.Response(200, headers={"content-type": "application/json"}, content=writer.body(usage))
        stream = b"".join(writer.write([p]) for p in pieces) + writer.finish(usage)
        if seen is not None:
            seen.append(stream)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    return openai.OpenAI(api_key="k", base_url="http://hopbase.test/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handle)))


ASK: dict[str, Any] = {"model": "public-model", "messages": [{"role": "user", "content": "Hi"}]}


def test_the_sdk_accumulates_a_translated_stream():
    seen: list[bytes] = []
    chunks = list(answering(TOOL_PIECES, USAGE, seen).chat.completions.create(
        **ASK, stream=True, stream_options={"include_usage": True}))
    assert {c.id for c in chunks} == {"chatcmpl-0123abcd"}
    assert {c.model for c in chunks} == {"public-model"}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    thinking = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content", "") for c in chunks if c.choices)
    assert (text, thinking) == ("Héllo wörld 🚀", "Let me see.")
    calls: dict[int, list[str]] = {}
    for c in chunks:
        for call in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            calls.setdefault(call.index, [call.id, call.function.name, ""])[2] += call.function.arguments or ""
    assert calls == {0: ["toolu_1", "get_weather", '{"city":"Paris"}'], 1: ["toolu_2", "get_time", "{}"]}
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == []
    assert chunks[-1].usage.model_dump(exclude_none=True) == {
        "prompt_tokens": 150, "completion_tokens": 30, "total_tokens": 180,
        "prompt_tokens_details": {"cached_tokens": 40}, "completion_tokens_details": {"reasoning_tokens": 12}}
    assert seen[0].endswith(b"data: [DONE]\n\n")


def test_without_include_usage_no_chunk_has_empty_choices():
    chunks = list(answering(TOOL_PIECES, USAGE).chat.completions.create(**ASK, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_the_stream_helper_gets_the_final_completion():
    with answering(TOOL_PIECES, USAGE).chat.completions.stream(
            **ASK, stream_options={"include_usage": True}) as stream:
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Héllo wörld 🚀"
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("toolu_1", "get_weather", '{"city":"Paris"}'), ("toolu_2", "get_time", "{}")]
    assert completion.usage.prompt_tokens == 150 and completion.usage.completion_tokens == 30


def test_the_sdk_reads_a_translated_whole_body():
    completion = answering(TOOL_PIECES, USAGE).chat.completions.create(**ASK)
    assert (completion.id, completion.object, completion.model) == ("chatcmpl-0123abcd", "chat.completion",
                                                                    "public-model")
    message = completion.choices[0].message
    assert message.content == "Héllo wörld 🚀"
    assert message.model_extra["reasoning_content"] == "Let me see."
    assert [c.function.arguments for c in message.tool_calls] == ['{"city":"Paris"}', "{}"]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage.prompt_tokens_details.cached_tokens == 40
    assert completion.usage.completion_tokens_details.reasoning_tokens == 12
    assert completion.usage.total_tokens == 180


@pytest.mark.parametrize(("reason", "finish"), [
    (StopReason.END, "stop"), (StopReason.STOP_SEQUENCE, "stop"), (StopReason.LENGTH, "length"),
    (StopReason.CONTENT_FILTER, "content_filter"), (None, "stop"),
])
def test_it_maps_stop_reasons_to_finish_reasons(reason, finish):
    pieces: list[Piece] = [TextDelta("x")] + ([Stop(reason)] if reason else [])
    assert answering(pieces, USAGE).chat.completions.create(**ASK).choices[0].finish_reason == finish


def test_a_call_ends_in_tool_calls_whatever_the_channel_called_its_stop():
    pieces: list[Piece] = [ToolCallStart(0, "c1", "f"), ToolArguments(0, "{}"), Stop(StopReason.END)]
    completion = answering(pieces, USAGE).chat.completions.create(**ASK)
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.choices[0].message.content is None


def test_an_empty_answer_still_has_its_role_chunk():
    chunks = list(answering([], Usage()).chat.completions.create(**ASK, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_mid_stream_error_raises_the_sdks_api_error_with_its_code():
    writer = ChatWriter(facts_for(stream=True), "public-model", "req_1")
    stream = writer.write([TextDelta("Hel")]) + writer.error(ErrorKind.STREAM_BUSY, "The channel is busy.")

    def handle(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    client = openai.OpenAI(api_key="k", base_url="http://hopbase.test/v1", max_retries=0,
                           http_client=httpx2.Client(transport=httpx2.MockTransport(handle)))
    with pytest.raises(openai.APIError) as caught:
        list(client.chat.completions.create(**ASK, stream=True))
    assert caught.value.code == "rate_limit_exceeded"
    assert b"[DONE]" not in stream


def test_a_chat_channel_read_and_written_back_is_what_the_simulator_said():
    s = script()
    reader = ChatReader()
    pieces = [p for e in ChatRenderer(s).events() for p in reader.read(Event(e.data))]
    usage = Usage(input_tokens=15, cache_read_tokens=5, output_tokens=s.output_tokens, thinking_tokens=3)
    completion = answering(pieces, usage).chat.completions.create(**ASK)
    expected = ChatRenderer(s).body()
    assert completion.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert completion.choices[0].message.model_extra["reasoning_content"] == s.full_thinking
    assert completion.choices[0].message.tool_calls[0].function.arguments == TOOL_ARGUMENTS
    assert completion.usage.model_dump(exclude_none=True) == {
        k: v for k, v in expected["usage"].items() if k in ("prompt_tokens", "completion_tokens", "total_tokens")
    } | {"prompt_tokens_details": {"cached_tokens": 5}, "completion_tokens_details": {"reasoning_tokens": 3}}


# -- any well-formed piece sequence parses ------------------------------------------------------

texts = st.text(min_size=0, max_size=12)


@st.composite
def piece_sequences(draw: Callable[..., Any]) -> list[Piece]:
    pieces: list[Piece] = []
    calls = 0
    for kind in draw(st.lists(st.sampled_from(["text", "thinking", "signature", "call", "args"]), max_size=20)):
        if kind == "text":
            pieces.append(TextDelta(draw(texts)))
        elif kind == "thinking":
            pieces.append(ThinkingDelta(draw(texts)))
        elif kind == "signature":
            pieces.append(ThinkingSignature(draw(texts), "gemini"))
        elif kind == "call":
            pieces.append(ToolCallStart(calls, f"call_{calls}", draw(st.from_regex(r"[a-z_]{1,10}", fullmatch=True))))
            calls += 1
        elif calls:
            pieces.append(ToolArguments(draw(st.integers(0, calls - 1)), draw(texts)))
    if draw(st.booleans()):
        pieces.append(Stop(draw(st.sampled_from(list(StopReason)))))
    return pieces


usages = st.builds(Usage, input_tokens=st.integers(0, 10**6), output_tokens=st.integers(0, 10**6),
                   cache_read_tokens=st.integers(0, 10**6), cache_write_tokens=st.integers(0, 10**6),
                   thinking_tokens=st.integers(0, 10**6))


@settings(max_examples=50, deadline=None)
@given(pieces=piece_sequences(), usage=usages, include_usage=st.booleans())
def test_any_piece_sequence_streams_into_what_the_sdk_accumulates(pieces, usage, include_usage):
    text = "".join(p.text for p in pieces if isinstance(p, TextDelta))
    arguments = [
        "".join(p.fragment for p in pieces if isinstance(p, ToolArguments) and p.index == start.index) or "{}"
        for start in pieces if isinstance(start, ToolCallStart)
    ]
    client = answering(pieces, usage)
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    # The snapshot, not get_final_completion(): that raises on "length" and
    # "content_filter" by design, as it does against OpenAI itself.
    with client.chat.completions.stream(**ASK, **options) as stream:
        for _ in stream:
            pass
        completion = stream.current_completion_snapshot
    message = completion.choices[0].message
    assert (message.content or "") == text
    assert [c.function.arguments for c in message.tool_calls or []] == arguments
    assert completion.choices[0].finish_reason is not None
    if include_usage:
        assert completion.usage.completion_tokens == usage.output_tokens
    whole = client.chat.completions.create(**ASK)
    assert (whole.choices[0].message.content or "") == text
    assert [c.function.arguments for c in whole.choices[0].message.tool_calls or []] == arguments


# -- found in review ----------------------------------------------------------------------------


def test_a_call_without_arguments_has_an_empty_object_for_them_as_openai_sends():
    # An Anthropic channel's call to a tool without parameters streams no
    # input_json_delta (or only ""): the caller still json.loads the arguments.
    pieces: list[Piece] = [ToolCallStart(0, "toolu_1", "list_files"), ToolCallStart(1, "toolu_2", "now"),
                           Stop(StopReason.TOOL_USE)]
    chunks = list(answering(pieces, USAGE).chat.completions.create(**ASK, stream=True))
    arguments: dict[int, str] = {}
    for c in chunks:
        for call in c.choices[0].delta.tool_calls or []:
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    assert arguments == {0: "{}", 1: "{}"}
    with answering(pieces, USAGE).chat.completions.stream(**ASK) as stream:
        final = stream.get_final_completion()
    assert [c.function.arguments for c in final.choices[0].message.tool_calls] == ["{}", "{}"]
    whole = answering(pieces, USAGE).chat.completions.create(**ASK)
    assert [c.function.arguments for c in whole.choices[0].message.tool_calls] == ["{}", "{}"]


def test_a_tool_choice_goes_only_with_tools_openai_refuses_it_alone():
    # e.g. a Responses caller offering only web_search (dropped) with tool_choice "auto".
    for choice in (ToolChoice("auto"), ToolChoice("none"), ToolChoice("required")):
        body = encode(Conversation(model="m", messages=[Message("user", [Text("Hi")])], tool_choice=choice,
                                   parallel_tool_calls=False), "gpt-up").body
        assert "tool_choice" not in body and "tools" not in body and "parallel_tool_calls" not in body
