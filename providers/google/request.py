"""Gemini generateContent requests to and from the neutral form (T3).

``decode`` reads a request a Gemini client sent (camelCase or snake_case
keys: the google-genai SDK mixes them) into a ``Conversation``; ``encode``
writes a ``Conversation`` as the ``streamGenerateContent`` request for a
channel that speaks Gemini (always streaming: the relay assembles whole
answers). The turns themselves are ``gemini_contents``'s; this module has the
rest of the request: system instruction, tools, tool config, generation config.
"""

from __future__ import annotations

from typing import Any

from providers.base import RequestFacts, dumps, prompt_text_chars
from providers.google.contents import (
    add_once,
    decode_contents,
    encode_contents,
    field,
    function_name,
    key_of,
    malformed,
)
from providers.google.gemini import API_VERSION
from providers.neutral import (
    CannotServe,
    Conversation,
    Effort,
    OutputFormat,
    Reasoning,
    Tool,
    ToolChoice,
)

FUNCTION_DECLARATIONS = ("functionDeclarations", "function_declarations")
EFFORTS = {effort.value: effort for effort in Effort}
MAX_STOP_SEQUENCES = 5
# Gemini's OpenAPI-style Schema beside JSON Schema: the keys that differ.
SCHEMA_KEYS = {"any_of": "anyOf", "min_items": "minItems", "max_items": "maxItems", "min_length": "minLength",
               "max_length": "maxLength", "min_properties": "minProperties", "max_properties": "maxProperties"}
SCHEMA_DROPPED = {"nullable", "propertyOrdering", "property_ordering", "example"}
CHOICES_OUT = {"none": "NONE", "required": "ANY"}


# -- decode: a Gemini client's request -> Conversation ------------------------


def decode(facts: RequestFacts) -> Conversation:
    body = facts.body
    untranslatable: list[str] = []
    if field(body, "cachedContent"):
        # Provider state: only the Gemini account that holds it can serve it.
        untranslatable.append(key_of(body, "cachedContent") or "cachedContent")
    conversation = Conversation(
        model=facts.model,
        messages=decode_contents(body.get("contents") or [], untranslatable),
        system=_system(field(body, "systemInstruction")),
        tools=_tools(body.get("tools"), untranslatable),
        tool_choice=_tool_choice(field(field(body, "toolConfig"), "functionCallingConfig")),
        stream=facts.stream,
        untranslatable=untranslatable,
    )
    config = field(body, "generationConfig")
    if isinstance(config, dict):
        _generation_config(config, conversation)
    return conversation


def _system(instruction: Any) -> list[str]:
    if isinstance(instruction, str):
        return [instruction] if instruction else []
    parts = field(instruction, "parts") or []
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]


def _tools(raw: Any, untranslatable: list[str]) -> list[Tool]:
    tools: list[Tool] = []
    for entry in raw or []:
        if not isinstance(entry, dict):
            raise malformed("Each of `tools` must be an object.", "tools")
        for key, value in entry.items():
            if key in FUNCTION_DECLARATIONS:
                tools.extend(_declaration(d) for d in value or [])
            elif value is not None:
                # googleSearch, codeExecution, urlContext, …: Google's own tools.
                add_once(untranslatable, "tools")
    return tools


def _declaration(declaration: Any) -> Tool:
    name = function_name(declaration, "tools.functionDeclarations")
    description = field(declaration, "description")
    tool = Tool(name, description if isinstance(description, str) else "")
    schema = field(declaration, "parametersJsonSchema")
    if isinstance(schema, dict):
        tool.parameters = schema
    elif isinstance(field(declaration, "parameters"), dict):
        tool.parameters = json_schema(field(declaration, "parameters"))
    return tool


