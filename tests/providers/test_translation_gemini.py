"""Gemini in translation: requests decoded from and encoded for
Gemini, a Gemini channel's chunks read as pieces, and pieces written as the
streamGenerateContent stream and generateContent body the google-genai SDK
parses.

Mirrors providers/google/request.py (with gemini_contents.py) and
gemini_stream.py.
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from google import genai
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ErrorKind, GatewayError
from core.sse import Event
from core.usage import Usage
from core.vocabulary import WireGrammar
from providers.apis import GEMINI
from providers.base import RequestFacts, dumps
from providers.google import request as gemini_request
from providers.google.stream import GeminiReader, GeminiWriter
from providers.neutral import (
    CannotServe,
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
from simulator.wire.common import TOOL_ARGUMENTS, TOOL_NAME, Script, deltas
from simulator.wire.gemini import GeminiRenderer

MODEL = "gemini-test"
ANTHROPIC = WireGrammar.ANTHROPIC
GEMINI_WIRE = WireGrammar.GEMINI
USAGE = Usage(input_tokens=10, output_tokens=30, cache_read_tokens=5, cache_write_tokens=2, thinking_tokens=12)
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def facts(body: dict, action: str = "streamGenerateContent", alt: str = "sse") -> RequestFacts:
    route = {"version": "v1beta", "model": MODEL, "action": action, "alt": alt}
    return GEMINI.parse(body, dumps(body), route)


def decode(body: dict) -> Conversation:
    return gemini_request.decode(facts(body))


def user(*parts: dict) -> dict:
    return {"role": "user", "parts": list(parts)}


def model_turn(*parts: dict) -> dict:
    return {"role": "model", "parts": list(parts)}


def wrapped(origin: WireGrammar, signature: str, mark: str = "") -> str:
    """A sealed signature as a Gemini client holds it (base64, which the SDK needs)."""
    return base64.urlsafe_b64encode((seal(origin, signature) + mark).encode()).decode()


# -- the google-genai SDK against a writer ----------------------------------


class Gateway:
    """Answers the SDK's requests with a GeminiWriter's bytes for ``batches``
    (one list of pieces per channel event); keeps the facts of each request."""

    def __init__(self, batches: list[list[Piece]], usage: Usage = USAGE) -> None:
        self.batches = batches
        self.usage = usage
        self.requests: list[RequestFacts] = []
        http = httpx.Client(transport=httpx.MockTransport(self.handle))
        options = types.HttpOptions(base_url="http://hopbase.test", api_version="v1beta", httpx_client=http)
        self.client = genai.Client(api_key="hb-key", http_options=options)

    def handle(self, request: httpx.Request) -> httpx.Response:
        version, _, target = request.url.path.strip("/").split("/")
        model, action = target.split(":")
        route = {"version": version, "model": model, "action": action, "alt": request.url.params.get("alt", "")}
        request_facts = GEMINI.parse(json.loads(request.content), request.content, route)
        self.requests.append(request_facts)
        writer = GeminiWriter(request_facts, request_facts.model, "req_0123")
        stream = b"".join(writer.write(batch) for batch in self.batches)
        if request_facts.stream:
            content = stream + writer.finish(self.usage)
        else:
            content = writer.body(self.usage)
        return httpx.Response(200, content=content, headers={"content-type": writer.content_type})

    def stream(self, config: types.GenerateContentConfig | None = None) -> list[types.GenerateContentResponse]:
        return list(self.client.models.generate_content_stream(model=MODEL, contents="Hi", config=config))

    def generate(self, config: types.GenerateContentConfig | None = None) -> types.GenerateContentResponse:
        return self.client.models.generate_content(model=MODEL, contents="Hi", config=config)


def sdk_parts(chunks: list[types.GenerateContentResponse]) -> list[types.Part]:
    return [part for chunk in chunks for part in chunk.candidates[0].content.parts or []]


def joined(parts: list[types.Part], thought: bool) -> str:
    return "".join(p.text or "" for p in parts if bool(p.thought) == thought)


SHOW_THOUGHTS = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
ANSWER = [
    [ThinkingDelta("Let me "), ThinkingDelta("think.")],
    [ThinkingSignature("sig-abc", ANTHROPIC)],
    [TextDelta("It is ")],
    [TextDelta("sunny.")],
    [ToolCallStart(0, "toolu_1", "get_weather"), ToolArguments(0, '{"city":')],
    [ToolArguments(0, '"Paris"}')],
    [Stop(StopReason.TOOL_USE)],
]


# -- decode --------------------------------------------------------------------


def test_it_decodes_turns_roles_and_the_system_instruction():
    conversation = decode({
        "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Be kind."}]},
        "contents": [user({"text": "Hi"}), model_turn({"text": "Hello"}), {"parts": [{"text": "Bye"}]}],
    })
    assert conversation.model == MODEL and conversation.stream is True
    assert conversation.system == ["Be brief.", "Be kind."]
    assert [(m.role, m.parts) for m in conversation.messages] == [
        ("user", [Text("Hi")]), ("assistant", [Text("Hello")]), ("user", [Text("Bye")])]
    assert conversation.untranslatable == []


def test_it_decodes_images_inline_and_by_url():
    conversation = decode({"contents": [user(
        {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}},
        {"file_data": {"file_uri": "https://example.com/cat.jpg", "mime_type": "image/jpeg"}},
    )]})
    assert conversation.messages[0].parts == [
        Image(media_type="image/png", data="iVBOR"), Image(url="https://example.com/cat.jpg", media_type="image/jpeg")]


@pytest.mark.parametrize("part, name", [
    ({"inlineData": {"mimeType": "application/pdf", "data": "JVBER"}}, "inlineData"),
    ({"fileData": {"fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc", "mimeType": "image/png"}},
     "fileData"),
    ({"fileData": {"fileUri": "gs://bucket/cat.png"}}, "fileData"),
    ({"executableCode": {"language": "PYTHON", "code": "print(1)"}}, "executableCode"),
    ({"code_execution_result": {"outcome": "OUTCOME_OK", "output": "1"}}, "code_execution_result"),
    ({"videoMetadata": {"startOffset": "1s"}}, "videoMetadata"),
])
def test_it_marks_parts_only_gemini_can_read_untranslatable(part, name):
    assert decode({"contents": [user({"text": "look"}, part)]}).untranslatable == [name]


def test_it_decodes_function_calls_and_pairs_responses_by_id_or_earliest_call_of_the_name():
    conversation = decode({"contents": [
        user({"text": "Weather in Paris and Rome?"}),
        model_turn({"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                   {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}},
                   {"function_call": {"name": "get_time", "args": {}, "id": "given-7"}}),
        user({"functionResponse": {"name": "get_time", "id": "given-7", "response": {"result": "noon"}}},
             {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
             {"functionResponse": {"name": "get_weather", "response": {"error": "no data"}}}),
    ]})
    calls = conversation.messages[1].parts
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"}), ("get_time", {})]
    paris, rome, time = (c.call_id for c in calls)
    assert time == "given-7" and len({paris, rome, time}) == 3
    assert conversation.messages[2].parts == [
        ToolResult("given-7", [Text("noon")], False, "get_time"),
        ToolResult(paris, [Text('{"temp":21}')], False, "get_weather"),
        ToolResult(rome, [Text("no data")], True, "get_weather"),
    ]
    # The same history decodes to the same ids: results keep pairing turn after turn.
    again = decode({"contents": [user({"text": "x"}), model_turn(
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}})]})
    assert again.messages[1].parts[0].call_id == paris


def test_it_decodes_thought_parts_and_signatures_as_thinking_before_their_part():
    conversation = decode({"contents": [user({"text": "Hi"}), model_turn(
        {"text": "Let me ", "thought": True},
        {"text": "think.", "thought": True},
        {"text": "Answer", "thoughtSignature": "bmF0aXZl"},
        {"functionCall": {"name": "f", "args": {}}, "thought_signature": "c2Vjb25k"},
    )]})
    assert conversation.messages[1].parts[:3] == [
        Thinking("Let me think.", "bmF0aXZl", GEMINI_WIRE), Text("Answer"), Thinking("", "c2Vjb25k", GEMINI_WIRE)]
    assert isinstance(conversation.messages[1].parts[3], ToolCall)


def test_it_opens_sealed_signatures_of_other_protocols():
    conversation = decode({"contents": [user({"text": "Hi"}), model_turn(
        {"text": "hmm", "thought": True},
        {"text": "Answer", "thoughtSignature": wrapped(ANTHROPIC, "sig-abc")},
        {"text": "", "thoughtSignature": wrapped(ANTHROPIC, "opaque", "~redacted")},
        {"text": "raw", "thoughtSignature": seal(WireGrammar.OPENAI, "enc")},
    )]})
    assert conversation.messages[1].parts == [
        Thinking("hmm", "sig-abc", ANTHROPIC), Text("Answer"),
        Thinking("", "opaque", ANTHROPIC, redacted=True),
        Thinking("", "enc", WireGrammar.OPENAI), Text("raw")]


def test_it_decodes_function_declarations_in_either_schema_form_and_refuses_google_tools():
    conversation = decode({"contents": [user({"text": "Hi"})], "tools": [
        {"functionDeclarations": [
            {"name": "get_weather", "description": "Weather", "parameters": {
                "type": "OBJECT", "properties": {"city": {"type": "STRING", "nullable": True},
                                                 "days": {"type": "ARRAY", "items": {"type": "INTEGER"}}},
                "required": ["city"], "propertyOrdering": ["city", "days"]}},
            {"name": "lookup", "parameters_json_schema": WEATHER_SCHEMA},
            {"name": "ping"},
        ]},
        {"googleSearch": {}},
    ]})
    assert conversation.tools == [
        Tool("get_weather", "Weather", {"type": "object", "properties": {
            "city": {"type": ["string", "null"]}, "days": {"type": "array", "items": {"type": "integer"}}},
            "required": ["city"]}),
        Tool("lookup", "", WEATHER_SCHEMA),
        Tool("ping"),
    ]
    assert conversation.untranslatable == ["tools"]


@pytest.mark.parametrize("config, choice", [
    ({"mode": "AUTO"}, ToolChoice("auto")),
    ({"mode": "VALIDATED"}, ToolChoice("auto")),
    ({"mode": "NONE"}, ToolChoice("none")),
    ({"mode": "ANY"}, ToolChoice("required")),
    ({"mode": "ANY", "allowedFunctionNames": ["get_weather"]}, ToolChoice("tool", "get_weather")),
    ({"mode": "ANY", "allowed_function_names": ["a", "b"]}, ToolChoice("required")),
])
def test_it_decodes_the_function_calling_mode(config, choice):
    body = {"contents": [user({"text": "Hi"})], "toolConfig": {"functionCallingConfig": config}}
    assert decode(body).tool_choice == choice


def test_it_decodes_the_generation_config():
    conversation = decode({"contents": [user({"text": "Hi"})], "safetySettings": [{"category": "X"}],
                           "generationConfig": {
        "maxOutputTokens": 100, "temperature": 0.5, "top_p": 0.9, "topK": 40, "stopSequences": ["END"],
        "responseMimeType": "application/json", "responseSchema": {"type": "OBJECT"},
        "thinkingConfig": {"include_thoughts": True, "thinking_budget": 512},
    }})
    assert (conversation.max_tokens, conversation.temperature, conversation.top_p) == (100, 0.5, 0.9)
    assert conversation.stop == ["END"]
    assert conversation.output == OutputFormat({"type": "object"})
    assert conversation.reasoning == Reasoning(budget_tokens=512, summary=True)
    assert conversation.untranslatable == []


@pytest.mark.parametrize("thinking, reasoning", [
    ({"thinkingBudget": 0}, Reasoning(enabled=False, summary=False)),
    ({"thinkingBudget": -1, "includeThoughts": True}, Reasoning(summary=True)),
    ({"thinkingLevel": "low"}, Reasoning(effort=Effort.LOW, summary=False)),
    ({"thinking_level": "HIGH", "include_thoughts": True}, Reasoning(effort=Effort.HIGH, summary=True)),
])
def test_it_decodes_thinking_config(thinking, reasoning):
    body = {"contents": [user({"text": "Hi"})], "generationConfig": {"thinkingConfig": thinking}}
    assert decode(body).reasoning == reasoning


@pytest.mark.parametrize("body, name", [
    ({"generationConfig": {"candidateCount": 2}}, "candidateCount"),
    ({"generationConfig": {"responseModalities": ["TEXT", "IMAGE"]}}, "responseModalities"),
    ({"generationConfig": {"responseMimeType": "text/x.enum"}}, "responseMimeType"),
    ({"cachedContent": "cachedContents/abc"}, "cachedContent"),
])
def test_it_marks_what_only_gemini_can_honour_untranslatable(body, name):
    assert decode({"contents": [user({"text": "Hi"})], **body}).untranslatable == [name]


@pytest.mark.parametrize("contents, param", [
    (["Hi"], "contents[0]"),
    ([{"role": "user", "parts": "Hi"}], "contents[0].parts"),
    ([user({"functionCall": {"args": {}}})], "contents[0].parts[0].functionCall.name"),
    ([user({"text": 5})], "contents[0].parts[0].text"),
])
def test_it_refuses_what_it_cannot_read(contents, param):
    with pytest.raises(GatewayError) as raised:
        decode({"contents": contents})
    assert raised.value.kind is ErrorKind.MALFORMED and raised.value.param == param


def test_it_decodes_what_the_sdk_sends():
    gateway = Gateway([[TextDelta("ok")], [Stop(StopReason.END)]])
    tool = types.Tool(function_declarations=[types.FunctionDeclaration(
        name="get_weather", description="Weather", parameters_json_schema=WEATHER_SCHEMA)])
    gateway.stream(types.GenerateContentConfig(
        system_instruction="Be brief.", tools=[tool], max_output_tokens=64, temperature=0.2,
        thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=512),
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY")),
    ))
    conversation = gemini_request.decode(gateway.requests[0])
    assert conversation.system == ["Be brief."]
    assert conversation.messages == [Message("user", [Text("Hi")])]
    assert conversation.tools == [Tool("get_weather", "Weather", WEATHER_SCHEMA)]
    assert conversation.tool_choice == ToolChoice("required")
    assert (conversation.max_tokens, conversation.temperature) == (64, 0.2)
    assert conversation.reasoning == Reasoning(budget_tokens=512, summary=True)


# -- encode --------------------------------------------------------------------


def conversation(**fields) -> Conversation:
    return Conversation(model="public", messages=[Message("user", [Text("Hi")])], **fields)


def test_it_encodes_a_streaming_request_for_the_upstream_model():
    encoded = gemini_request.encode(conversation(system=["Be brief."]), "gemini-2.5-flash")
    assert encoded.model == "gemini-2.5-flash" and encoded.stream is True
    assert encoded.route == {"version": "v1beta", "model": "gemini-2.5-flash", "action": "streamGenerateContent",
                             "alt": "sse"}
    assert encoded.body == {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                            "systemInstruction": {"parts": [{"text": "Be brief."}]}}
    assert json.loads(encoded.raw_body) == encoded.body
    assert encoded.thinking is True and encoded.prompt_chars == len("Hi") + len("Be brief.")


def test_it_encodes_turns_tool_calls_results_images_and_gemini_signatures():
    messages = [
        Message("user", [Text("Weather?"), Image(url="https://example.com/a.png"),
                         Image(url="data:image/gif;base64,R0lG"), Image(media_type="image/webp", data="UklG")]),
        Message("assistant", [Thinking("hmm", "gem-sig", GEMINI_WIRE), Thinking("no", "other", ANTHROPIC),
                              Text("Let me look."), ToolCall("call_9", "get_weather", '{"city":"Paris"}')]),
        Message("assistant", [ToolCall("call_10", "get_time", "not json"), Thinking("", "tail", GEMINI_WIRE)]),
        Message("user", [ToolResult("call_9", [Text("21C"), Image(media_type="image/png", data="iVBOR")]),
                         ToolResult("call_10", [Text("boom")], is_error=True)]),
        Message("user", [Text("Thanks")]),
    ]
    body = gemini_request.encode(Conversation(model="public", messages=messages), "g").body
    assert body["contents"] == [
        {"role": "user", "parts": [
            {"text": "Weather?"}, {"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/a.png"}},
            {"inlineData": {"mimeType": "image/gif", "data": "R0lG"}},
            {"inlineData": {"mimeType": "image/webp", "data": "UklG"}}]},
        {"role": "model", "parts": [
            {"text": "Let me look.", "thoughtSignature": "gem-sig"},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_9"}},
            {"functionCall": {"name": "get_time", "args": {}, "id": "call_10"}},
            {"text": "", "thoughtSignature": "tail"}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "get_weather", "id": "call_9", "response": {"result": "21C"}}},
            {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}},
            {"functionResponse": {"name": "get_time", "id": "call_10", "response": {"error": "boom"}}},
            {"text": "Thanks"}]},
    ]


def test_it_names_a_result_by_its_own_name_when_the_call_is_not_in_the_conversation():
    messages = [Message("user", [ToolResult("x", [Text("1")], name="f")])]
    body = gemini_request.encode(Conversation(model="p", messages=messages), "g").body
    assert body["contents"][0]["parts"][0]["functionResponse"]["name"] == "f"


def test_it_encodes_tools_tool_choice_and_generation_config():
    encoded = gemini_request.encode(conversation(
        tools=[Tool("get_weather", "Weather", WEATHER_SCHEMA), Tool("ping")],
        tool_choice=ToolChoice("tool", "get_weather"), max_tokens=100, temperature=0.3, top_p=0.8,
        stop=["END"], output=OutputFormat(WEATHER_SCHEMA), reasoning=Reasoning(effort=Effort.LOW, summary=True),
    ), "g")
    assert encoded.body["tools"] == [{"functionDeclarations": [
        {"name": "get_weather", "description": "Weather", "parametersJsonSchema": WEATHER_SCHEMA},
        {"name": "ping", "parametersJsonSchema": {"type": "object", "properties": {}}}]}]
    assert encoded.body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY",
                                                                    "allowedFunctionNames": ["get_weather"]}}
    assert encoded.body["generationConfig"] == {
        "maxOutputTokens": 100, "temperature": 0.3, "topP": 0.8, "stopSequences": ["END"],
        "responseMimeType": "application/json", "responseJsonSchema": WEATHER_SCHEMA,
        "thinkingConfig": {"thinkingBudget": 2048, "includeThoughts": True}}


@pytest.mark.parametrize("choice, mode", [(ToolChoice("auto"), "AUTO"), (ToolChoice("none"), "NONE"),
                                          (ToolChoice("required"), "ANY")])
def test_it_encodes_tool_choice_modes(choice, mode):
    body = gemini_request.encode(conversation(tools=[Tool("f")], tool_choice=choice), "g").body
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": mode}}


@pytest.mark.parametrize("reasoning, thinking_config, thinking", [
    (Reasoning(enabled=False), {"thinkingBudget": 0}, False),
    (Reasoning(budget_tokens=3000, summary=False), {"thinkingBudget": 3000, "includeThoughts": False}, True),
    (Reasoning(), {"thinkingBudget": -1, "includeThoughts": True}, True),
])
def test_it_encodes_reasoning_as_a_thinking_budget(reasoning, thinking_config, thinking):
    encoded = gemini_request.encode(conversation(reasoning=reasoning), "g")
    assert encoded.body["generationConfig"]["thinkingConfig"] == thinking_config
    assert encoded.thinking is thinking


@pytest.mark.parametrize("model, thinking_config", [
    ("gemini-2.5-flash", {"thinkingBudget": 0}),
    ("gemini-2.5-pro", {"thinkingBudget": 128}),  # it cannot stop thinking: its least
    ("gemini-3-pro-preview", {"thinkingLevel": "low"}),
])
def test_thinking_off_is_the_least_a_model_allows(model, thinking_config):
    encoded = gemini_request.encode(conversation(reasoning=Reasoning(enabled=False)), model)
    assert encoded.body["generationConfig"]["thinkingConfig"] == thinking_config


def test_it_refuses_what_gemini_cannot_express():
    with pytest.raises(CannotServe) as raised:
        gemini_request.encode(conversation(untranslatable=["n", "logprobs"]), "g")
    assert raised.value.field == "n"
    with pytest.raises(CannotServe) as raised:
        gemini_request.encode(conversation(stop=list("abcdef")), "g")
    assert raised.value.field == "stop"


def test_a_gemini_request_survives_decode_and_encode():
    body = {"contents": [user({"text": "Hi"}), model_turn(
        {"text": "hmm", "thought": True}, {"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2ln"}),
        user({"functionResponse": {"name": "f", "response": {"result": "ok"}}})],
        "generationConfig": {"maxOutputTokens": 10, "thinkingConfig": {"thinkingBudget": 1024}}}
    again = gemini_request.encode(decode(body), MODEL).body
    assert again["contents"][1:] == [
        model_turn({"functionCall": {"name": "f", "args": {"a": 1}, "id": "call_1"}, "thoughtSignature": "c2ln"}),
        user({"functionResponse": {"name": "f", "id": "call_1", "response": {"result": "ok"}}})]
    assert again["generationConfig"] == {"maxOutputTokens": 10,
                                         "thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": False}}


# -- GeminiReader ----------------------------------------------------------------


def script(tool: bool, thinking: int = 3, text: int = 4) -> Script:
    return Script(model=MODEL, thinking=deltas(thinking, ("hmm", "so")), text=deltas(text, ("Hello", "world")),
                  tool=tool, input_tokens=20, stem="stem", created=0)


def read_all(events: list[bytes], reader: GeminiReader | None = None) -> list[Piece]:
    reader = reader or GeminiReader()
    return [piece for raw in events for piece in reader.read(Event(raw))]


def test_the_reader_reads_the_simulators_thinking_text_and_tool_call():
    s = script(tool=True)
    pieces = read_all([e.data for e in GeminiRenderer(s).events()])
    assert "".join(p.text for p in pieces if isinstance(p, ThinkingDelta)) == s.full_thinking
    assert "".join(p.text for p in pieces if isinstance(p, TextDelta)) == s.full_text
    start, arguments = (p for p in pieces if isinstance(p, ToolCallStart | ToolArguments))
    assert start.index == 0 and start.name == TOOL_NAME and start.call_id.startswith("call_")
    assert json.loads(arguments.fragment) == json.loads(TOOL_ARGUMENTS)
    assert pieces[-1] == Stop(StopReason.TOOL_USE)


def test_the_reader_ends_a_plain_answer_with_end():
    pieces = read_all([e.data for e in GeminiRenderer(script(tool=False, thinking=0)).events()])
    assert pieces[-1] == Stop(StopReason.END)
    assert not any(isinstance(p, ThinkingDelta) for p in pieces)


def chunk(*parts: dict, finish: str | None = None) -> bytes:
    candidate: dict = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return b"data: " + dumps({"candidates": [candidate]}) + b"\r\n\r\n"


def test_the_reader_puts_a_signature_before_its_parts_own_piece_and_keeps_call_ids():
    pieces = read_all([
        chunk({"text": "a", "thought": True, "thoughtSignature": "s1"}),
        chunk({"functionCall": {"name": "f", "args": {"x": [1]}, "id": "fc_1"}, "thoughtSignature": "s2"},
              {"functionCall": {"name": "g"}}),
        chunk({"text": "", "thoughtSignature": "s3"}, finish="STOP"),
    ])
    assert pieces[:6] == [
        ThinkingSignature("s1", GEMINI_WIRE), ThinkingDelta("a"), ThinkingSignature("s2", GEMINI_WIRE),
        ToolCallStart(0, "fc_1", "f"), ToolArguments(0, '{"x":[1]}'), pieces[5]]
    assert pieces[5] == ToolCallStart(1, pieces[5].call_id, "g") and pieces[6] == ToolArguments(1, "{}")
    assert pieces[7:] == [ThinkingSignature("s3", GEMINI_WIRE), Stop(StopReason.TOOL_USE)]


@pytest.mark.parametrize("finish, reason", [
    ("STOP", StopReason.END), ("MAX_TOKENS", StopReason.LENGTH), ("SAFETY", StopReason.CONTENT_FILTER),
    ("RECITATION", StopReason.CONTENT_FILTER), ("PROHIBITED_CONTENT", StopReason.CONTENT_FILTER),
    ("MALFORMED_FUNCTION_CALL", StopReason.END), ("OTHER", StopReason.END),
])
def test_the_reader_maps_finish_reasons(finish, reason):
    assert read_all([chunk({"text": "x"}, finish=finish)])[-1] == Stop(reason)


def test_the_reader_reads_a_blocked_prompt_as_content_filter():
    blocked = b"data: " + dumps({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {}}) + b"\r\n\r\n"
    assert read_all([blocked]) == [Stop(StopReason.CONTENT_FILTER)]
    assert read_all([b"data: " + dumps({"usageMetadata": {"promptTokenCount": 3}}) + b"\r\n\r\n"]) == []


# -- GeminiWriter, through the google-genai SDK ----------------------------------------


def test_the_sdk_streams_text_thoughts_a_function_call_and_usage():
    chunks = Gateway(ANSWER).stream(SHOW_THOUGHTS)
    parts = sdk_parts(chunks)
    assert joined(parts, thought=True) == "Let me think."
    assert joined(parts, thought=False) == "It is sunny."
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.name, c.args, c.id) for c in calls] == [("get_weather", {"city": "Paris"}, "toolu_1")]
    last = chunks[-1]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP
    assert (last.model_version, last.response_id) == (MODEL, "req_0123")
    usage = last.usage_metadata
    assert (usage.prompt_token_count, usage.cached_content_token_count, usage.candidates_token_count,
            usage.thoughts_token_count, usage.total_token_count) == (17, 5, 18, 12, 47)


def test_the_sdk_assembles_the_whole_body():
    response = Gateway(ANSWER).generate(SHOW_THOUGHTS)
    parts = response.candidates[0].content.parts
    assert [(p.text, p.thought) for p in parts[:2]] == [("Let me think.", True), ("It is sunny.", None)]
    assert parts[1].thought_signature is not None
    assert response.function_calls[0].name == "get_weather" and response.function_calls[0].args == {"city": "Paris"}
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    assert response.usage_metadata.prompt_token_count == 17 and response.usage_metadata.thoughts_token_count == 12


def test_the_sdk_sees_no_thoughts_unless_it_asked_but_keeps_the_signature():
    parts = sdk_parts(Gateway(ANSWER).stream())
    assert joined(parts, thought=True) == "" and joined(parts, thought=False) == "It is sunny."
    assert [p.thought_signature is not None for p in parts if p.text] == [True, False]


def test_a_thought_signature_comes_back_to_its_protocol_on_the_next_turn():
    gateway = Gateway(ANSWER)
    first = gateway.generate(SHOW_THOUGHTS)
    history = [types.Content(role="user", parts=[types.Part(text="Hi")]), first.candidates[0].content,
               types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                   name="get_weather", response={"result": "21C"}))])]
    gateway.client.models.generate_content(model=MODEL, contents=history)
    conversation = gemini_request.decode(gateway.requests[-1])
    assert conversation.messages[1].parts[:2] == [Thinking("Let me think.", "sig-abc", ANTHROPIC), Text("It is sunny.")]
    call = conversation.messages[1].parts[2]
    assert conversation.messages[2].parts == [ToolResult(call.call_id, [Text("21C")], False, "get_weather")]


@pytest.mark.parametrize("stop, finish", [
    (StopReason.END, "STOP"), (StopReason.STOP_SEQUENCE, "STOP"), (StopReason.LENGTH, "MAX_TOKENS"),
    (StopReason.CONTENT_FILTER, "SAFETY"),
])
def test_the_sdk_reads_each_stop_reason(stop, finish):
    chunks = Gateway([[TextDelta("x")], [Stop(stop)]]).stream()
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason(finish)


def test_usage_leaves_out_counts_that_are_zero():
    response = Gateway([[TextDelta("x")]], Usage(input_tokens=3, output_tokens=4)).generate()
    assert response.usage_metadata.cached_content_token_count is None
    assert response.usage_metadata.thoughts_token_count is None
    assert response.usage_metadata.total_token_count == 7


def test_redacted_thinking_and_back_to_back_signatures_each_get_a_part():
    writer = GeminiWriter(facts({"contents": []}, action="generateContent"), MODEL, "req_1")
    writer.write([ThinkingSignature("a", ANTHROPIC), RedactedThinking("opaque", ANTHROPIC)])
    body = json.loads(writer.body(Usage()))
    # Sealed state as the SDK needs it: base64 (of "hb1.…", so it starts "aGIxL").
    assert all(p["thoughtSignature"].startswith("aGIxL") for p in body["candidates"][0]["content"]["parts"])
    again = decode({"contents": [model_turn(*body["candidates"][0]["content"]["parts"])]})
    assert again.messages[0].parts == [Thinking("", "a", ANTHROPIC), Thinking("", "opaque", ANTHROPIC, redacted=True)]


def test_the_json_array_form_when_the_client_did_not_ask_for_sse():
    writer = GeminiWriter(facts({"contents": []}, alt=""), MODEL, "req_1")
    assert writer.content_type == "application/json"
    streamed = writer.write([TextDelta("a")]) + writer.write([TextDelta("b")]) + writer.finish(USAGE)
    assert streamed.startswith(b"[{") and b"\n,\r\n" in streamed
    chunks = json.loads(streamed)
    assert [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks] == ["a", "b", ""]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"


def test_errors_are_framed_as_the_client_reads_them():
    sse = GeminiWriter(facts({"contents": []}), MODEL, "req_1")
    sse.write([TextDelta("a")])
    error = sse.error(ErrorKind.STREAM_FAILED, "The provider failed.")
    assert error == b'data: {"error":{"code":503,"message":"The provider failed.","status":"UNAVAILABLE"}}\r\n\r\n'
    array = GeminiWriter(facts({"contents": []}, alt=""), MODEL, "req_1")
    assert array.error(ErrorKind.STREAM_BUSY, "Busy.").startswith(b'[{"error":{"code":429')
    array = GeminiWriter(facts({"contents": []}, alt=""), MODEL, "req_1")
    array.write([TextDelta("a")])
    assert array.error(ErrorKind.STREAM_BUSY, "Busy.").startswith(b'\n,\r\n{"error":')


# -- any well-formed piece sequence -----------------------------------------------------

texts = st.text(max_size=12)
segments = st.one_of(
    st.tuples(st.just("text"), texts),
    st.tuples(st.just("thinking"), texts, st.booleans()),
    st.tuples(st.just("tool"), st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
              st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), texts, st.booleans()), max_size=3),
              st.integers(min_value=1, max_value=4)),
)


@pytest.fixture(scope="module")
def gateway() -> Gateway:
    """One SDK client for every example (making one takes longer than the example)."""
    return Gateway([])


@settings(max_examples=50, deadline=None)
@given(segments=st.lists(segments, max_size=8), stop=st.sampled_from(list(StopReason)),
       counts=st.tuples(*[st.integers(min_value=0, max_value=10_000)] * 4))
def test_any_piece_sequence_parses_in_the_sdk_to_the_same_text_and_calls(gateway, segments, stop, counts):
    pieces: list[Piece] = []
    text, thinking, calls = "", "", []
    for segment in segments:
        if segment[0] == "text":
            pieces.append(TextDelta(segment[1]))
            text += segment[1]
        elif segment[0] == "thinking":
            pieces.append(ThinkingDelta(segment[1]))
            thinking += segment[1]
            if segment[2]:
                pieces.append(ThinkingSignature("sig", ANTHROPIC))
        else:
            _, name, args, cuts = segment
            index = len(calls)
            arguments = json.dumps(args)
            pieces.append(ToolCallStart(index, f"call_{index}", name))
            step = max(1, len(arguments) // cuts)
            pieces += [ToolArguments(index, arguments[i:i + step]) for i in range(0, len(arguments), step)]
            calls.append((name, args))
    pieces.append(Stop(stop))
    uncached, cached, thought, visible = counts
    usage = Usage(input_tokens=uncached, cache_read_tokens=cached, output_tokens=thought + visible,
                  thinking_tokens=thought)
    gateway.batches, gateway.usage = [pieces[i:i + 3] for i in range(0, len(pieces), 3)], usage
    for parts, last in ((sdk_parts(chunks := gateway.stream(SHOW_THOUGHTS)), chunks[-1]),
                        ((response := gateway.generate(SHOW_THOUGHTS)).candidates[0].content.parts or [], response)):
        assert joined(parts, thought=False) == text and joined(parts, thought=True) == thinking
        assert [(p.function_call.name, p.function_call.args) for p in parts if p.function_call] == calls
        assert last.usage_metadata.prompt_token_count == uncached + cached
        assert last.usage_metadata.candidates_token_count == visible
        assert last.usage_metadata.total_token_count == uncached + cached + thought + visible


# -- found in review ----------------------------------------------------------------------


def test_a_call_another_provider_made_carries_the_documented_signature_sentinel():
    # Gemini 3 refuses a model turn's functionCall without a thoughtSignature
    # (400 "Function call is missing a thought_signature"); a Chat caller has
    # no field to keep Gemini's, and other providers' calls never had one.
    messages = [
        Message("user", [Text("Weather and time?")]),
        Message("assistant", [Text("Looking."), ToolCall("c1", "get_weather", "{}"), ToolCall("c2", "get_time", "{}")]),
        Message("user", [ToolResult("c1", [Text("21C")]), ToolResult("c2", [Text("noon")])]),
        Message("assistant", [Thinking("", "real-sig", GEMINI_WIRE), ToolCall("c3", "get_weather", "{}")]),
        Message("user", [ToolResult("c3", [Text("22C")])]),
    ]
    contents = gemini_request.encode(Conversation(model="p", messages=messages), "g").body["contents"]
    first, second = contents[1]["parts"], contents[3]["parts"]
    assert first[0] == {"text": "Looking."}
    assert first[1]["thoughtSignature"] == "skip_thought_signature_validator"
    assert "thoughtSignature" not in first[2]  # parallel calls: only the first carries one
    assert second[0]["thoughtSignature"] == "real-sig"


def test_signatures_of_interleaved_thinking_stay_with_their_own_calls():
    # Anthropic thinking given out omitted (no thinking text): signature,
    # call, signature, call. Each signature goes on the part after it.
    writer = GeminiWriter(facts({"contents": []}, action="generateContent"), MODEL, "req_1")
    writer.write([ThinkingSignature("s1", ANTHROPIC), ToolCallStart(0, "c1", "f"), ToolArguments(0, "{}")])
    writer.write([ThinkingSignature("s2", ANTHROPIC), ToolCallStart(1, "c2", "g"), ToolArguments(1, "{}"),
                  Stop(StopReason.TOOL_USE)])
    parts = json.loads(writer.body(Usage()))["candidates"][0]["content"]["parts"]
    again = decode({"contents": [model_turn(*parts)]})
    assert again.messages[0].parts == [
        Thinking("", "s1", ANTHROPIC), ToolCall("c1", "f", "{}"), Thinking("", "s2", ANTHROPIC), ToolCall("c2", "g", "{}")]
