"""Requests to a channel that speaks Bedrock's Converse grammar (rule C3, T3).

``encode`` writes a ``Conversation`` as the ``ConverseStream`` body (the
relay assembles whole answers, so always streamed; the model is in the URL).
No client speaks Converse, so there is nothing to decode.

Where Converse has no field for what the caller asked (T3), the nearest:
- reasoning: how a model on Bedrock thinks is its own
  (``additionalModelRequestFields`` differ by vendor), so the model decides;
- JSON output: an instruction in the system prompt (Converse constrains no
  output), the schema written into it;
- ``tool_choice`` none: no tools offered, unless earlier turns hold tool
  calls (Bedrock then wants the tools defined), where it is ``auto``;
- temperature: clamped to 0..1, the range Bedrock's models take;
- ``user`` and ``parallel_tool_calls``: nothing to say them with.
An image given by URL cannot be sent (Converse takes bytes, or S3): that
rules the channel out.
"""

from __future__ import annotations

import re
from typing import Any

from core.vocabulary import WireGrammar
from providers.anthropic.request import tool_input
from providers.base import RequestFacts, dumps, prompt_text_chars
from providers.neutral import (
    CannotServe,
    Conversation,
    Image,
    Part,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolResult,
    alternating_turns,
)

CONVERSE = WireGrammar.CONVERSE
# Converse's image formats, by media type.
IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/gif": "gif",
                 "image/webp": "webp"}
JSON_INSTRUCTION = "Answer with a single JSON object and nothing else."
# Converse's toolUseId must match [a-zA-Z0-9_-]+; other providers' ids need not.
_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def encode(conversation: Conversation, model: str) -> RequestFacts:
    if conversation.untranslatable:
        raise CannotServe(conversation.untranslatable[0])
    c = conversation
    messages = _messages(c)
    body: dict[str, Any] = {"messages": messages}
    system = [s for s in c.system if s.strip()]  # blank text blocks are refused
    if c.output is not None:
        system.append(_json_instruction(c.output.schema))
    if system:
        body["system"] = [{"text": s} for s in system]
    tool_config = _tool_config(c, messages)
    if tool_config:
        body["toolConfig"] = tool_config
    inference = _inference(c)
    if inference:
        body["inferenceConfig"] = inference
    return RequestFacts(
        model=model,
        stream=True,
        body=body,
        raw_body=dumps(body),
        thinking=False,
        prompt_chars=prompt_text_chars(messages) + sum(len(s) for s in system),
        route={"model": model},
    )


def _json_instruction(schema: dict[str, Any] | None) -> str:
    if schema is None:
        return JSON_INSTRUCTION
    return f"{JSON_INSTRUCTION} It must match this JSON Schema: {dumps(schema).decode()}"


def _inference(c: Conversation) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if c.max_tokens is not None:
        config["maxTokens"] = c.max_tokens
    if c.temperature is not None:
        config["temperature"] = min(max(c.temperature, 0.0), 1.0)
    if c.top_p is not None:
        config["topP"] = c.top_p
    stops = [s for s in c.stop if s]
    if stops:
        config["stopSequences"] = stops
    return config


def _messages(c: Conversation) -> list[dict[str, Any]]:
    return alternating_turns(c.messages, _block, lambda b: "toolResult" in b)


def _block(part: Part) -> dict[str, Any] | None:
    if isinstance(part, Text):
        return {"text": part.text} if part.text.strip() else None  # blank text is refused
    if isinstance(part, Image):
        return {"image": _image(part)}
    if isinstance(part, ToolCall):
        return {"toolUse": {"toolUseId": _tool_id(part.call_id), "name": part.name,
                            "input": tool_input(part.arguments)}}
    if isinstance(part, ToolResult):
        content = [b for b in (_block(p) for p in part.content) if b is not None]
        result: dict[str, Any] = {"toolUseId": _tool_id(part.call_id), "content": content or [{"json": {}}]}
        if part.is_error:
            result["status"] = "error"
        return {"toolResult": result}
    return _reasoning(part)


def _reasoning(part: Thinking) -> dict[str, Any] | None:
    # Only state a Converse channel handed out goes back to one.
    if part.origin != CONVERSE or not part.signature:
        return None
    if part.redacted:
        return {"reasoningContent": {"redactedContent": part.signature}}
    return {"reasoningContent": {"reasoningText": {"text": part.text, "signature": part.signature}}}


def _tool_id(call_id: str) -> str:
    return _ID_UNSAFE.sub("_", call_id)[:64] or "call"


def _image(image: Image) -> dict[str, Any]:
    url = image.url or ""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";", 1)[0]
    elif image.data is not None and not url:
        media_type, data = image.media_type or "", image.data
    else:
        raise CannotServe("image", "A Bedrock Converse channel takes images inline (base64), not by URL.")
    image_format = IMAGE_FORMATS.get(media_type.lower())
    if image_format is None:
        raise CannotServe("image", f"A Bedrock Converse channel cannot take {media_type or 'this'} images.")
    # Converse's bytes, in its JSON form, are base64: the data as it came.
    return {"format": image_format, "source": {"bytes": data}}


def _tool_config(c: Conversation, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    choice = c.tool_choice.mode if c.tool_choice else "auto"
    tool_turns = any("toolUse" in b or "toolResult" in b for m in messages for b in m["content"])
    if not c.tools or (choice == "none" and not tool_turns):
        return None
    config: dict[str, Any] = {"tools": [_tool_spec(t) for t in c.tools]}
    if choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice == "tool" and c.tool_choice and c.tool_choice.name:
        config["toolChoice"] = {"tool": {"name": c.tool_choice.name}}
    return config


def _tool_spec(tool: Tool) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name, "inputSchema": {"json": tool.parameters}}
    if tool.description:
        spec["description"] = tool.description
    return {"toolSpec": spec}
