"""Anthropic Messages in translation: requests decoded from and
encoded for Anthropic, an Anthropic channel's events read as pieces, and
pieces written as the Messages stream and body the anthropic SDK parses.

Mirrors providers/anthropic/request.py and anthropic_stream.py.
"""

from __future__ import annotations

import json

import anthropic
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ErrorKind, GatewayError
from core.sse import Event
from core.usage import Usage
from core.vocabulary import WireGrammar
from providers.anthropic import request as anthropic_request
from providers.anthropic.messages import Messages, MessagesWatcher
from providers.anthropic.stream import AnthropicReader, AnthropicWriter
from providers.base import dumps
from providers.neutral import (
    CannotServe,
    Conversation,
    Effort,
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
    seal,
    unseal,
)
from simulator.wire.anthropic import AnthropicRenderer
from simulator.wire.common import Script

ANTHROPIC, OPENAI, GEMINI = WireGrammar.ANTHROPIC, WireGrammar.OPENAI, WireGrammar.GEMINI
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}


def client_facts(**body):
    body = {"model": "claude-public", "max_tokens": 512, "messages": [{"role": "user", "content": "Hi"}], **body}
    return Messages().parse(body, dumps(body), {})


def decode(**body) -> Conversation:
    return anthropic_request.decode(client_facts(**body))


def encode(conversation: Conversation) -> dict:
    facts = anthropic_request.encode(conversation, "claude-upstream")
    assert facts.raw_body == dumps(facts.body) and facts.stream and facts.model == "claude-upstream"
    return facts.body


def conversation(*messages: Message, **fields) -> Conversation:
    return Conversation(model="any-public", messages=list(messages) or [Message("user", [Text("Hi")])], **fields)


# -- decode: what an Anthropic client asks -------------------------------------


def test_it_decodes_the_system_prompt_as_a_string_or_as_text_blocks():
    assert decode(system="Be brief.").system == ["Be brief."]
    blocks = [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be kind."},
    ]
    assert decode(system=blocks).system == ["Be brief.", "Be kind."]


def test_it_adds_a_system_turn_in_the_conversation_to_the_system_prompt():
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
    ]
    c = decode(system="Be brief.", messages=messages)
    assert (c.system, c.messages) == (["Be brief.", "# Environment"], [Message("user", [Text("Hi")])])


def test_it_decodes_text_images_tool_calls_and_tool_results():
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18°C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [
                        {"type": "text", "text": "no such city"},
                        {"type": "image", "source": {"type": "url", "url": "u"}},
                    ],
                },
            ],
        },
    ]
    c = decode(messages=messages)
    assert c.messages == [
        Message(
            "user",
            [Text("Look"), Image(media_type="image/png", data="iVBOR"), Image(url="https://example.com/cat.jpg")],
        ),
        Message("assistant", [ToolCall("toolu_1", "get_weather", '{"city":"Paris"}')]),
        Message(
            "user",
            [
                ToolResult("toolu_1", [Text("18°C")]),
                ToolResult("toolu_2", [Text("no such city"), Image(url="u")], is_error=True),
            ],
        ),
    ]
    assert c.untranslatable == []


def test_it_decodes_thinking_with_the_origin_of_its_state():
    sealed = seal(OPENAI, "gAAAA-encrypted")
    content = [
        {"type": "thinking", "thinking": "mine", "signature": "EqQBsig"},
        {"type": "thinking", "thinking": "gpt's", "signature": sealed},
        {"type": "thinking", "thinking": "unsigned", "signature": ""},
        {"type": "redacted_thinking", "data": "EmwKAhgB"},
        {"type": "text", "text": "Answer"},
    ]
    c = decode(messages=[{"role": "user", "content": "Q"}, {"role": "assistant", "content": content}])
    assert c.messages[1].parts == [
        Thinking("mine", signature="EqQBsig", origin=ANTHROPIC),
        Thinking("gpt's", signature="gAAAA-encrypted", origin=OPENAI),
        Thinking("unsigned"),
        Thinking(signature="EmwKAhgB", origin=ANTHROPIC, redacted=True),
        Text("Answer"),
    ]


