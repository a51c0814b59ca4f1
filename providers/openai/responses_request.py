"""OpenAI Responses requests decoded into the neutral form (T1–T3).

Responses is only a client API here: a Responses caller reaching an
``openai`` channel is passed through unchanged, so there is no encoder. The
decoder turns the caller's ``input`` items into alternating user/assistant
messages; Codex's freeform (``custom``) tools become one-string-argument
function tools, and the writer (``responses_stream``) turns their calls back.
"""

from __future__ import annotations

import re
from typing import Any

from core.errors import ErrorKind, GatewayError
from core.vocabulary import WireGrammar
from providers.base import RequestFacts, dumps
from providers.neutral import (
    Conversation,
    Effort,
    Image,
    Message,
    OutputFormat,
    Part,
    Reasoning,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    unseal,
)

# The nearest a function tool comes to a freeform tool: one string argument.
CUSTOM_TOOL_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
# A redacted thinking block travels in ``encrypted_content`` with this mark
# inside the sealed state (``seal`` has no room for the flag).
REDACTED = "redacted:"
# The id of a reasoning item HopBase writes (``responses_stream``): its
# request's id and its place in the output. OpenAI's own ids (``rs_`` and hex)
# never end in ``_`` and an index, so it can never look one of these up.
WRITTEN_REASONING_ID = re.compile(r"rs_[0-9a-f]+_[0-9]+")


def reasoning_id(stem: str, index: int) -> str:
    return f"rs_{stem}_{index}"

# Provider-held state and modes only OpenAI can serve (T3).
STATEFUL_FIELDS = ("previous_response_id", "conversation", "prompt")
EFFORTS = {"minimal": Effort.MINIMAL, "low": Effort.LOW, "medium": Effort.MEDIUM, "high": Effort.HIGH,
           "xhigh": Effort.HIGH}
TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}


def decode(facts: RequestFacts) -> Conversation:
    body = facts.body
    conversation = Conversation(model=facts.model, messages=[], stream=facts.stream)
    for name in STATEFUL_FIELDS:
        if body.get(name):
            _refuse(conversation, name)
    if body.get("background") is True:
        _refuse(conversation, "background")

    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        conversation.system.append(instructions)
    _decode_input(body.get("input"), conversation)

    conversation.tools = _tools(body.get("tools"), conversation)
    conversation.tool_choice = _tool_choice(body.get("tool_choice"), conversation)
    conversation.parallel_tool_calls = _typed(body, "parallel_tool_calls", bool)
    conversation.max_tokens = _typed(body, "max_output_tokens", int)
    conversation.temperature = _number(body, "temperature")
    conversation.top_p = _number(body, "top_p")
    conversation.user = _typed(body, "user", str) or _typed(body, "safety_identifier", str)
    conversation.output = _output_format(body.get("text"))
    conversation.reasoning = _reasoning(body.get("reasoning"))
    return conversation


# -- input items -------------------------------------------------------------


def _decode_input(value: Any, conversation: Conversation) -> None:
    if value is None:
        return
    if isinstance(value, str):
        conversation.messages.append(Message("user", [Text(value)]))
        return
    if not isinstance(value, list):
        raise GatewayError(ErrorKind.MALFORMED, "`input` must be a string or an array of items.", param="input")
    for position, item in enumerate(value):
        if not isinstance(item, dict):
            raise GatewayError(ErrorKind.MALFORMED, f"`input[{position}]` must be an object.", param="input")
        decoded = _item(item, conversation)
        if decoded is None:
            continue
        role, parts = decoded
        messages = conversation.messages
        # Consecutive items of one side (reasoning, text, calls; outputs and
        # the user's next words) are one turn in every other protocol.
        if messages and messages[-1].role == role:
            messages[-1].parts.extend(parts)
        else:
            messages.append(Message(role, parts))


def _item(item: dict[str, Any], conversation: Conversation) -> tuple[str, list[Part]] | None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        parts = _content(item.get("content"), conversation)
        if role in ("system", "developer"):
            text = "".join(part.text for part in parts if isinstance(part, Text))
            if text:
                conversation.system.append(text)
            return None
        if role not in ("user", "assistant"):
            raise GatewayError(ErrorKind.MALFORMED, f"Unknown message role {role!r} in `input`.", param="input")
        message_parts: list[Part] = [*parts]
        return role, message_parts
    if kind == "function_call":
        arguments = item.get("arguments") or "{}"
        if not isinstance(arguments, str):
            arguments = dumps(arguments).decode()
        name = flat_name(item.get("namespace"), _string(item, "name"))
        return "assistant", [ToolCall(_string(item, "call_id"), name, arguments)]
    if kind == "custom_tool_call":
        arguments = dumps({"input": item.get("input") or ""}).decode()
        name = flat_name(item.get("namespace"), _string(item, "name"))
        return "assistant", [ToolCall(_string(item, "call_id"), name, arguments)]
    if kind in ("function_call_output", "custom_tool_call_output"):
        return "user", [ToolResult(_string(item, "call_id"), _content(item.get("output") or "", conversation))]
    if kind == "reasoning":
        return "assistant", [_thinking(item)]
    # item_reference, built-in tool calls, compactions: state or results only OpenAI holds.
    _refuse(conversation, "input")
    return None


