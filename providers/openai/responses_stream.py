"""A translated answer written for an OpenAI Responses caller (T1–T2).

Pieces from a channel of another protocol become the Responses event grammar
exactly as OpenAI streams it, which the openai SDK's ``responses.stream()``
helper checks strictly (one ``response.created`` first, one response id,
each output item added before its deltas and done before the terminal event,
a rising ``sequence_number``):

    response.created, response.in_progress
    per output item: output_item.added, its part and deltas, output_item.done
    response.completed | response.incomplete   (full output and usage)

Thinking becomes a ``reasoning`` item whose ``encrypted_content`` is the
provider's sealed state, so a caller that keeps no server state (Codex,
``store: false``) hands it back on its next turn and ``responses_request``
routes it to its origin. Thinking that came with no state makes an item
without ``encrypted_content``, kept out of a turn passed through to OpenAI
(``sealed``: OpenAI never issued its id). A call to one of the caller's
freeform (``custom``) tools becomes a ``custom_tool_call`` with the ``input``
string again.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from core.errors import ErrorKind
from core.usage import Usage
from providers.base import RequestFacts, dumps
from providers.neutral import (
    Piece,
    RedactedThinking,
    Stop,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ThinkingSignature,
    ToolArguments,
    ToolCallStart,
    seal,
)
from providers.openai.responses import ResponsesWatcher
from providers.openai.responses_request import REDACTED, namespaced_tools, reasoning_id
from providers.translation import Writer

INCOMPLETE = {StopReason.LENGTH: "max_output_tokens", StopReason.CONTENT_FILTER: "content_filter"}


def responses_usage(usage: Usage) -> dict[str, Any]:
    """B9: cached input inside ``input_tokens`` and told apart in its details."""
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": usage.cache_read_tokens,
                                 "cache_write_tokens": usage.cache_write_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.thinking_tokens},
        "total_tokens": prompt + usage.output_tokens,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _delta_prefix(kind: str, fields: dict[str, Any]) -> bytes:
    """An item's delta event up to its ``delta`` value: each delta then costs
    one string dump (the hot path)."""
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **fields})[:-1] + b',"delta":'


class _Item:
    """One output item while it is open."""

    __slots__ = ("chunks", "custom", "index", "item", "prefix", "summary_open")

    def __init__(self, index: int, item: dict[str, Any], prefix: bytes = b"", custom: bool = False) -> None:
        self.index = index
        self.item = item
        self.chunks: list[str] = []
        self.prefix = prefix
        self.custom = custom
        self.summary_open = False

    @property
    def where(self) -> dict[str, Any]:
        return {"item_id": self.item["id"], "output_index": self.index}


class ResponsesWriter(Writer):
    def __init__(self, facts: RequestFacts, model: str, request_id: str) -> None:
        super().__init__(facts, model, request_id)
        self.stem = request_id.removeprefix("req_")
        self.sequence = -1
        self.started = False
        self.stop: Stop | None = None
        self.output: list[dict[str, Any] | None] = []  # items by output_index, set when done
        self.message: _Item | None = None
        self.reasoning: _Item | None = None
        self.tools: dict[int, _Item] = {}  # open calls by the pieces' tool index
        tools = facts.body.get("tools")
        self.namespaced = namespaced_tools(tools)
        self.custom_tools = {
            tool.get("name") for tool in tools or () if isinstance(tool, dict) and tool.get("type") == "custom"
        } | {flat for flat, (_, _, kind) in self.namespaced.items() if kind == "custom"}
        self.base = self._base_response()

    # -- the stream ------------------------------------------------------------

    def write(self, pieces: list[Piece]) -> bytes:
        if not pieces:
            return b""
        out: list[bytes] = []
        if not self.started:
            self._preamble(out)
        for piece in pieces:
            if isinstance(piece, TextDelta):
                if piece.text:
                    self._text(piece.text, out)
            elif isinstance(piece, ToolArguments):
                self._arguments(piece, out)
            elif isinstance(piece, ThinkingDelta):
                if piece.text:
                    self._thinking(piece.text, out)
            elif isinstance(piece, ToolCallStart):
                self._tool_start(piece, out)
            elif isinstance(piece, ThinkingSignature):
                self._open_reasoning(out).item["encrypted_content"] = seal(piece.origin, piece.signature)
                self._close_reasoning(out)
            elif isinstance(piece, RedactedThinking):
                self._close_reasoning(out)
                self._open_reasoning(out).item["encrypted_content"] = seal(piece.origin, REDACTED + piece.data)
                self._close_reasoning(out)
            elif isinstance(piece, Stop):
                self.stop = piece
        return b"".join(out)

    def finish(self, usage: Usage) -> bytes:
        out: list[bytes] = []
        if not self.started:
            self._preamble(out)
        response = self._final(usage, out)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        out.append(self._event({"type": kind, "response": response}))
        return b"".join(out)

    def error(self, kind: ErrorKind, message: str) -> bytes:
        # The same events the pass-through watcher ends a Responses stream
        # with (M4): `error`, then `response.failed` under this response's id.
        watcher = ResponsesWatcher(self.facts)
        watcher.sequence = self.sequence
        watcher.response = self._response("in_progress", [item for item in self.output if item is not None], None)
        rendered = watcher.stream_error(kind, message)
        self.sequence = watcher.sequence
        return rendered

    def body(self, usage: Usage) -> bytes:
        return dumps(self._final(usage, []))

    # -- lifecycle ---------------------------------------------------------------

    def _base_response(self) -> dict[str, Any]:
        body = self.facts.body
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        text = body.get("text") if isinstance(body.get("text"), dict) else {}
        return {
            "id": f"resp_{self.stem}",
            "object": "response",
            "created_at": int(time.time()),
            "background": False,
            "error": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            # Nothing is kept: the answer cannot be named by a later previous_response_id.
            "store": False,
            "temperature": body.get("temperature", 1.0),
            "text": {"format": text.get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    def _response(self, status: str, output: list[dict[str, Any]], usage: Usage | None) -> dict[str, Any]:
        reason = INCOMPLETE.get(self.stop.reason) if self.stop and status == "incomplete" else None
        return {
            **self.base,
            "status": status,
            "incomplete_details": {"reason": reason} if reason else None,
            "output": output,
            "usage": responses_usage(usage) if usage is not None else None,
        }

    def _preamble(self, out: list[bytes]) -> None:
        self.started = True
        response = self._response("in_progress", [], None)
        out.append(self._event({"type": "response.created", "response": response}))
        out.append(self._event({"type": "response.in_progress", "response": response}))

    def _final(self, usage: Usage, out: list[bytes]) -> dict[str, Any]:
        status = "incomplete" if self.stop and self.stop.reason in INCOMPLETE else "completed"
        self._close_all(out, status)
        return self._response(status, [item for item in self.output if item is not None], usage)

    def _event(self, payload: dict[str, Any]) -> bytes:
        self.sequence += 1
        payload["sequence_number"] = self.sequence
        return b"event: " + payload["type"].encode() + b"\ndata: " + dumps(payload) + b"\n\n"

    def _delta(self, item: _Item, text: str) -> bytes:
        self.sequence += 1
        return item.prefix + dumps(text) + b',"sequence_number":' + str(self.sequence).encode() + b"}\n\n"

    def _add(self, item: dict[str, Any], out: list[bytes]) -> int:
        index = len(self.output)
        self.output.append(None)
        out.append(self._event({"type": "response.output_item.added", "output_index": index, "item": item}))
        return index

    def _done(self, open_item: _Item, out: list[bytes]) -> None:
        self.output[open_item.index] = open_item.item
        out.append(self._event({"type": "response.output_item.done", "output_index": open_item.index,
                                "item": open_item.item}))

    def _close_all(self, out: list[bytes], status: str = "completed") -> None:
        self._close_message(out, status)
        self._close_reasoning(out)
        self._close_tools(out, status)

    # -- message items -----------------------------------------------------------

    def _text(self, text: str, out: list[bytes]) -> None:
        message = self.message
        if message is None:
            self._close_reasoning(out)
            self._close_tools(out)
            item = {"id": f"msg_{self.stem}_{len(self.output)}", "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
            index = self._add(item, out)
            fields = {"item_id": item["id"], "output_index": index, "content_index": 0, "logprobs": []}
            message = self.message = _Item(index, item, _delta_prefix("response.output_text.delta", fields))
            out.append(self._event({"type": "response.content_part.added", **message.where, "content_index": 0,
                                    "part": _text_part("")}))
        message.chunks.append(text)
        out.append(self._delta(message, text))

    def _close_message(self, out: list[bytes], status: str = "completed") -> None:
        message = self.message
        if message is None:
            return
        self.message = None
        text = "".join(message.chunks)
        where = message.where
        out.append(self._event({"type": "response.output_text.done", **where, "content_index": 0, "text": text,
                                "logprobs": []}))
        part = _text_part(text)
        out.append(self._event({"type": "response.content_part.done", **where, "content_index": 0, "part": part}))
        message.item["status"] = status
        message.item["content"] = [part]
        self._done(message, out)

    # -- reasoning items ---------------------------------------------------------

    def _open_reasoning(self, out: list[bytes]) -> _Item:
        reasoning = self.reasoning
        if reasoning is None:
            self._close_message(out)
            self._close_tools(out)
            item = {"id": reasoning_id(self.stem, len(self.output)), "type": "reasoning", "summary": []}
            index = self._add(item, out)
            fields = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            reasoning = self.reasoning = _Item(index, item,
                                               _delta_prefix("response.reasoning_summary_text.delta", fields))
        return reasoning

    def _thinking(self, text: str, out: list[bytes]) -> None:
        reasoning = self._open_reasoning(out)
        if not reasoning.summary_open:
            reasoning.summary_open = True
            out.append(self._event({"type": "response.reasoning_summary_part.added", **reasoning.where,
                                    "summary_index": 0, "part": {"type": "summary_text", "text": ""}}))
        reasoning.chunks.append(text)
        out.append(self._delta(reasoning, text))

    def _close_reasoning(self, out: list[bytes]) -> None:
        reasoning = self.reasoning
        if reasoning is None:
            return
        self.reasoning = None
        if reasoning.summary_open:
            text = "".join(reasoning.chunks)
            where = reasoning.where
            out.append(self._event({"type": "response.reasoning_summary_text.done", **where, "summary_index": 0,
                                    "text": text}))
            part = {"type": "summary_text", "text": text}
            out.append(self._event({"type": "response.reasoning_summary_part.done", **where, "summary_index": 0,
                                    "part": part}))
            reasoning.item["summary"] = [part]
        self._done(reasoning, out)

    # -- tool calls --------------------------------------------------------------

    def _tool_start(self, piece: ToolCallStart, out: list[bytes]) -> None:
        self._close_message(out)
        self._close_reasoning(out)
        self._close_tool(piece.index, out)
        call_id = piece.call_id or f"call_{self.stem}_{piece.index}"
        index = len(self.output)
        # A namespaced tool's call names its namespace and its own name.
        namespace, name, _ = self.namespaced.get(piece.name, (None, piece.name, None))
        named = {"name": name, "namespace": namespace} if namespace else {"name": name}
        if piece.name in self.custom_tools:
            item = {"id": f"ctc_{self.stem}_{index}", "type": "custom_tool_call", "status": "in_progress",
                    "call_id": call_id, **named, "input": ""}
            self._add(item, out)
            self.tools[piece.index] = _Item(index, item, custom=True)
            return
        item = {"id": f"fc_{self.stem}_{index}", "type": "function_call", "status": "in_progress",
                "arguments": "", "call_id": call_id, **named}
        self._add(item, out)
        fields = {"item_id": item["id"], "output_index": index}
        self.tools[piece.index] = _Item(index, item, _delta_prefix("response.function_call_arguments.delta", fields))

    def _arguments(self, piece: ToolArguments, out: list[bytes]) -> None:
        tool = self.tools.get(piece.index)
        if tool is None or not piece.fragment:
            return
        tool.chunks.append(piece.fragment)
        # A freeform tool's input is a string inside the arguments' JSON:
        # it is sent whole when the call ends rather than unescaped piecewise.
        if not tool.custom:
            out.append(self._delta(tool, piece.fragment))

    def _close_tools(self, out: list[bytes], status: str = "completed") -> None:
        for index in list(self.tools):
            self._close_tool(index, out, status)

    def _close_tool(self, index: int, out: list[bytes], status: str = "completed") -> None:
        tool = self.tools.pop(index, None)
        if tool is None:
            return
        item = tool.item
        arguments = "".join(tool.chunks)
        item["status"] = status
        if tool.custom:
            text = _custom_input(arguments)
            if text:
                out.append(self._event({"type": "response.custom_tool_call_input.delta", **tool.where,
                                        "delta": text}))
            out.append(self._event({"type": "response.custom_tool_call_input.done", **tool.where, "input": text}))
            item["input"] = text
        else:
            if not arguments:
                # No arguments streamed (Anthropic sends none for a tool
                # without parameters): "{}", as OpenAI's own calls have.
                arguments = "{}"
                out.append(self._delta(tool, arguments))
            out.append(self._event({"type": "response.function_call_arguments.done", **tool.where,
                                    "name": item["name"], "arguments": arguments}))
            item["arguments"] = arguments
        self._done(tool, out)


def _custom_input(arguments: str) -> str:
    """The ``input`` string of a freeform tool's call (see CUSTOM_TOOL_PARAMETERS);
    arguments of another shape are passed on as they are."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments
