"""OpenAI Responses as a client API of translated channels.

The request side: what a Responses caller's body decodes to in the neutral
form, and what only an OpenAI channel can serve. The answer side: pieces
from a channel of another protocol, written as Responses events and bodies
and read back by the official openai SDK (raw stream, the strict
``responses.stream()`` helper, non-streaming ``create``), including Codex's
next turn that hands its reasoning state back with ``store: false``.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels_pool.selection import ChannelInfo
from core.errors import ErrorKind, GatewayError
from core.usage import Usage
from core.vocabulary import WireGrammar
from providers.apis import RESPONSES
from providers.base import RequestFacts
from providers.legs import Legs
from providers.neutral import (
    Conversation,
    Effort,
    Image,
    Message,
    OutputFormat,
    Piece,
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
)
from providers.openai.responses_request import CUSTOM_TOOL_PARAMETERS, decode
from providers.openai.responses_stream import ResponsesWriter

ANTHROPIC = WireGrammar.ANTHROPIC
USAGE = Usage(input_tokens=100, cache_read_tokens=40, cache_write_tokens=10, output_tokens=30, thinking_tokens=12)
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def facts(**body: Any) -> RequestFacts:
    body.setdefault("model", "gpt-public")
    return RESPONSES.parse(body, orjson.dumps(body), {})


def decoded(**body: Any) -> Conversation:
    return decode(facts(**body))


# --------------------------------------------------------------------------- decoding requests


def test_it_decodes_instructions_and_a_string_input():
    conversation = decoded(instructions="Be brief.", input="Hello", stream=True)

    assert conversation.model == "gpt-public"
    assert conversation.stream is True
    assert conversation.system == ["Be brief."]
    assert conversation.messages == [Message("user", [Text("Hello")])]
    assert conversation.untranslatable == []


def test_it_decodes_messages_of_every_role_with_text_and_image_parts():
    conversation = decoded(input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "No emoji."}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": "https://example.test/cat.png", "detail": "auto"},
            {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/AA=="},
        ]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]},
        {"role": "user", "content": "Thanks"},
    ])

    assert conversation.system == ["Use tools.", "No emoji."]
    assert conversation.messages == [
        Message("user", [Text("What is this?"), Image(url="https://example.test/cat.png"),
                         Image(media_type="image/jpeg", data="/9j/AA==")]),
        Message("assistant", [Text("A cat.")]),
        Message("user", [Text("Thanks")]),
    ]


def test_it_decodes_function_calls_and_outputs_into_one_turn_each():
    conversation = decoded(input=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [
            {"type": "input_text", "text": "21C"},
            {"type": "input_image", "image_url": "https://example.test/rome.png"},
        ]},
        {"role": "user", "content": "Which is warmer?"},
    ])

    assert conversation.messages[1:] == [
        Message("assistant", [ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                              ToolCall("call_2", "get_weather", '{"city":"Rome"}')]),
        Message("user", [ToolResult("call_1", [Text("18C")]),
                         ToolResult("call_2", [Text("21C"), Image(url="https://example.test/rome.png")]),
                         Text("Which is warmer?")]),
    ]


def test_it_decodes_codex_freeform_tools_as_one_string_argument():
    conversation = decoded(
        tools=[{"type": "custom", "name": "apply_patch", "description": "Edit files",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}],
        input=[
            {"role": "user", "content": "Fix it"},
            {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "*** Begin Patch\n"},
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done"},
        ],
    )

    assert conversation.tools == [Tool("apply_patch", "Edit files", CUSTOM_TOOL_PARAMETERS)]
    assert conversation.messages[1:] == [
        Message("assistant", [ToolCall("call_p", "apply_patch", '{"input":"*** Begin Patch\\n"}')]),
        Message("user", [ToolResult("call_p", [Text("Done")])]),
    ]


def test_it_decodes_reasoning_items_to_thinking_of_their_origin():
    summary = [{"type": "summary_text", "text": "Plan."}, {"type": "summary_text", "text": "Act."}]
    conversation = decoded(input=[
        {"role": "user", "content": "Go"},
        {"type": "reasoning", "summary": summary, "encrypted_content": "gAAAA-openai-state"},
        {"type": "reasoning", "summary": summary[:1], "encrypted_content": seal(ANTHROPIC, "sig-1")},
        {"type": "reasoning", "summary": [], "encrypted_content": seal(ANTHROPIC, "redacted:opaque")},
        {"type": "reasoning", "summary": summary[1:]},
    ])

    assert conversation.messages[1].parts == [
        Thinking("Plan.\n\nAct.", signature="gAAAA-openai-state", origin=WireGrammar.OPENAI),
        Thinking("Plan.", signature="sig-1", origin=ANTHROPIC),
        Thinking(signature="opaque", origin=ANTHROPIC, redacted=True),
        Thinking("Act."),
    ]


def test_it_decodes_function_tools_and_every_tool_choice():
    body = {"input": "Hi", "tools": [{**WEATHER, "strict": True}, {"type": "function", "name": "now"}]}

    conversation = decoded(**body, tool_choice="required")
    assert conversation.tools == [Tool("get_weather", "Weather in a city", WEATHER["parameters"]),
                                  Tool("now", "", {"type": "object", "properties": {}})]
    assert conversation.tool_choice == ToolChoice("required")
    assert decoded(**body, tool_choice="none").tool_choice == ToolChoice("none")
    assert decoded(**body).tool_choice is None
    assert decoded(**body, tool_choice={"type": "function", "name": "now"}).tool_choice == ToolChoice("tool", "now")

    allowed = decoded(**body, tool_choice={"type": "allowed_tools", "mode": "required",
                                           "tools": [{"type": "function", "name": "now"}]})
    assert [tool.name for tool in allowed.tools] == ["now"]
    assert allowed.tool_choice == ToolChoice("required")


def test_it_decodes_sampling_output_format_and_reasoning():
    conversation = decoded(input="Hi", max_output_tokens=500, temperature=0.2, top_p=0.9, parallel_tool_calls=False,
                           user="u-1", reasoning={"effort": "high", "summary": "auto"},
                           text={"format": {"type": "json_schema", "name": "answer", "strict": True,
                                            "schema": {"type": "object"}}, "verbosity": "low"})

    assert (conversation.max_tokens, conversation.temperature, conversation.top_p) == (500, 0.2, 0.9)
    assert (conversation.parallel_tool_calls, conversation.user) == (False, "u-1")
    assert conversation.output == OutputFormat(schema={"type": "object"}, name="answer", strict=True)
    assert conversation.reasoning == Reasoning(effort=Effort.HIGH, summary=True)

    assert decoded(input="Hi", text={"format": {"type": "json_object"}}).output == OutputFormat()
    assert decoded(input="Hi", text={"format": {"type": "text"}}).output is None
    assert decoded(input="Hi", reasoning={"effort": "none"}).reasoning == Reasoning(enabled=False, summary=False)
    assert decoded(input="Hi", reasoning={"effort": "minimal"}).reasoning == Reasoning(effort=Effort.MINIMAL,
                                                                                       summary=False)
    assert decoded(input="Hi").reasoning is None


def test_it_takes_a_codex_request_whole():
    conversation = decoded(
        model="gpt-5-codex", instructions="You are Codex.", stream=True, store=False, parallel_tool_calls=False,
        include=["reasoning.encrypted_content"], prompt_cache_key="0f6e", tool_choice="auto",
        reasoning={"effort": "medium", "summary": "auto"}, text={"verbosity": "medium"},
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>cwd</env>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug"}]},
        ],
        tools=[{"type": "function", "name": "shell", "description": "Runs a command", "strict": False,
                "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
               {"type": "custom", "name": "apply_patch", "description": "Edit files",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}],
    )

    assert conversation.untranslatable == []
    assert conversation.system == ["You are Codex.", "Sandbox: none."]
    assert conversation.messages == [Message("user", [Text("<env>cwd</env>"), Text("Fix the bug")])]
    assert [tool.name for tool in conversation.tools] == ["shell", "apply_patch"]
    assert conversation.reasoning == Reasoning(effort=Effort.MEDIUM, summary=True)
    assert (conversation.tool_choice, conversation.parallel_tool_calls) == (ToolChoice("auto"), False)


def test_it_drops_fields_that_only_tune():
    conversation = decoded(input="Hi", store=False, include=["reasoning.encrypted_content"], truncation="auto",
                           metadata={"a": "b"}, prompt_cache_key="k", service_tier="flex")

    assert conversation.untranslatable == []


@pytest.mark.parametrize(("body", "field"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools"),
    ({"tools": [WEATHER, {"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_data": "…"}]}]}, "input"),
])
def test_it_names_what_only_an_openai_channel_can_serve(body, field):
    assert decoded(**{"input": "Hi", **body}).untranslatable == [field]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": 3}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
    ({"input": "Hi", "temperature": "hot"}, "temperature"),
    ({"input": "Hi", "max_output_tokens": True}, "max_output_tokens"),
    ({"input": "Hi", "tools": [{"name": "f"}]}, "tools"),
])
def test_it_refuses_what_it_cannot_read(body, param):
    with pytest.raises(GatewayError) as raised:
        decoded(**body)

    assert (raised.value.kind, raised.value.param) == (ErrorKind.MALFORMED, param)


# --------------------------------------------------------------------------- the answer, read by the openai SDK

THINK_TEXT_CALL: list[Piece] = [
    ThinkingDelta("Need the "), ThinkingDelta("weather."), ThinkingSignature("sig-abc", ANTHROPIC),
    TextDelta("Checking"), TextDelta(" now."),
    ToolCallStart(0, "toolu_1", "get_weather"), ToolArguments(0, '{"city"'), ToolArguments(0, ':"Paris"}'),
    Stop(StopReason.TOOL_USE),
]


class Gateway:
    """Answers the SDK as HopBase would for a translated channel: the
    request parsed and decoded, the pieces written by ``ResponsesWriter``."""

    def __init__(self, pieces: list[Piece], usage: Usage = USAGE,
                 error: tuple[ErrorKind, str] | None = None) -> None:
        self.pieces = pieces
        self.usage = usage
        self.error = error
        self.conversations: list[Conversation] = []
        self.streamed = b""

    def handle(self, request: httpx.Request) -> httpx.Response:
        client_facts = RESPONSES.parse(orjson.loads(request.content), request.content, {})
        self.conversations.append(decode(client_facts))
        writer = ResponsesWriter(client_facts, client_facts.model, "req_0123abcd")
        chunks = [writer.write([piece]) for piece in self.pieces]
        if not client_facts.stream:
            return httpx.Response(200, content=writer.body(self.usage), headers={"content-type": "application/json"})
        chunks.append(writer.error(*self.error) if self.error else writer.finish(self.usage))
        self.streamed = b"".join(chunks)
        return httpx.Response(200, content=self.streamed, headers={"content-type": "text/event-stream"})

    def client(self) -> openai.OpenAI:
        http = httpx.Client(transport=httpx.MockTransport(self.handle))
        return openai.OpenAI(api_key="hb-test", base_url="http://hopbase.test/v1", http_client=http, max_retries=0)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for block in raw.split(b"\n\n"):
        if block:
            name, data = block.split(b"\n")
            event = orjson.loads(data.removeprefix(b"data: "))
            assert name == b"event: " + event["type"].encode()
            events.append(event)
    return events


def test_it_streams_the_event_grammar_openai_sends():
    gateway = Gateway(THINK_TEXT_CALL)

    events = list(gateway.client().responses.create(model="gpt-public", input="Weather?", stream=True))

    assert [event.type for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.id == "resp_0123abcd"
    assert events[0].response.status == "in_progress"
    assert events[0].response.model == "gpt-public"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Checking now."
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1, 2]
    assert sse_events(gateway.streamed)[-1]["response"]["usage"] == {
        "input_tokens": 150, "input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 10},
        "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 12}, "total_tokens": 180,
    }


def test_it_satisfies_the_strict_stream_helper():
    gateway = Gateway(THINK_TEXT_CALL)

    with gateway.client().responses.stream(model="gpt-public", input="Weather?", tools=[WEATHER]) as stream:
        final = stream.get_final_response()

    reasoning, message, call = final.output
    assert final.status == "completed"
    assert message.content[0].text == final.output_text == "Checking now."
    assert reasoning.summary[0].text == "Need the weather."
    assert reasoning.encrypted_content == seal(ANTHROPIC, "sig-abc")
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call", "toolu_1", "get_weather", '{"city":"Paris"}')
    usage = final.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens,
            usage.output_tokens_details.reasoning_tokens, usage.total_tokens) == (150, 40, 30, 12, 180)


def test_it_assembles_the_non_streaming_body():
    final = Gateway(THINK_TEXT_CALL).client().responses.create(model="gpt-public", input="Weather?")

    assert (final.id, final.object, final.model, final.status) == ("resp_0123abcd", "response", "gpt-public",
                                                                   "completed")
    assert final.output_text == "Checking now."
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == '{"city":"Paris"}'
    assert final.usage.input_tokens == 150 and final.usage.total_tokens == 180


@pytest.mark.parametrize(("reason", "detail"), [(StopReason.LENGTH, "max_output_tokens"),
                                                (StopReason.CONTENT_FILTER, "content_filter")])
def test_it_ends_incomplete_when_the_answer_was_cut(reason, detail):
    gateway = Gateway([TextDelta("Once upon"), Stop(reason)])

    events = list(gateway.client().responses.create(model="gpt-public", input="A story", stream=True))
    body = gateway.client().responses.create(model="gpt-public", input="A story")

    assert events[-1].type == "response.incomplete"
    for response in (events[-1].response, body):
        assert (response.status, response.incomplete_details.reason) == ("incomplete", detail)
        assert response.output_text == "Once upon"
        assert response.output[0].status == "incomplete"


def test_an_optional_web_search_is_dropped_and_namespaced_tools_are_offered_flat():
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}
    conversation = decoded(input=[
        {"role": "user", "content": "Go"},
        {"type": "function_call", "namespace": "agents", "name": "spawn_agent", "call_id": "c1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "spawned"},
    ], tools=[WEATHER, {"type": "web_search", "external_web_access": False},
              {"type": "namespace", "name": "agents", "description": "Sub-agents", "tools": [spawn]}])

    assert conversation.untranslatable == []
    assert [tool.name for tool in conversation.tools] == ["get_weather", "agents__spawn_agent"]
    assert conversation.messages[1].parts[0].name == "agents__spawn_agent"


def test_a_call_of_a_namespaced_tool_names_its_namespace():
    gateway = Gateway([ToolCallStart(0, "call_3", "agents__spawn_agent"), ToolArguments(0, '{"task":"x"}'),
                       Stop(StopReason.TOOL_USE)])
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object", "properties": {}}}
    tools = [{"type": "namespace", "name": "agents", "description": "Sub-agents", "tools": [spawn]}]

    with gateway.client().responses.stream(model="gpt-public", input="Go", tools=tools) as stream:
        final = stream.get_final_response()

    (call,) = final.output
    assert (call.type, call.namespace, call.name, call.arguments) == ("function_call", "agents", "spawn_agent",
                                                                      '{"task":"x"}')


def test_it_answers_a_freeform_tool_with_a_custom_tool_call():
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    arguments = orjson.dumps({"input": patch}).decode()
    gateway = Gateway([ToolCallStart(0, "call_9", "apply_patch"), ToolArguments(0, arguments[:10]),
                       ToolArguments(0, arguments[10:]), Stop(StopReason.TOOL_USE)])
    tools = [{"type": "custom", "name": "apply_patch", "description": "Edit files"}]

    with gateway.client().responses.stream(model="gpt-public", input="Add a.txt", tools=tools) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()

    assert events[2:6] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                           "response.custom_tool_call_input.done", "response.output_item.done"]
    (call,) = final.output
    assert (call.type, call.call_id, call.name, call.input) == ("custom_tool_call", "call_9", "apply_patch", patch)


def test_it_ends_a_failed_stream_with_the_callers_error_events():
    gateway = Gateway([TextDelta("Half")], error=(ErrorKind.STREAM_BUSY, "The channel is busy."))

    with pytest.raises(openai.APIError) as raised:
        list(gateway.client().responses.create(model="gpt-public", input="Hi", stream=True))

    assert raised.value.code == "rate_limit_exceeded"
    error, failed = sse_events(gateway.streamed)[-2:]
    assert (error["type"], error["code"], failed["type"]) == ("error", "rate_limit_exceeded", "response.failed")
    assert failed["response"]["id"] == "resp_0123abcd"
    assert [error["sequence_number"], failed["sequence_number"]] == [5, 6]
    assert "completed" not in gateway.streamed.decode()


def test_it_hands_codex_its_thinking_state_back_to_the_right_protocol():
    first = Gateway(THINK_TEXT_CALL + [RedactedThinking("opaque-bytes", ANTHROPIC)])
    request = {"model": "gpt-public", "store": False, "include": ["reasoning.encrypted_content"],
               "reasoning": {"effort": "medium", "summary": "auto"}, "tools": [WEATHER]}
    turn = [{"role": "user", "content": "Weather in Paris?"}]
    with first.client().responses.stream(input=turn, **request) as stream:
        output = stream.get_final_response().output

    # Codex keeps every output item and sends it back as input, with the result.
    turn += [item.model_dump(exclude_none=True) for item in output]
    turn.append({"type": "function_call_output", "call_id": "toolu_1", "output": "18C"})
    second = Gateway([TextDelta("18C in Paris."), Stop(StopReason.END)])
    second.client().responses.create(input=turn, stream=True, **request).close()

    (conversation,) = second.conversations
    assert conversation.untranslatable == []
    assert conversation.messages[1:] == [
        Message("assistant", [
            Thinking("Need the weather.", signature="sig-abc", origin=ANTHROPIC),
            Text("Checking now."),
            ToolCall("toolu_1", "get_weather", '{"city":"Paris"}'),
            Thinking(signature="opaque-bytes", origin=ANTHROPIC, redacted=True),
        ]),
        Message("user", [ToolResult("toolu_1", [Text("18C")])]),
    ]


# Codex's request (store false, the reasoning state asked for) and its turn's
# output items handed back as the Codex CLI sends them, recorded from 0.171
# (tests/processes/test_real_clients.py): every field, a reasoning item's null ones too.
CODEX_REQUEST = {"model": "gpt-public", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
                 "reasoning": {"summary": "auto"}, "tool_choice": "auto", "parallel_tool_calls": True,
                 "tools": [WEATHER]}
OPENAI_CHANNEL = ChannelInfo(id=1, name="openai", protocol="openai", base_url="http://openai.test/v1", secret="k",
                             models={}, priority=0, weight=1, max_concurrency=None)


def codex_item(item: Any) -> dict[str, Any]:
    if item.type == "reasoning":
        return {"type": "reasoning", "id": item.id, "summary": [part.model_dump() for part in item.summary],
                "content": None, "encrypted_content": item.encrypted_content}
    return item.model_dump(exclude_none=True)


def codex_second_turn(pieces: list[Piece]) -> list[dict[str, Any]]:
    """A Codex conversation's input after a first turn HopBase wrote from
    ``pieces`` (a call of the weather tool), with the tool's result."""
    turn: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]
    options = {name: value for name, value in CODEX_REQUEST.items() if name != "stream"}
    with Gateway(pieces).client().responses.stream(input=turn, **options) as stream:
        output = stream.get_final_response().output
    return [*turn, *(codex_item(item) for item in output),
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"}]


def passed_to_openai(**body: Any) -> RequestFacts:
    return Legs(RESPONSES, facts(**body), "req_00ff").to(OPENAI_CHANNEL).facts


@pytest.mark.parametrize("signature", [None, ThinkingSignature("sig-abc", ANTHROPIC)], ids=["no state", "sealed"])
def test_codex_turn_after_thinking_of_another_protocol_reaches_an_openai_channel_without_it(signature):
    # Thinking with no provider state (Gemini's without a
    # thoughtSignature, a Chat channel's reasoning_content, a Claude stream
    # cut before its signature) is a reasoning item with no encrypted_content;
    # passed through as it is, OpenAI would look up its id, never issued
    # (Codex sends store false): "Item with id 'rs_…' not found".
    pieces: list[Piece] = [ThinkingDelta("Need the weather."), *([signature] if signature else []),
                           TextDelta("Checking now."), ToolCallStart(0, "call_1", "get_weather"),
                           ToolArguments(0, '{"city":"Paris"}'), Stop(StopReason.TOOL_USE)]
    turn = codex_second_turn(pieces)
    (reasoning,) = [item for item in turn if item["type"] == "reasoning"]
    assert (reasoning["encrypted_content"] is None) == (signature is None)

    sent = passed_to_openai(input=turn, **CODEX_REQUEST)

    assert orjson.loads(sent.raw_body) == sent.body
    assert [item for item in sent.body["input"] if item["type"] == "reasoning"] == []
    assert sent.body["input"] == [item for item in turn if item["type"] != "reasoning"]
    assert {k: v for k, v in sent.body.items() if k != "input"} == CODEX_REQUEST


def test_openai_reasoning_items_pass_through_untouched_beside_those_taken_out():
    ours = codex_second_turn([ThinkingDelta("Hmm."), TextDelta("Checking."), ToolCallStart(0, "call_1", "get_weather"),
                              Stop(StopReason.TOOL_USE)])
    # OpenAI's own: its state inline (store false), or only its id (stored, looked up).
    inline = {"type": "reasoning", "id": "rs_68a1f0c2d4e5b6a7", "summary": [], "encrypted_content": "gAAAAB-opaque"}
    stored = {"type": "reasoning", "id": "rs_68a1f0c2d4e5b6a8", "summary": [], "encrypted_content": None}
    sealed = {"type": "reasoning", "id": "rs_00ff_3", "summary": [], "encrypted_content": seal(ANTHROPIC, "sig")}
    own = {"type": "reasoning", "id": "rs_68a1f0c2d4e5b6a9", "summary": [],
           "encrypted_content": seal(WireGrammar.OPENAI, "gA")}

    sent = passed_to_openai(input=[*ours, inline, stored, sealed, own], **CODEX_REQUEST)
    assert sent.body["input"] == [*(item for item in ours if item["type"] != "reasoning"), inline, stored,
                                  {**own, "encrypted_content": "gA"}]

    # With nothing to take out, the body goes as the client sent it, byte for byte.
    untouched = facts(input=[ours[0], inline, stored], **CODEX_REQUEST)
    assert Legs(RESPONSES, untouched, "req_00ff").to(OPENAI_CHANNEL).facts.raw_body == untouched.raw_body


# --------------------------------------------------------------------------- any well-formed answer

_text = st.text(max_size=12)
_segment = st.one_of(
    st.tuples(st.just("text"), st.lists(_text, min_size=1, max_size=4)),
    st.tuples(st.just("thinking"), st.lists(_text, max_size=3), st.sampled_from([None, ANTHROPIC,
                                                                                 WireGrammar.GEMINI])),
    st.tuples(st.just("tool"), st.sampled_from(["get_weather", "now"]), st.lists(_text, max_size=4)),
    st.tuples(st.just("custom"), st.text(max_size=30), st.integers(0, 40)),
    st.tuples(st.just("redacted")),
)


def _pieces(segments: list[tuple[Any, ...]], reason: StopReason) -> tuple[list[Piece], list[str]]:
    """The pieces, and the arguments (or freeform input) of each call."""
    pieces: list[Piece] = []
    tools: list[str] = []
    for segment in segments:
        if segment[0] == "text":
            pieces += [TextDelta(t) for t in segment[1]]
        elif segment[0] == "thinking":
            pieces += [ThinkingDelta(t) for t in segment[1]]
            if segment[2] is not None:
                pieces.append(ThinkingSignature("sig", segment[2]))
        elif segment[0] == "tool":
            pieces.append(ToolCallStart(len(tools), f"call_{len(tools)}", segment[1]))
            pieces += [ToolArguments(len(tools), t) for t in segment[2]]
            tools.append("".join(segment[2]) or "{}")
        elif segment[0] == "custom":
            arguments, cut = orjson.dumps({"input": segment[1]}).decode(), segment[2]
            pieces.append(ToolCallStart(len(tools), f"call_{len(tools)}", "apply_patch"))
            pieces += [ToolArguments(len(tools), arguments[:cut]), ToolArguments(len(tools), arguments[cut:])]
            tools.append(segment[1])
        else:
            pieces.append(RedactedThinking("data", ANTHROPIC))
    return [*pieces, Stop(reason)], tools


@settings(max_examples=50, deadline=None)
@given(segments=st.lists(_segment, max_size=6), reason=st.sampled_from(list(StopReason)),
       counts=st.tuples(*[st.integers(0, 10**6)] * 5))
def test_any_answer_is_parsed_by_the_sdk_to_the_same_text_and_arguments(segments, reason, counts):
    pieces, arguments = _pieces(segments, reason)
    text = "".join(p.text for p in pieces if isinstance(p, TextDelta))
    thinking = "".join(p.text for p in pieces if isinstance(p, ThinkingDelta))
    usage = Usage(*counts)
    gateway = Gateway(pieces, usage)
    tools = [WEATHER, {"type": "custom", "name": "apply_patch"}]

    # The helper checks the grammar on every event, completed or not.
    with gateway.client().responses.stream(model="gpt-public", input="Hi", tools=tools) as stream:
        events = list(stream)
    completed = events[-1].type == "response.completed"
    response = stream.get_final_response() if completed else events[-1].response
    body = gateway.client().responses.create(model="gpt-public", input="Hi", tools=tools)

    for answer in (response, body):
        assert answer.output_text == text
        calls = [item.arguments if item.type == "function_call" else item.input
                 for item in answer.output if item.type in ("function_call", "custom_tool_call")]
        assert calls == arguments
        assert "".join(part.text for item in answer.output if item.type == "reasoning"
                       for part in item.summary) == thinking
        assert answer.usage.output_tokens == usage.output_tokens
        assert answer.usage.input_tokens == usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == ("response.incomplete" if reason in (StopReason.LENGTH, StopReason.CONTENT_FILTER)
                               else "response.completed")


# --------------------------------------------------------------------------- found in review


def test_a_call_without_arguments_has_an_empty_object_for_them_as_openai_sends():
    # An Anthropic channel streams no input_json_delta for a tool without
    # parameters; Codex parses the arguments as JSON whatever the tool.
    pieces: list[Piece] = [ToolCallStart(0, "toolu_1", "now"), Stop(StopReason.TOOL_USE)]
    gateway = Gateway(pieces)
    with gateway.client().responses.stream(model="gpt-public", input="Time?", tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    body = Gateway(pieces).client().responses.create(model="gpt-public", input="Time?", tools=[WEATHER])
    assert [item.arguments for item in final.output] == [item.arguments for item in body.output] == ["{}"]
    events = sse_events(gateway.streamed)
    assert "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta") == "{}"
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == "{}"
