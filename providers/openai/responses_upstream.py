"""OpenAI's Responses API as a translation target, for models an OpenAI or
Azure channel serves there alone (the gpt-5-codex class refuses Chat
Completions): a request in the neutral form written as a Responses request,
and the channel's Responses events read back as pieces. Clients of every
other API reach such a model this way (``legs``); a Responses client is
passed through as ever.

What Responses cannot say is handled as for any target (T3): stop
sequences would change the answer if dropped, so they rule this channel
out; thinking from earlier turns is dropped (its state is no provider's
that this channel could read), as on Chat Completions. Nothing is stored at
the provider (``store: false``): the client holds the conversation.
"""

from __future__ import annotations

from typing import Any

from core.sse import Event
from providers.base import RequestFacts, dumps, prompt_text_chars
from providers.neutral import (
    CannotServe,
    Conversation,
    Image,
    Message,
    OutputFormat,
    Piece,
    Stop,
    StopReason,
    Text,
    TextDelta,
    ThinkingDelta,
    Tool,
    ToolArguments,
    ToolCall,
    ToolCallStart,
    ToolChoice,
    ToolResult,
)
from providers.translation import Reader

MIN_OUTPUT_TOKENS = 16
INCOMPLETE = {"max_output_tokens": StopReason.LENGTH, "content_filter": StopReason.CONTENT_FILTER}
THINKING_DELTAS = ("response.reasoning_summary_text.delta", "response.reasoning_text.delta")
TEXT_DELTAS = ("response.output_text.delta", "response.refusal.delta")


def encode(conversation: Conversation, model: str) -> RequestFacts:
    if conversation.untranslatable:
        raise CannotServe(conversation.untranslatable[0])
    if conversation.stop:
        raise CannotServe("stop", "Stop sequences cannot be sent to a model served on the Responses API alone.")
    items: list[dict[str, Any]] = []
    for message in conversation.messages:
        items.extend(_assistant_items(message) if message.role == "assistant" else _user_items(message))
    body: dict[str, Any] = {"model": model, "input": items, "stream": True, "store": False}
    if conversation.system:
        body["instructions"] = "\n\n".join(conversation.system)
    if conversation.tools:
        body["tools"] = [_tool(tool) for tool in conversation.tools]
        if conversation.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = conversation.parallel_tool_calls
        if conversation.tool_choice is not None:
            body["tool_choice"] = _tool_choice(conversation.tool_choice)
    if conversation.max_tokens is not None:
        # Responses refuses a cap under 16 (Claude Code probes with max_tokens 1).
        body["max_output_tokens"] = max(conversation.max_tokens, MIN_OUTPUT_TOKENS)
    if conversation.temperature is not None:
        body["temperature"] = conversation.temperature
    if conversation.top_p is not None:
        body["top_p"] = conversation.top_p
    if conversation.output is not None:
        body["text"] = {"format": _output_format(conversation.output)}
    reasoning = conversation.reasoning
    if reasoning is not None and reasoning.enabled:
        body["reasoning"] = {"effort": reasoning.level().value}
    if conversation.user:
        body["user"] = conversation.user
    return RequestFacts(model=model, stream=True, body=body, raw_body=dumps(body),
                        thinking=reasoning is not None and reasoning.enabled,
                        prompt_chars=prompt_text_chars(items) + len(body.get("instructions", "")))


def _user_items(message: Message) -> list[dict[str, Any]]:
    """Tool results first (each answers a call of the turn before), then what the user said."""
    items: list[dict[str, Any]] = []
    said: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ToolResult):
            text = "".join(p.text for p in part.content if isinstance(p, Text))
            items.append({"type": "function_call_output", "call_id": part.call_id, "output": text})
            said.extend(_input_part(p) for p in part.content if isinstance(p, Image))
        elif isinstance(part, Text | Image):
            said.append(_input_part(part))
    if said:
        items.append({"type": "message", "role": "user", "content": said})
    return items


def _assistant_items(message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    text = "".join(p.text for p in message.parts if isinstance(p, Text))
    if text:
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
    items.extend({"type": "function_call", "call_id": p.call_id, "name": p.name, "arguments": p.arguments}
                 for p in message.parts if isinstance(p, ToolCall))
    return items


def _input_part(part: Text | Image) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "input_text", "text": part.text}
    url = part.url if part.url is not None else f"data:{part.media_type};base64,{part.data}"
    return {"type": "input_image", "image_url": url}


def _tool(tool: Tool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "name": tool.name, "parameters": tool.parameters}
    if tool.description:
        out["description"] = tool.description
    return out


def _tool_choice(choice: ToolChoice) -> Any:
    if choice.mode == "tool":
        return {"type": "function", "name": choice.name}
    return choice.mode


def _output_format(output: OutputFormat) -> dict[str, Any]:
    if output.schema is None:
        return {"type": "json_object"}
    spec: dict[str, Any] = {"type": "json_schema", "name": output.name, "schema": output.schema}
    if output.strict:
        spec["strict"] = True
    return spec


class ResponsesReader(Reader):
    """A Responses stream's content as pieces (its usage and errors are the
    ``ResponsesWatcher``'s)."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}  # the stream's output_index -> our tool call index

    def read(self, event: Event) -> list[Piece]:
        data = event.json
        if not isinstance(data, dict):
            return []
        kind = data.get("type") or event.name
        delta = data.get("delta")
        if kind in TEXT_DELTAS:
            return [TextDelta(delta)] if isinstance(delta, str) and delta else []
        if kind in THINKING_DELTAS:
            return [ThinkingDelta(delta)] if isinstance(delta, str) and delta else []
        if kind == "response.output_item.added":
            return self._item_added(data)
        if kind == "response.function_call_arguments.delta":
            index = self.calls.get(data.get("output_index"))  # type: ignore[arg-type]
            return [ToolArguments(index, delta)] if index is not None and isinstance(delta, str) and delta else []
        if kind == "response.completed":
            return [Stop(StopReason.TOOL_USE if self.calls else StopReason.END)]
        if kind == "response.incomplete":
            details = (data.get("response") or {}).get("incomplete_details") or {}
            return [Stop(INCOMPLETE.get(details.get("reason"), StopReason.LENGTH))]
        return []

    def _item_added(self, data: dict[str, Any]) -> list[Piece]:
        item = data.get("item")
        if not isinstance(item, dict) or item.get("type") != "function_call":
            return []
        index = self.calls[data.get("output_index")] = len(self.calls)  # type: ignore[index]
        pieces: list[Piece] = [ToolCallStart(index, str(item.get("call_id") or item.get("id")), str(item.get("name")))]
        if isinstance(item.get("arguments"), str) and item["arguments"]:
            pieces.append(ToolArguments(index, item["arguments"]))
        return pieces