@pytest.mark.parametrize("block", ["document", "search_result", "container_upload"])
def test_it_marks_content_only_anthropic_holds_as_untranslatable(block):
    c = decode(messages=[{"role": "user", "content": [{"type": block, "source": {}}, {"type": "text", "text": "Hi"}]}])
    assert c.untranslatable == [block]
    with pytest.raises(CannotServe) as refused:
        anthropic_request.encode(c, "gpt-x")
    assert refused.value.field == block


def test_it_decodes_custom_tools_and_refuses_server_tools_elsewhere():
    c = decode(tools=[WEATHER, {**WEATHER, "name": "other", "type": "custom"}])
    assert c.tools == [
        Tool("get_weather", "Weather in a city", WEATHER_SCHEMA),
        Tool("other", "Weather in a city", WEATHER_SCHEMA),
    ]
    for server_tool in (
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ):
        assert decode(tools=[WEATHER, server_tool]).untranslatable == ["tools"]


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, ToolChoice("auto"), None),
        ({"type": "any"}, ToolChoice("required"), None),
        ({"type": "tool", "name": "get_weather"}, ToolChoice("tool", "get_weather"), None),
        ({"type": "none"}, ToolChoice("none"), None),
        ({"type": "auto", "disable_parallel_tool_use": True}, ToolChoice("auto"), False),
    ],
)
def test_it_decodes_tool_choice(choice, expected, parallel):
    c = decode(tools=[WEATHER], tool_choice=choice)
    assert (c.tool_choice, c.parallel_tool_calls) == (expected, parallel)


def test_it_decodes_sampling_limits_and_stops_and_drops_top_k():
    c = decode(
        max_tokens=300,
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END", "STOP"],
        metadata={"user_id": "user-42"},
        service_tier="auto",
    )
    assert (c.max_tokens, c.temperature, c.top_p, c.stop, c.user) == (300, 0.2, 0.9, ["END", "STOP"], "user-42")
    assert c.untranslatable == []
    with pytest.raises(GatewayError) as bad:
        decode(temperature="hot")
    assert (bad.value.kind, bad.value.param) == (ErrorKind.MALFORMED, "temperature")


@pytest.mark.parametrize(
    ("thinking", "config", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 4000}, None, Reasoning(budget_tokens=4000)),
        ({"type": "disabled"}, None, Reasoning(enabled=False)),
        ({"type": "adaptive"}, None, Reasoning()),
        ({"type": "adaptive", "display": "omitted"}, {"effort": "low"}, Reasoning(effort=Effort.LOW, summary=False)),
        ({"type": "adaptive"}, {"effort": "max"}, Reasoning(effort=Effort.HIGH)),
    ],
)
def test_it_decodes_thinking_settings(thinking, config, expected):
    body = {"thinking": thinking} if config is None else {"thinking": thinking, "output_config": config}
    assert decode(**body).reasoning == expected
    assert decode().reasoning is None


def test_it_decodes_structured_output_in_its_current_and_beta_fields():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    fmt = {"type": "json_schema", "schema": schema}
    assert decode(output_config={"format": fmt}).output == OutputFormat(schema=schema, strict=True)
    assert decode(output_format=fmt).output == OutputFormat(schema=schema, strict=True)


@pytest.mark.parametrize("field", ["mcp_servers", "container"])
def test_it_marks_anthropic_hosted_features_as_untranslatable(field):
    value = (
        [{"type": "url", "url": "https://mcp.example.com", "name": "x"}] if field == "mcp_servers" else "container_1"
    )
    assert decode(**{field: value}).untranslatable == [field]


def test_it_refuses_a_message_it_cannot_read():
    with pytest.raises(GatewayError) as bad:
        decode(messages=[{"role": "tool", "content": "Hi"}])
    assert (bad.value.kind, bad.value.param) == (ErrorKind.MALFORMED, "messages.0")
    with pytest.raises(GatewayError):
        decode(messages=[{"role": "user", "content": 7}])


# -- encode: a request for an Anthropic channel -------------------------------