def json_schema(schema: Any) -> Any:
    """Gemini's ``Schema`` (upper-case types, ``nullable``) as JSON Schema."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        key = SCHEMA_KEYS.get(key, key)
        if key in SCHEMA_DROPPED:
            continue
        if key == "type" and isinstance(value, str):
            if value.upper() == "TYPE_UNSPECIFIED":
                continue
            value = value.lower()
        elif key == "properties" and isinstance(value, dict):
            value = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "anyOf"):
            value = json_schema(value)
        out[key] = value
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _tool_choice(config: Any) -> ToolChoice | None:
    mode = field(config, "mode")
    mode = mode.upper() if isinstance(mode, str) else None
    names = field(config, "allowedFunctionNames") or []
    if mode == "ANY":
        # Several allowed names: nearest is "some tool" (all stay offered).
        return ToolChoice("tool", names[0]) if len(names) == 1 else ToolChoice("required")
    if mode == "NONE":
        return ToolChoice("none")
    # VALIDATED: the model may call a tool or answer, its calls held to the schema.
    return ToolChoice("auto") if mode in ("AUTO", "VALIDATED") else None


def _number(config: dict[str, Any], camel: str, kind: type) -> Any:
    value = field(config, camel)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise malformed(f"`generationConfig.{camel}` must be a number.", f"generationConfig.{camel}")
    return kind(value)


def _generation_config(config: dict[str, Any], conversation: Conversation) -> None:
    untranslatable = conversation.untranslatable
    conversation.max_tokens = _number(config, "maxOutputTokens", int)
    conversation.temperature = _number(config, "temperature", float)
    conversation.top_p = _number(config, "topP", float)
    conversation.stop = [s for s in field(config, "stopSequences") or [] if isinstance(s, str)]
    if (_number(config, "candidateCount", int) or 1) > 1:
        add_once(untranslatable, key_of(config, "candidateCount") or "candidateCount")
    if any(str(m).upper() != "TEXT" for m in field(config, "responseModalities") or []):
        add_once(untranslatable, key_of(config, "responseModalities") or "responseModalities")
    if field(config, "responseLogprobs"):
        add_once(untranslatable, key_of(config, "responseLogprobs") or "responseLogprobs")
    mime = field(config, "responseMimeType")
    if mime == "application/json":
        schema = field(config, "responseJsonSchema")
        if schema is None and field(config, "responseSchema") is not None:
            schema = json_schema(field(config, "responseSchema"))
        conversation.output = OutputFormat(schema if isinstance(schema, dict) else None)
    elif mime not in (None, "", "text/plain"):
        # text/x.enum and the like: a format only Gemini constrains output to.
        add_once(untranslatable, key_of(config, "responseMimeType") or "responseMimeType")
    conversation.reasoning = _reasoning(field(config, "thinkingConfig"))


def _reasoning(config: Any) -> Reasoning | None:
    if not isinstance(config, dict):
        return None
    budget = field(config, "thinkingBudget")
    show = bool(field(config, "includeThoughts"))
    if budget == 0:
        return Reasoning(enabled=False, summary=False)
    level = field(config, "thinkingLevel")
    effort = EFFORTS.get(level.lower()) if isinstance(level, str) else None
    # -1 (dynamic) or no budget: the model decides (no budget, no effort).
    budget_tokens = budget if isinstance(budget, int) and budget > 0 else None
    return Reasoning(effort=effort, budget_tokens=budget_tokens, summary=show)


# -- encode: Conversation -> a Gemini channel's request -----------------------


def encode(conversation: Conversation, model: str) -> RequestFacts:
    if conversation.untranslatable:
        raise CannotServe(conversation.untranslatable[0])
    if len(conversation.stop) > MAX_STOP_SEQUENCES:
        raise CannotServe("stop", f"Gemini takes at most {MAX_STOP_SEQUENCES} stop sequences.")
    contents = encode_contents(conversation.messages)
    body: dict[str, Any] = {"contents": contents}
    if conversation.system:
        body["systemInstruction"] = {"parts": [{"text": s} for s in conversation.system]}
    if conversation.tools:
        body["tools"] = [{"functionDeclarations": [_declaration_out(t) for t in conversation.tools]}]
        if conversation.tool_choice is not None:
            body["toolConfig"] = {"functionCallingConfig": _choice_out(conversation.tool_choice)}
    config = _config_out(conversation, model)
    if config:
        body["generationConfig"] = config
    reasoning = conversation.reasoning
    return RequestFacts(
        model=model,
        stream=True,
        body=body,
        raw_body=dumps(body),
        thinking=reasoning is None or reasoning.enabled,
        prompt_chars=prompt_text_chars(contents) + prompt_text_chars(conversation.system),
        route={"version": API_VERSION, "model": model, "action": "streamGenerateContent", "alt": "sse"},
    )


def _declaration_out(tool: Tool) -> dict[str, Any]:
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description:
        declaration["description"] = tool.description
    declaration["parametersJsonSchema"] = tool.parameters
    return declaration


def _choice_out(choice: ToolChoice) -> dict[str, Any]:
    if choice.mode == "tool" and choice.name:
        return {"mode": "ANY", "allowedFunctionNames": [choice.name]}
    return {"mode": CHOICES_OUT.get(choice.mode, "AUTO")}


# Models that cannot stop thinking refuse a zero budget (400): they are
# given their least instead (2.5 Pro's smallest budget; Gemini 3's lowest level).
LEAST_THINKING = (("gemini-2.5-pro", {"thinkingBudget": 128}), ("gemini-3", {"thinkingLevel": "low"}))


def _thinking_off(model: str) -> dict[str, Any]:
    name = model.removeprefix("models/")
    return next((least for prefix, least in LEAST_THINKING if name.startswith(prefix)), {"thinkingBudget": 0})


def _config_out(conversation: Conversation, model: str) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if conversation.max_tokens is not None:
        config["maxOutputTokens"] = conversation.max_tokens
    if conversation.temperature is not None:
        config["temperature"] = conversation.temperature
    if conversation.top_p is not None:
        config["topP"] = conversation.top_p
    if conversation.stop:
        config["stopSequences"] = conversation.stop
    if conversation.output is not None:
        config["responseMimeType"] = "application/json"
        if conversation.output.schema is not None:
            config["responseJsonSchema"] = conversation.output.schema
    reasoning = conversation.reasoning
    if reasoning is not None and not reasoning.enabled:
        config["thinkingConfig"] = _thinking_off(model)
    elif reasoning is not None:
        # Neither an effort nor a budget: Gemini's dynamic thinking (-1).
        unset = reasoning.effort is None and reasoning.budget_tokens is None
        config["thinkingConfig"] = {"thinkingBudget": -1 if unset else reasoning.budget(),
                                    "includeThoughts": reasoning.summary}
    return config