def _content(value: Any, conversation: Conversation) -> list[Text | Image]:
    if isinstance(value, str):
        return [Text(value)]
    if not isinstance(value, list):
        raise GatewayError(ErrorKind.MALFORMED, "Message `content` must be a string or an array.", param="input")
    parts: list[Text | Image] = []
    for part in value:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append(Text(part.get("text") or ""))
        elif kind == "refusal":
            parts.append(Text(part.get("refusal") or ""))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append(_image(part["image_url"]))
        elif kind in ("input_image", "input_file", "input_audio"):
            # Files uploaded to OpenAI (file_id) exist nowhere else.
            _refuse(conversation, "input")
        else:
            raise GatewayError(ErrorKind.MALFORMED, f"Unknown content part type {kind!r} in `input`.", param="input")
    return parts


def _image(url: str) -> Image:
    if url.startswith("data:") and ";base64," in url:
        header, data = url[5:].split(";base64,", 1)
        return Image(media_type=header or "image/png", data=data)
    return Image(url=url)


def _thinking(item: dict[str, Any]) -> Thinking:
    summary = item.get("summary") or item.get("content") or []
    text = "\n\n".join(part.get("text") or "" for part in summary if isinstance(part, dict))
    state = item.get("encrypted_content")
    if not isinstance(state, str) or not state:
        return Thinking(text=text)
    sealed = unseal(state)
    if sealed is None:
        return Thinking(text=text, signature=state, origin=WireGrammar.OPENAI)
    origin, signature = sealed
    if signature.startswith(REDACTED):
        return Thinking(signature=signature[len(REDACTED):], origin=origin, redacted=True)
    return Thinking(text=text, signature=signature, origin=origin)


# -- tools and options -------------------------------------------------------


# Hosted tools a model may use or not: without them it answers unsearched,
# the nearest equivalent (Codex offers web search by default).
OPTIONAL_HOSTED_TOOLS = {"web_search", "web_search_preview", "web_search_2025_08_26"}
# A namespaced tool (``{"type": "namespace", "name": "crm", "tools": […]}``)
# is offered to other protocols as one flat name, ``crm__lookup``.
NAMESPACE_SEPARATOR = "__"


def flat_name(namespace: str | None, name: str) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def namespaced_tools(tools: Any) -> dict[str, tuple[str, str, str]]:
    """Flat name -> (namespace, name, tool type) of a request's namespaced tools."""
    found = {}
    for group in tools if isinstance(tools, list) else ():
        if isinstance(group, dict) and group.get("type") == "namespace" and isinstance(group.get("name"), str):
            for tool in group.get("tools") or ():
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    found[flat_name(group["name"], tool["name"])] = (group["name"], tool["name"], tool.get("type"))
    return found


def _tools(value: Any, conversation: Conversation) -> list[Tool]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise GatewayError(ErrorKind.MALFORMED, "`tools` must be an array.", param="tools")
    tools = []
    for tool in value:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            inner = [dict(t, name=flat_name(_string(tool, "name"), _string(t, "name")))
                     for t in tool.get("tools") or () if isinstance(t, dict)]
            tools += _tools(inner, conversation)
        elif kind == "function":
            parameters = tool.get("parameters") or {"type": "object", "properties": {}}
            tools.append(Tool(_string(tool, "name"), tool.get("description") or "", parameters))
        elif kind == "custom":
            tools.append(Tool(_string(tool, "name"), tool.get("description") or "", CUSTOM_TOOL_PARAMETERS))
        elif kind in OPTIONAL_HOSTED_TOOLS:
            continue
        elif isinstance(kind, str):
            # file_search, code_interpreter, mcp, local_shell…: OpenAI runs them.
            _refuse(conversation, "tools")
        else:
            raise GatewayError(ErrorKind.MALFORMED, "Every tool needs a `type`.", param="tools")
    return tools


def _tool_choice(value: Any, conversation: Conversation) -> ToolChoice | None:
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        return ToolChoice(value)
    if not isinstance(value, dict):
        raise GatewayError(ErrorKind.MALFORMED, "`tool_choice` is not one the API knows.", param="tool_choice")
    kind = value.get("type")
    if kind in ("function", "custom"):
        return ToolChoice("tool", flat_name(value.get("namespace"), _string(value, "name")))
    if kind == "allowed_tools":
        # Nearest equivalent: offer only the allowed tools.
        allowed = {tool.get("name") for tool in value.get("tools") or () if isinstance(tool, dict)}
        conversation.tools = [tool for tool in conversation.tools if tool.name in allowed]
        return ToolChoice("required" if value.get("mode") == "required" else "auto")
    _refuse(conversation, "tool_choice")
    return None


def _output_format(value: Any) -> OutputFormat | None:
    fmt = value.get("format") if isinstance(value, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        return OutputFormat(schema=fmt.get("schema") or {}, name=fmt.get("name") or "response",
                            strict=fmt.get("strict") is True)
    if kind == "json_object":
        return OutputFormat()
    return None


def _reasoning(value: Any) -> Reasoning | None:
    if not isinstance(value, dict):
        return None
    effort = value.get("effort")
    if effort == "none":
        return Reasoning(enabled=False, summary=False)
    summary = value.get("summary") or value.get("generate_summary")
    return Reasoning(effort=EFFORTS.get(effort) if isinstance(effort, str) else None,
                     summary=summary not in (None, "none"))


def _refuse(conversation: Conversation, name: str) -> None:
    if name not in conversation.untranslatable:
        conversation.untranslatable.append(name)


def _string(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise GatewayError(ErrorKind.MALFORMED, f"`{name}` is required and must be a string.", param=name)
    return value


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or kind is int and isinstance(value, bool):
        raise GatewayError(ErrorKind.MALFORMED, f"`{name}` must be a {kind.__name__}.", param=name)
    return value


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GatewayError(ErrorKind.MALFORMED, f"`{name}` must be a number.", param=name)
    return float(value)