def test_it_encodes_a_streaming_request_with_max_tokens_always_set():
    body = encode(conversation(system=["Be brief.", "Be kind."]))
    assert body == {
        "model": "claude-upstream",
        "stream": True,
        "max_tokens": 8192,
        "system": "Be brief.\n\nBe kind.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    }
    assert encode(conversation(max_tokens=100))["max_tokens"] == 100


def test_it_merges_turns_of_one_role_and_puts_tool_results_first():
    c = conversation(
        Message("user", [Text("Weather?")]),
        Message("assistant", [Text("Checking."), ToolCall("call.1", "get_weather", '{"city":"Paris"}')]),
        Message("assistant", [ToolCall("call_2", "get_weather", "")]),
        Message("user", [Text("and quickly")]),
        Message("user", [ToolResult("call.1", [Text("18°C")]), ToolResult("call_2", [], is_error=True)]),
    )
    assert encode(c)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                # Anthropic's ids allow only [a-zA-Z0-9_-]: the same id made safe on both sides.
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18°C"}]},
                {"type": "tool_result", "tool_use_id": "call_2", "is_error": True},
                {"type": "text", "text": "and quickly"},
            ],
        },
    ]


def test_it_sends_back_only_anthropics_own_thinking():
    c = conversation(
        Message("user", [Text("Q")]),
        Message(
            "assistant",
            [
                Thinking("mine", "sig-a", ANTHROPIC),
                Thinking(signature="red", origin=ANTHROPIC, redacted=True),
                Thinking("gpt's", "enc", OPENAI),
                Thinking("plain"),
                Text("A"),
            ],
        ),
        Message("assistant", [Thinking("gemini's", "ts", GEMINI)]),  # nothing left: no empty turn
        Message("user", [Text("Q2")]),
    )
    assert encode(c)["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "mine", "signature": "sig-a"},
        {"type": "redacted_thinking", "data": "red"},
        {"type": "text", "text": "A"},
    ]
    assert len(encode(c)["messages"]) == 3


