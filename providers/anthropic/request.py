"""Anthropic Messages requests to and from the neutral form (T3).

``decode`` reads a Messages request a client sent into a ``Conversation``;
``encode`` writes a ``Conversation`` as the request for a channel that speaks
Anthropic Messages (always streaming: the relay assembles whole answers).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from core.errors import ErrorKind, GatewayError
from core.vocabulary import WireGrammar
from providers.base import RequestFacts, dumps, prompt_text_chars
from providers.neutral import (
    CannotServe,
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
    alternating_turns,
    unseal,
)

ANTHROPIC = WireGrammar.ANTHROPIC
# Anthropic requires max_tokens; a caller of another API may not have said.
DEFAULT_MAX_TOKENS = 8192
# The most output a default may ask for: Claude Opus 4 and 4.1 refuse more.
MAX_DEFAULT_TOKENS = 32000
MIN_BUDGET = 1024
# Blocks that name provider-held files, citations sources or server tools:
# no other protocol can take them, and dropping them changes the answer.
UNTRANSLATABLE_BLOCKS = {"document", "search_result", "container_upload"}
UNTRANSLATABLE_FIELDS = ("mcp_servers", "container")
EFFORTS = {"low": Effort.LOW, "medium": Effort.MEDIUM, "high": Effort.HIGH, "xhigh": Effort.HIGH, "max": Effort.HIGH}
THINKING_BLOCKS = ("thinking", "redacted_thinking")
CHOICES_IN = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}
CHOICES_OUT = {"auto": "auto", "required": "any", "tool": "tool", "none": "none"}
JSON_INSTRUCTION = "Answer with a single JSON object and nothing else."
# Anthropic's tool_use ids must match ^[a-zA-Z0-9_-]+$; other providers' need not.
_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def _malformed(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorKind.MALFORMED, message, param=param)


# -- decode: a client's Messages request -> Conversation ----------------------


def decode(facts: RequestFacts) -> Conversation:
    body = facts.body
    untranslatable: list[str] = [name for name in UNTRANSLATABLE_FIELDS if body.get(name)]
    system, messages = _system(body.get("system")), []
    for i, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "system":
            # A system turn mid-conversation (Claude Code sends them): the
            # neutral form has one system prompt, the nearest equivalent.
            system += _system(message.get("content"))
        else:
            messages.append(_message(message, i, untranslatable))
    conversation = Conversation(
        model=facts.model,
        messages=messages,
        system=system,
        max_tokens=_number(body, "max_tokens", int),
        temperature=_number(body, "temperature", float),
        top_p=_number(body, "top_p", float),
        stop=[s for s in body.get("stop_sequences") or [] if isinstance(s, str)],
        stream=facts.stream,
        untranslatable=untranslatable,
    )
    tools = [_tool(t, untranslatable) for t in body.get("tools") or [] if isinstance(t, dict)]
    conversation.tools = [t for t in tools if t is not None]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in CHOICES_IN:
        conversation.tool_choice = ToolChoice(CHOICES_IN[choice["type"]], choice.get("name"))
        if choice.get("disable_parallel_tool_use"):
            conversation.parallel_tool_calls = False
    conversation.reasoning = _reasoning(body.get("thinking"), body.get("output_config"))
    conversation.output = _output(body)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        conversation.user = metadata["user_id"]
    return conversation


def _number(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _malformed(f"`{name}` must be a number.", name)
    return kind(value)


def _system(system: Any) -> list[str]:
    if isinstance(system, str):
        return [system] if system else []
    if isinstance(system, list):  # text blocks (cache_control only tunes caching)
        return [b["text"] for b in system if isinstance(b, dict) and b.get("text")]
    return []


def _message(message: Any, i: int, untranslatable: list[str]) -> Message:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise _malformed("Each message must be an object with role `user`, `assistant` or `system`.", f"messages.{i}")
    content = message.get("content")
    if isinstance(content, str):
        return Message(message["role"], [Text(content)])
    if not isinstance(content, list):
        raise _malformed("`content` must be a string or an array of content blocks.", f"messages.{i}.content")
    parts = [_part(block, untranslatable) for block in content if isinstance(block, dict)]
    return Message(message["role"], [p for p in parts if p is not None])


def _part(block: dict[str, Any], untranslatable: list[str]) -> Part | None:
    kind = block.get("type")
    if kind == "text":
        return Text(block.get("text") or "")
    if kind == "image":
        return _image(block, untranslatable)
    if kind == "tool_use":
        return ToolCall(block.get("id") or "", block.get("name") or "", dumps(block.get("input") or {}).decode())
    if kind == "tool_result":
        return _tool_result(block, untranslatable)
    if kind == "thinking":
        return _thinking(block.get("thinking") or "", block.get("signature") or "")
    if kind == "redacted_thinking":
        thinking = _thinking("", block.get("data") or "")
        thinking.redacted = True
        return thinking
    # document, search_result, server tool uses and results, anything newer.
    untranslatable.append(kind if isinstance(kind, str) else "content")
    return None


def _image(block: dict[str, Any], untranslatable: list[str]) -> Image | None:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        return Image(media_type=source.get("media_type"), data=source.get("data"))
    if source.get("type") == "url":
        return Image(url=source.get("url"))
    untranslatable.append("image")  # a file_id held by Anthropic's Files API
    return None


def _tool_result(block: dict[str, Any], untranslatable: list[str]) -> ToolResult:
    content = block.get("content")
    parts: list[Text | Image] = []
    if isinstance(content, str):
        parts.append(Text(content))
    elif isinstance(content, list):
        for item in content:
            part = _part(item, untranslatable) if isinstance(item, dict) else None
            if isinstance(part, Text | Image):
                parts.append(part)
    return ToolResult(block.get("tool_use_id") or "", parts, is_error=bool(block.get("is_error")))


def _thinking(text: str, signature: str) -> Thinking:
    if not signature:
        return Thinking(text)
    sealed = unseal(signature)
    if sealed is not None:  # state another protocol made, handed out through this API
        return Thinking(text, signature=sealed[1], origin=sealed[0])
    return Thinking(text, signature=signature, origin=ANTHROPIC)


def _tool(tool: dict[str, Any], untranslatable: list[str]) -> Tool | None:
    if tool.get("type") not in (None, "custom"):  # web_search_*, bash_*, text_editor_*, computer_*…
        untranslatable.append("tools")
        return None
    if not isinstance(tool.get("name"), str):
        raise _malformed("Each tool must have a `name`.", "tools")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        return Tool(tool["name"], tool.get("description") or "")
    return Tool(tool["name"], tool.get("description") or "", schema)


def _reasoning(thinking: Any, output_config: Any) -> Reasoning | None:
    if not isinstance(thinking, dict) or "type" not in thinking:
        return None
    if thinking["type"] == "disabled":
        return Reasoning(enabled=False)
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    budget = thinking.get("budget_tokens") if thinking["type"] == "enabled" else None
    return Reasoning(
        effort=EFFORTS.get(effort) if isinstance(effort, str) else None,
        budget_tokens=budget if isinstance(budget, int) else None,
        summary=thinking.get("display") != "omitted",
    )


def _output(body: dict[str, Any]) -> OutputFormat | None:
    # output_config.format is the current field; output_format the beta one before it.
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    fmt = fmt or body.get("output_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return OutputFormat(schema=fmt["schema"], strict=True)
    return None


# -- encode: Conversation -> a request for an Anthropic channel ---------------


def encode(conversation: Conversation, model: str) -> RequestFacts:
    if conversation.untranslatable:
        raise CannotServe(conversation.untranslatable[0])
    c = conversation
    messages = _messages(c)
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True}
    system = [s for s in c.system if s.strip()]  # whitespace-only text is refused
    if c.output is not None and c.output.schema is None:
        system.append(JSON_INSTRUCTION)  # Anthropic has no "any JSON" mode; the nearest is asking
    if system:
        body["system"] = "\n\n".join(system)
    if c.tools:
        body["tools"] = [_tool_out(t) for t in c.tools]
        choice = _tool_choice(c)
        if choice:
            body["tool_choice"] = choice
    budget = _thinking_budget(c, messages, body.get("tool_choice"))
    max_tokens = c.max_tokens or DEFAULT_MAX_TOKENS
    if budget:
        if not c.max_tokens:
            max_tokens = min(budget + DEFAULT_MAX_TOKENS, MAX_DEFAULT_TOKENS)  # room to answer after thinking
        body["thinking"] = {"type": "enabled", "budget_tokens": min(budget, max_tokens - 1)}
        if c.reasoning is not None and not c.reasoning.summary:
            # The caller will not see the text, so it hands the signature
            # back without it: only state given out omitted stays valid.
            body["thinking"]["display"] = "omitted"
    else:
        if c.reasoning is not None and not c.reasoning.enabled:
            body["thinking"] = {"type": "disabled"}
        # Anthropic takes temperature 0..1 (OpenAI's goes to 2), and recent
        # models refuse temperature together with top_p: temperature wins.
        if c.temperature is not None:
            body["temperature"] = min(max(c.temperature, 0.0), 1.0)
        elif c.top_p is not None:
            body["top_p"] = c.top_p
    body["max_tokens"] = max_tokens
    stops = [s for s in c.stop if s.strip()]  # whitespace-only stop sequences are refused
    if stops:
        body["stop_sequences"] = stops
    if c.output is not None and c.output.schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": c.output.schema}}
    if c.user:
        body["metadata"] = {"user_id": c.user}
    return RequestFacts(
        model=model,
        stream=True,
        body=body,
        raw_body=dumps(body),
        thinking="budget_tokens" in body.get("thinking", {}),
        prompt_chars=prompt_text_chars(messages) + sum(len(s) for s in system),
    )


def _thinking_budget(c: Conversation, messages: list[dict[str, Any]], choice: dict[str, Any] | None) -> int:
    """The budget to think with, or 0 where Anthropic would refuse thinking."""
    if c.reasoning is None or not c.reasoning.enabled:
        return 0
    budget = max(MIN_BUDGET, c.reasoning.budget())
    if c.max_tokens and c.max_tokens <= MIN_BUDGET:
        return 0  # no room to think within the caller's cap: answer without
    if choice and choice["type"] in ("any", "tool"):
        return 0  # Anthropic refuses thinking with a forced tool; the forced tool matters more
    # In a tool loop Anthropic wants the last assistant turn to open with its
    # own signed thinking; a turn another provider made has none.
    last = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), None)
    if last and any(b["type"] == "tool_use" for b in last) and last[0]["type"] not in THINKING_BLOCKS:
        return 0
    return budget


def _messages(c: Conversation) -> list[dict[str, Any]]:
    return alternating_turns(c.messages, _block, lambda b: b["type"] == "tool_result")


def _block(part: Part) -> dict[str, Any] | None:
    if isinstance(part, Text):
        # Empty and whitespace-only text blocks are refused.
        return {"type": "text", "text": part.text} if part.text.strip() else None
    if isinstance(part, Image):
        return _image_out(part)
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": _ID_UNSAFE.sub("_", part.call_id), "name": part.name,
                "input": tool_input(part.arguments)}
    if isinstance(part, ToolResult):
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _ID_UNSAFE.sub("_", part.call_id)}
        content = [b for b in (_block(p) for p in part.content) if b is not None]
        if content:
            block["content"] = content
        if part.is_error:
            block["is_error"] = True
        return block
    # Thinking: only Anthropic's own signed state goes back to Anthropic.
    if part.origin != ANTHROPIC or not part.signature:
        return None
    if part.redacted:
        return {"type": "redacted_thinking", "data": part.signature}
    return {"type": "thinking", "thinking": part.text, "signature": part.signature}


def tool_input(arguments: str) -> dict[str, Any]:
    # tool_use.input must be an object; a model's broken JSON cannot be sent back as one.
    try:
        value = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _image_out(image: Image) -> dict[str, Any]:
    url = image.url or ""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";", 1)[0]
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    if image.url:
        return {"type": "image", "source": {"type": "url", "url": image.url}}
    source = {"type": "base64", "media_type": image.media_type or "image/png", "data": image.data or ""}
    return {"type": "image", "source": source}


def _tool_out(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name, "input_schema": tool.parameters}
    if tool.description:
        out["description"] = tool.description
    return out


def _tool_choice(c: Conversation) -> dict[str, Any] | None:
    if c.tool_choice is None and c.parallel_tool_calls is not False:
        return None
    mode = c.tool_choice.mode if c.tool_choice else "auto"
    out: dict[str, Any] = {"type": CHOICES_OUT[mode]}
    if mode == "tool" and c.tool_choice:
        out["name"] = c.tool_choice.name
    if c.parallel_tool_calls is False and mode != "none":  # tool_choice none takes no such flag
        out["disable_parallel_tool_use"] = True
    return out
