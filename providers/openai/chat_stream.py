"""OpenAI Chat Completions streams <-> pieces.

``ChatReader`` reads an ``openai`` channel's ``chat.completion.chunk`` events
(called with Chat Completions when translating) as pieces; ``ChatWriter``
writes pieces as the chunks a Chat caller's SDK parses, exactly like
OpenAI's own, or as the whole ``chat.completion`` body.

Both run once per event on the hot path: the reader looks only
at the keys a delta carries; the writer builds each chunk from bytes made
once per answer around the one JSON string that changes.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from core.errors import ErrorKind
from core.sse import Event
from core.usage import Usage
from providers.base import RequestFacts, dumps
from providers.neutral import (
    Piece,
    Stop,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ToolArguments,
    ToolCallStart,
)
from providers.openai.chat import openai_error
from providers.translation import Reader, Writer

STOP_REASONS = {
    "stop": StopReason.END,
    "length": StopReason.LENGTH,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "content_filter": StopReason.CONTENT_FILTER,
}
FINISH_REASONS = {
    StopReason.END: "stop",
    StopReason.STOP_SEQUENCE: "stop",
    StopReason.LENGTH: "length",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.CONTENT_FILTER: "content_filter",
}


class ChatReader(Reader):
    def __init__(self) -> None:
        # The channel's tool call index -> ours, the call's id, arguments held
        # until its name is known (None once started).
        self.calls: dict[int, list[Any]] = {}
        self.started = 0
        # For calls a compatible server sends without an id: unique across turns.
        self.stem = secrets.token_hex(6)

    def read(self, event: Event) -> list[Piece]:
        chunk = event.json
        if not isinstance(chunk, dict):
            return []  # data: [DONE], or nothing a client could use
        choices = chunk.get("choices")
        if not choices:
            return []  # usage only (the watcher reads it), or an error (the watcher's too)
        choice = choices[0]
        delta = choice.get("delta")
        pieces: list[Piece] = []
        if delta:
            text = delta.get("content")
            if text:
                pieces.append(TextDelta(text))
            if len(delta) > 1 or not text:
                self._read_rest(delta, pieces)
        finish = choice.get("finish_reason")
        if finish:
            pieces.append(Stop(STOP_REASONS.get(finish, StopReason.END)))
        return pieces

    def _read_rest(self, delta: dict[str, Any], pieces: list[Piece]) -> None:
        for key in ("refusal", "reasoning_content", "reasoning"):
            text = delta.get(key)
            if text and isinstance(text, str):
                pieces.append(TextDelta(text) if key == "refusal" else ThinkingDelta(text))
        for call in delta.get("tool_calls") or ():
            self._read_call(call, pieces)

    def _read_call(self, call: dict[str, Any], pieces: list[Piece]) -> None:
        key = call.get("index")
        if key is None:
            # Some compatible servers leave out the index: a new id is a new call.
            key = len(self.calls) if call.get("id") or not self.calls else len(self.calls) - 1
        state = self.calls.get(key)
        if state is None:
            state = self.calls[key] = [None, None, []]
        function = call.get("function") or {}
        if call.get("id"):
            state[1] = call["id"]
        fragment = function.get("arguments")
        if state[2] is not None:
            # Not started: a name opens the call, with whatever came before it.
            name = function.get("name")
            if fragment:
                state[2].append(fragment)
            if not name:
                return
            index = state[0] = self.started
            self.started += 1
            pieces.append(ToolCallStart(index, state[1] or f"call_{self.stem}_{index}", name))
            held, state[2] = state[2], None
            if held:
                pieces.append(ToolArguments(index, "".join(held)))
        elif fragment:
            pieces.append(ToolArguments(state[0], fragment))


class ChatWriter(Writer):
    def __init__(self, facts: RequestFacts, model: str, request_id: str) -> None:
        super().__init__(facts, model, request_id)
        options = facts.body.get("stream_options")
        # The same test as ChatWatcher's: a usage chunk only for a caller that asked.
        self.wants_usage = facts.stream and isinstance(options, dict) and options.get("include_usage") is True
        self.id = "chatcmpl-" + request_id.removeprefix("req_")
        self.created = int(time.time())
        self.head_fields: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk",
                                            "created": self.created, "model": model, "system_fingerprint": None}
        # OpenAI puts "usage":null on every chunk once usage was asked for.
        head = {**self.head_fields, "usage": None} if self.wants_usage else self.head_fields
        # Every chunk is this head, one choice, and the tail.
        self.head = b"data: " + dumps(head)[:-1] + b',"choices":['
        self.tail = b"]}\n\n"
        self.text_head = self.head + b'{"index":0,"delta":{"content":'
        self.thinking_head = self.head + b'{"index":0,"delta":{"reasoning_content":'
        self.delta_tail = b'},"logprobs":null,"finish_reason":null}' + self.tail
        self.started = False
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.tools: list[tuple[str, str, list[str]]] = []  # id, name, argument fragments
        self.stop: StopReason | None = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self.head + dumps(choice) + self.tail

    def _preamble(self) -> bytes:
        self.started = True
        return self._chunk({"role": "assistant", "content": "", "refusal": None})

    def write(self, pieces: list[Piece]) -> bytes:
        out = [] if self.started or not pieces else [self._preamble()]
        for piece in pieces:
            if type(piece) is TextDelta:
                if piece.text:
                    if self.assembles:
                        self.text.append(piece.text)
                    out.append(self.text_head + dumps(piece.text) + self.delta_tail)
            elif type(piece) is ThinkingDelta:
                if piece.text:
                    if self.assembles:
                        self.thinking.append(piece.text)
                    out.append(self.thinking_head + dumps(piece.text) + self.delta_tail)
            elif type(piece) is ToolArguments:
                if piece.fragment and piece.index < len(self.tools):
                    self.tools[piece.index][2].append(piece.fragment)
                    call = {"index": piece.index, "function": {"arguments": piece.fragment}}
                    out.append(self._chunk({"tool_calls": [call]}))
            elif type(piece) is ToolCallStart:
                # Calls are numbered in order of appearance, so ours are 0, 1, … too.
                self.tools.append((piece.call_id, piece.name, []))
                call = {"index": len(self.tools) - 1, "id": piece.call_id, "type": "function",
                        "function": {"name": piece.name, "arguments": ""}}
                out.append(self._chunk({"tool_calls": [call]}))
            elif type(piece) is Stop:
                self.stop = piece.reason
            # Thinking signatures and redacted thinking: Chat has nowhere to put them.
        return b"".join(out)

    def finish_reason(self) -> str:
        # A call means the caller must run tools, whatever the channel called its stop.
        if self.tools and self.stop in (None, StopReason.END):
            return "tool_calls"
        return FINISH_REASONS[self.stop] if self.stop is not None else "stop"

    def _empty_arguments(self, out: list[bytes]) -> None:
        # A call without arguments (Anthropic streams none for a tool
        # without parameters) has "{}" for them, as OpenAI's own have.
        for index, (_, _, fragments) in enumerate(self.tools):
            if not fragments:
                fragments.append("{}")
                out.append(self._chunk({"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]}))

    def finish(self, usage: Usage) -> bytes:
        out = [] if self.started else [self._preamble()]
        self._empty_arguments(out)
        out.append(self._chunk({}, self.finish_reason()))
        if self.wants_usage:
            out.append(b"data: " + dumps({**self.head_fields, "choices": [], "usage": chat_usage(usage)}) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def error(self, kind: ErrorKind, message: str) -> bytes:
        _, body = openai_error(kind, message)
        return b"data: " + dumps(body) + b"\n\n"

    def body(self, usage: Usage) -> bytes:
        self._empty_arguments([])
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text) if self.text or not self.tools else None,
            "refusal": None,
            "annotations": [],
        }
        if self.thinking:
            message["reasoning_content"] = "".join(self.thinking)
        if self.tools:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": "".join(args)}}
                for call_id, name, args in self.tools
            ]
        return dumps({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason()}],
            "usage": chat_usage(usage),
            "system_fingerprint": None,
        })


def chat_usage(usage: Usage) -> dict[str, Any]:
    """``Usage`` as Chat reports it: cached input inside the prompt count,
    thinking inside the completion count (B9)."""
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.thinking_tokens},
    }