def test_it_encodes_images_by_url_data_url_and_inline_data():
    c = conversation(
        Message(
            "user",
            [
                Image(url="https://example.com/a.png"),
                Image(url="data:image/jpeg;base64,/9j/4A"),
                Image(media_type="image/webp", data="UklGR"),
            ],
        )
    )
    assert [b["source"] for b in encode(c)["messages"][0]["content"]] == [
        {"type": "url", "url": "https://example.com/a.png"},
        {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4A"},
        {"type": "base64", "media_type": "image/webp", "data": "UklGR"},
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, None),
        (ToolChoice("auto"), None, {"type": "auto"}),
        (ToolChoice("required"), None, {"type": "any"}),
        (
            ToolChoice("tool", "get_weather"),
            False,
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
        (ToolChoice("none"), False, {"type": "none"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
    ],
)
def test_it_encodes_tools_and_tool_choice(choice, parallel, expected):
    body = encode(
        conversation(
            tools=[Tool("get_weather", "Weather in a city", WEATHER_SCHEMA)],
            tool_choice=choice,
            parallel_tool_calls=parallel,
        )
    )
    assert body["tools"] == [WEATHER]
    assert body.get("tool_choice") == expected
    assert "tool_choice" not in encode(conversation(tool_choice=ToolChoice("auto")))  # no tools: no choice


def test_it_encodes_reasoning_as_a_thinking_budget_without_sampling_settings():
    facts = anthropic_request.encode(
        conversation(reasoning=Reasoning(effort=Effort.HIGH), temperature=0.5, top_p=0.9), "c"
    )
    assert facts.thinking and facts.body["thinking"] == {"type": "enabled", "budget_tokens": 24576}
    assert facts.body["max_tokens"] > 24576 and "temperature" not in facts.body and "top_p" not in facts.body
    assert encode(conversation(reasoning=Reasoning(budget_tokens=10)))["thinking"]["budget_tokens"] == 1024
    # The caller's cap holds; the budget fits under it.
    assert (
        encode(conversation(reasoning=Reasoning(budget_tokens=5000), max_tokens=3000))["thinking"]["budget_tokens"]
        == 2999
    )
    assert "thinking" not in encode(conversation(reasoning=Reasoning(), max_tokens=1000))
    assert encode(conversation(reasoning=Reasoning(enabled=False)))["thinking"] == {"type": "disabled"}


def test_it_answers_without_thinking_where_anthropic_would_refuse_it():
    forced = conversation(tools=[Tool("get_weather")], tool_choice=ToolChoice("required"), reasoning=Reasoning())
    assert "thinking" not in encode(forced)
    # A tool loop whose last assistant turn came from another provider has no signed thinking to open with.
    loop = [
        Message("user", [Text("Q")]),
        Message("assistant", [ToolCall("c1", "get_weather", "{}")]),
        Message("user", [ToolResult("c1", [Text("18")])]),
    ]
    assert "thinking" not in encode(conversation(*loop, tools=[Tool("get_weather")], reasoning=Reasoning()))
    loop[1].parts.insert(0, Thinking("t", "sig", ANTHROPIC))
    assert (
        encode(conversation(*loop, tools=[Tool("get_weather")], reasoning=Reasoning()))["thinking"]["type"] == "enabled"
    )


def test_it_encodes_sampling_stops_output_formats_and_user():
    body = encode(
        conversation(
            temperature=1.6,
            top_p=0.5,
            stop=["END", "  "],
            user="u1",
            output=OutputFormat(schema=WEATHER_SCHEMA, name="weather", strict=True),
        )
    )
    assert body["temperature"] == 1.0 and "top_p" not in body  # Anthropic's range; recent models refuse both
    assert body["stop_sequences"] == ["END"]
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": WEATHER_SCHEMA}}
    assert body["metadata"] == {"user_id": "u1"}
    assert encode(conversation(top_p=0.5))["top_p"] == 0.5
    any_json = encode(conversation(system=["Be brief."], output=OutputFormat()))
    assert any_json["system"] == "Be brief.\n\nAnswer with a single JSON object and nothing else."


def test_an_anthropic_request_survives_decode_and_encode():
    body = {
        "model": "claude-public",
        "max_tokens": 2048,
        "system": "Be brief.",
        "stop_sequences": ["END"],
        "tools": [WEATHER],
        "tool_choice": {"type": "auto"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18°C"}]}
                ],
            },
        ],
    }
    facts = anthropic_request.encode(anthropic_request.decode(client_facts(**body)), "claude-public")
    assert facts.body == {**body, "stream": True}


# -- reader: an Anthropic channel's events as pieces ---------------------------


def simulated_events(thinking=("hmm", " so"), text=("Hi", " there"), tool=True, **usage) -> list[Event]:
    script = Script(
        model="claude-upstream",
        thinking=thinking,
        text=text,
        tool=tool,
        input_tokens=usage.get("input", 20),
        stem="sim1",
        created=0,
        cached=usage.get("cached", 0),
        cache_write=usage.get("cache_write", 0),
    )
    return [Event(e.data) for e in AnthropicRenderer(script).events()]


def read_all(events: list[Event]) -> list:
    reader = AnthropicReader()
    return [piece for event in events for piece in reader.read(event)]


def test_the_reader_reads_thinking_text_and_a_tool_call():
    assert read_all(simulated_events()) == [
        ThinkingDelta("hmm"),
        ThinkingDelta(" so"),
        ThinkingSignature("c2ltdWxhdGVksim1", ANTHROPIC),
        TextDelta("Hi"),
        TextDelta(" there"),
        ToolCallStart(0, "toolu_sim1", "get_weather"),
        ToolArguments(0, '{"city":'),
        ToolArguments(0, '"Paris",'),
        ToolArguments(0, '"unit":"celsius"}'),
        Stop(StopReason.TOOL_USE),
    ]
    assert read_all(simulated_events(thinking=(), tool=False)) == [
        TextDelta("Hi"),
        TextDelta(" there"),
        Stop(StopReason.END),
    ]


def sse(name: str, payload: dict) -> Event:
    return Event(b"event: " + name.encode() + b"\ndata: " + dumps({"type": name, **payload}) + b"\n\n")


@pytest.mark.parametrize(
    ("reason", "sequence", "expected"),
    [
        ("end_turn", None, Stop(StopReason.END)),
        ("pause_turn", None, Stop(StopReason.END)),
        ("max_tokens", None, Stop(StopReason.LENGTH)),
        ("tool_use", None, Stop(StopReason.TOOL_USE)),
        ("stop_sequence", "END", Stop(StopReason.STOP_SEQUENCE, "END")),
        ("refusal", None, Stop(StopReason.CONTENT_FILTER)),
    ],
)
def test_the_reader_maps_stop_reasons(reason, sequence, expected):
    event = sse(
        "message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": {"output_tokens": 3}}
    )
    assert AnthropicReader().read(event) == [expected]


def test_the_reader_reads_redacted_thinking_and_numbers_tool_calls_in_order():
    events = [
        sse("content_block_start", {"index": 0, "content_block": {"type": "redacted_thinking", "data": "EmwK"}}),
        sse(
            "content_block_start",
            {"index": 1, "content_block": {"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}}},
        ),
        sse("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        sse(
            "content_block_start",
            {"index": 2, "content_block": {"type": "tool_use", "id": "toolu_b", "name": "g", "input": {}}},
        ),
        sse("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
        sse("ping", {}),
    ]
    assert read_all(events) == [
        RedactedThinking("EmwK", ANTHROPIC),
        ToolCallStart(0, "toolu_a", "f"),
        ToolCallStart(1, "toolu_b", "g"),
        ToolArguments(1, "{}"),
    ]


# -- writer: pieces as the Messages stream and body, parsed by the anthropic SDK ---------------------


def sdk_client(answer: bytes, content_type: str = "text/event-stream") -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, content=answer)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    return anthropic.Anthropic(api_key="sk-test", base_url="http://hopbase.test", http_client=http, max_retries=0)


def writer(**body) -> AnthropicWriter:
    return AnthropicWriter(client_facts(**body), "claude-public", "req_0123abcd")


def stream_bytes(w: AnthropicWriter, pieces: list, usage: Usage) -> bytes:
    # One write per piece, as the relay does per upstream event.
    return b"".join(w.write([p]) for p in pieces) + w.finish(usage)


def streamed_message(pieces: list, usage: Usage, **body):
    client = sdk_client(stream_bytes(writer(**body), pieces, usage))
    with client.messages.stream(
        model="claude-public", max_tokens=512, messages=[{"role": "user", "content": "Hi"}]
    ) as s:
        events = list(s)
        return s.get_final_message(), events


ANSWER = [
    ThinkingDelta("Let me"),
    ThinkingDelta(" think."),
    ThinkingSignature("gAAAA-enc", OPENAI),
    TextDelta("Checking "),
    TextDelta("the weather."),
    ToolCallStart(0, "call_abc", "get_weather"),
    ToolArguments(0, '{"city":'),
    ToolArguments(0, '"Paris"}'),
    ToolCallStart(1, "", "get_time"),
    ToolArguments(1, "{}"),
    Stop(StopReason.TOOL_USE),
]
USAGE = Usage(input_tokens=120, cache_read_tokens=30, cache_write_tokens=7, output_tokens=55, thinking_tokens=20)


def test_the_sdk_stream_helper_accumulates_the_written_answer():
    message, events = streamed_message(ANSWER, USAGE)
    assert (message.id, message.model, message.stop_reason, message.stop_sequence) == (
        "msg_0123abcd",
        "claude-public",
        "tool_use",
        None,
    )
    thinking, text, weather, clock = message.content
    assert (thinking.type, thinking.thinking, unseal(thinking.signature)) == (
        "thinking",
        "Let me think.",
        (OPENAI, "gAAAA-enc"),
    )
    assert (text.type, text.text) == ("text", "Checking the weather.")
    assert (weather.id, weather.name, weather.input) == ("call_abc", "get_weather", {"city": "Paris"})
    assert (clock.id, clock.name, clock.input) == ("toolu_0123abcd_1", "get_time", {})
    usage = message.usage
    assert (
        usage.input_tokens,
        usage.cache_read_input_tokens,
        usage.cache_creation_input_tokens,
        usage.output_tokens,
    ) == (120, 30, 7, 55)
    assert usage.output_tokens_details.thinking_tokens == 20
    assert [e.type for e in events].count("content_block_stop") == 4


def test_the_raw_stream_is_well_formed_block_by_block():
    client = sdk_client(stream_bytes(writer(), ANSWER, USAGE))
    events = list(
        client.messages.create(
            model="claude-public", max_tokens=512, stream=True, messages=[{"role": "user", "content": "Hi"}]
        )
    )
    kinds = [(e.type, getattr(e, "index", None)) for e in events]
    assert kinds[0] == ("message_start", None) and kinds[-2:] == [("message_delta", None), ("message_stop", None)]
    open_block = None
    for kind, index in kinds[1:-2]:  # each block starts, takes its deltas, stops, before the next
        if kind == "content_block_start":
            assert open_block is None
            open_block = index
        else:
            assert index == open_block
            open_block = None if kind == "content_block_stop" else open_block
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.input_tokens == 120


def test_the_non_streaming_body_is_the_same_message():
    w = writer()
    for piece in ANSWER:
        w.write([piece])
    client = sdk_client(w.body(USAGE), "application/json")
    message = client.messages.create(
        model="claude-public", max_tokens=512, messages=[{"role": "user", "content": "Hi"}]
    )
    streamed, _ = streamed_message(ANSWER, USAGE)
    assert message.model_dump() == streamed.model_dump()


@pytest.mark.parametrize(
    ("stop", "reason", "sequence"),
    [
        (Stop(StopReason.END), "end_turn", None),
        (Stop(StopReason.LENGTH), "max_tokens", None),
        (Stop(StopReason.STOP_SEQUENCE, "END"), "stop_sequence", "END"),
        (Stop(StopReason.CONTENT_FILTER), "refusal", None),
    ],
)
def test_the_writer_maps_stop_reasons(stop, reason, sequence):
    message, _ = streamed_message([TextDelta("Hi"), stop], Usage(input_tokens=3, output_tokens=1))
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)


def test_claude_code_is_told_tool_use_whenever_a_tool_was_called():
    message, _ = streamed_message(
        [ToolCallStart(0, "c", "f"), ToolArguments(0, '{"a":1}'), Stop(StopReason.END)], Usage()
    )
    assert message.stop_reason == "tool_use" and message.content[0].input == {"a": 1}


def test_arguments_arriving_late_for_an_earlier_call_still_reach_it():
    message, _ = streamed_message(
        [
            ToolCallStart(0, "a", "f"),
            ToolArguments(0, '{"x":'),
            ToolCallStart(1, "b", "g"),
            ToolArguments(1, "{}"),
            ToolArguments(0, "1}"),
        ],
        Usage(),
    )
    assert [(b.id, b.input) for b in message.content] == [("a", {"x": 1}), ("b", {})]


def test_thinking_state_round_trips_through_the_next_request():
    message, _ = streamed_message(
        [
            ThinkingDelta("t"),
            ThinkingSignature("ts-1", GEMINI),
            TextDelta("A"),
            ThinkingSignature("ts-2", GEMINI),
            RedactedThinking("r", OPENAI),
        ],
        Usage(),
    )
    assert [b.type for b in message.content] == ["thinking", "text", "thinking", "redacted_thinking"]
    replay = [block.model_dump(exclude_none=True) for block in message.content]
    c = decode(messages=[{"role": "user", "content": "Q"}, {"role": "assistant", "content": replay}])
    assert c.messages[1].parts == [
        Thinking("t", "ts-1", GEMINI),
        Text("A"),
        Thinking("", "ts-2", GEMINI),
        Thinking(signature="r", origin=OPENAI, redacted=True),
    ]


def test_thinking_text_is_left_out_when_the_caller_asked_for_it_omitted():
    message, _ = streamed_message(
        [ThinkingDelta("secret"), ThinkingSignature("s", OPENAI), TextDelta("A")],
        Usage(),
        thinking={"type": "adaptive", "display": "omitted"},
    )
    assert message.content[0].thinking == "" and unseal(message.content[0].signature) == (OPENAI, "s")


def test_an_answer_with_no_content_is_still_a_whole_message():
    message, _ = streamed_message([], Usage(input_tokens=4))
    assert (message.content, message.stop_reason, message.usage.input_tokens) == ([], "end_turn", 4)


def test_an_error_mid_stream_reaches_the_sdk_as_its_error_event():
    w = writer()
    answer = w.write([TextDelta("Hi")]) + w.error(ErrorKind.STREAM_BUSY, "The provider is overloaded.")
    assert w.error(ErrorKind.STREAM_BUSY, "x") == MessagesWatcher(client_facts()).stream_error(
        ErrorKind.STREAM_BUSY, "x"
    )
    with pytest.raises(anthropic.APIStatusError) as failed:
        final_message(answer)
    assert failed.value.body["error"] == {"type": "overloaded_error", "message": "The provider is overloaded."}


def final_message(answer: bytes):
    with sdk_client(answer).messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]) as s:
        return s.get_final_message()


def test_an_anthropic_channel_read_and_written_again_gives_the_sdk_the_same_answer():
    events = simulated_events(input=50, cached=10, cache_write=5)
    watcher = MessagesWatcher(client_facts())
    reader, w = AnthropicReader(), writer()
    out = b""
    for event in events:
        watcher.mark(event)
        out += w.write(reader.read(event))
    out += w.finish(watcher.usage)
    translated, direct = final_message(out).model_dump(), final_message(b"".join(e.raw for e in events)).model_dump()
    for field in ("content", "stop_reason", "stop_sequence"):
        assert translated[field] == direct[field]
    assert translated["usage"] | {"service_tier": "standard"} == direct["usage"]


# -- any well-formed answer is parsed by the SDK ---------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def answers(draw):
    """Pieces as a reader hands them: text, thinking (maybe signed), redacted
    thinking and tool calls in any mix, arguments valid JSON cut anywhere."""
    pieces, thoughts, calls = [], [], []
    for kind in draw(st.lists(st.sampled_from(["text", "thinking", "redacted", "tool"]), max_size=6)):
        if kind == "text":
            text = st.text(min_size=1, max_size=6) | st.sampled_from(["\n\n", " ", "\t\n"])
            chunks = draw(st.lists(text, min_size=1, max_size=3))
            pieces += [TextDelta(t) for t in chunks]
        elif kind == "thinking":
            chunks = draw(st.lists(st.text(max_size=6), max_size=3))
            pieces += [ThinkingDelta(t) for t in chunks]
            thoughts += chunks
            if draw(st.booleans()):
                pieces.append(
                    ThinkingSignature(draw(st.text(min_size=1, max_size=8)), draw(st.sampled_from(list(WireGrammar))))
                )
        elif kind == "redacted":
            pieces.append(
                RedactedThinking(draw(st.text(min_size=1, max_size=8)), draw(st.sampled_from(list(WireGrammar))))
            )
        else:
            arguments = draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3))
            raw = json.dumps(arguments, ensure_ascii=False)
            cuts = sorted(draw(st.lists(st.integers(0, len(raw)), max_size=3)))
            index = len(calls)
            pieces.append(
                ToolCallStart(index, draw(st.sampled_from(["", f"call_{index}"])), draw(st.sampled_from(["f", "g"])))
            )
            pieces += [ToolArguments(index, raw[a:b]) for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
            calls.append(arguments)
    pieces.append(Stop(draw(st.sampled_from(list(StopReason))), draw(st.none() | st.just("END"))))
    return pieces, shown_text(pieces), "".join(thoughts), calls


def shown_text(pieces: list) -> str:
    """The text a caller is given: each run of text between two other
    blocks, but for a run of whitespace alone (Anthropic refuses it back)."""
    runs = [""]
    for piece in pieces:
        if isinstance(piece, TextDelta):
            runs[-1] += piece.text
        elif isinstance(piece, ToolCallStart | ThinkingSignature | RedactedThinking) or (
            isinstance(piece, ThinkingDelta) and piece.text
        ):
            runs.append("")
    return "".join(run for run in runs if run and not run.isspace())


@settings(max_examples=50, deadline=None)
@given(answers(), st.builds(Usage, *(st.integers(0, 10**6) for _ in range(5))))
def test_any_answer_the_writer_writes_is_parsed_by_the_sdk(answer, usage):
    pieces, text, thinking, calls = answer
    message, _ = streamed_message(pieces, usage)
    assert "".join(b.text for b in message.content if b.type == "text") == text
    assert "".join(b.thinking for b in message.content if b.type == "thinking") == thinking
    assert [b.input for b in message.content if b.type == "tool_use"] == calls
    assert message.usage.model_dump(exclude_none=True) == {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        **({"output_tokens_details": {"thinking_tokens": usage.thinking_tokens}} if usage.thinking_tokens else {}),
    }
    ended = {
        StopReason.LENGTH: "max_tokens",
        StopReason.STOP_SEQUENCE: "stop_sequence",
        StopReason.CONTENT_FILTER: "refusal",
    }
    assert message.stop_reason == ended.get(pieces[-1].reason, "tool_use" if calls else "end_turn")


# -- found in review -------------------------------------------------------------------------


def test_thinking_a_caller_will_not_see_is_asked_for_omitted():
    # A Gemini caller without includeThoughts (or a Responses caller without a
    # summary) never sees the thinking text, so it hands the signature back
    # with an empty thinking: Anthropic refuses a signature whose thinking
    # changed, unless it was given out omitted in the first place.
    hidden = encode(conversation(reasoning=Reasoning(budget_tokens=2048, summary=False)))["thinking"]
    assert hidden == {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}
    shown = encode(conversation(reasoning=Reasoning(budget_tokens=2048)))["thinking"]
    assert shown == {"type": "enabled", "budget_tokens": 2048}


def test_whitespace_only_text_is_left_out_anthropic_refuses_it():
    # "messages: text content blocks must contain non-whitespace text": a
    # Chat model's "\n" before its calls, handed back by the caller, or a blank tool output.
    body = encode(conversation(
        Message("user", [Text("Weather?")]),
        Message("assistant", [Text("\n\n"), ToolCall("c1", "get_weather", "{}")]),
        Message("user", [ToolResult("c1", [Text(" \n")]), Text(" ")]),
        system=[" ", "Be brief."],
    ))
    assert body["system"] == "Be brief."
    assert body["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1"}]},
    ]


def test_the_writer_gives_whitespace_no_text_block_of_its_own():
    # A Chat model's "\n\n" before its tool call, handed back by Claude Code
    # to an Anthropic channel, would be refused there for good.
    pieces = [TextDelta("\n\n"), ToolCallStart(0, "call_1", "get_weather"), ToolArguments(0, "{}"),
              TextDelta(" "), TextDelta("\n"), TextDelta("Done"), TextDelta(" \n"), RedactedThinking("x", OPENAI),
              TextDelta("\t"), Stop(StopReason.TOOL_USE)]
    blocks = [("tool_use", None), ("text", " \nDone \n"), ("redacted_thinking", None)]
    message, _ = streamed_message(pieces, USAGE)
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == blocks
    whole = writer()
    for piece in pieces:
        whole.write([piece])
    assert [(b["type"], b.get("text")) for b in json.loads(whole.body(USAGE))["content"]] == blocks


def test_the_default_room_to_answer_after_thinking_fits_every_claude_model():
    # Claude Opus 4 and 4.1 take at most 32000 output tokens: a request above is refused.
    body = encode(conversation(reasoning=Reasoning(effort=Effort.HIGH)))
    assert body["max_tokens"] <= 32000 and body["thinking"]["budget_tokens"] < body["max_tokens"]
    big = encode(conversation(reasoning=Reasoning(budget_tokens=32768)))
    assert big["max_tokens"] <= 32000 and big["thinking"]["budget_tokens"] < big["max_tokens"]
    # The caller's own cap is the caller's.
    assert encode(conversation(reasoning=Reasoning(budget_tokens=40000), max_tokens=60000))["max_tokens"] == 60000
