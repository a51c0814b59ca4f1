"""Anthropic Messages streams to and from pieces (T1–T2).

``AnthropicReader`` says what content an Anthropic channel's events carry;
``AnthropicWriter`` writes pieces from a channel of another protocol as the
Messages event grammar the anthropic SDK (and Claude Code) parse:

    message_start, (content_block_start, content_block_delta…, content_block_stop)…,
    message_delta (stop reason and the whole usage), message_stop

Blocks never overlap: a piece of another kind closes the open block first.
"""

from __future__ import annotations

from typing import Any

from core.errors import ErrorKind
from core.sse import Event
from core.usage import Usage
from core.vocabulary import WireGrammar
from providers.anthropic.messages import anthropic_error
from providers.anthropic.request import tool_input
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
from providers.translation import Reader, Writer

ANTHROPIC = WireGrammar.ANTHROPIC
STOP_REASONS_IN = {
    "end_turn": StopReason.END,
    "pause_turn": StopReason.END,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "tool_use": StopReason.TOOL_USE,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "refusal": StopReason.CONTENT_FILTER,
}
STOP_REASONS_OUT = {
    StopReason.END: "end_turn",
    StopReason.LENGTH: "max_tokens",
    StopReason.TOOL_USE: "tool_use",
    StopReason.STOP_SEQUENCE: "stop_sequence",
    StopReason.CONTENT_FILTER: "refusal",
}


class AnthropicReader(Reader):
    def __init__(self) -> None:
        self._tools: dict[int, int] = {}  # block index -> tool call index (0, 1, … in order)

    def read(self, event: Event) -> list[Piece]:
        data = event.json
        if type(data) is not dict:
            return []
        kind = data.get("type")
        if kind == "content_block_delta":
            return self._delta(data)
        if kind == "content_block_start":
            return self._start(data)
        if kind == "message_delta":
            delta = data.get("delta") or {}
            reason = STOP_REASONS_IN.get(delta.get("stop_reason"))
            return [Stop(reason, delta.get("stop_sequence"))] if reason else []
        return []

    def _delta(self, data: dict[str, Any]) -> list[Piece]:
        delta = data.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return [TextDelta(text)] if text else []
        if kind == "thinking_delta":
            text = delta.get("thinking")
            return [ThinkingDelta(text)] if text else []
        if kind == "input_json_delta":
            index = self._tools.get(data.get("index", 0))
            fragment = delta.get("partial_json")
            return [ToolArguments(index, fragment)] if fragment and index is not None else []
        if kind == "signature_delta":
            signature = delta.get("signature")
            return [ThinkingSignature(signature, ANTHROPIC)] if signature else []
        return []  # citations_delta: no other protocol carries them

    def _start(self, data: dict[str, Any]) -> list[Piece]:
        block = data.get("content_block") or {}
        kind = block.get("type")
        if kind == "tool_use":
            index = len(self._tools)
            self._tools[data.get("index", index)] = index
            pieces: list[Piece] = [ToolCallStart(index, block.get("id") or "", block.get("name") or "")]
            if block.get("input"):  # Anthropic streams it after an empty {}; take one that came whole
                pieces.append(ToolArguments(index, dumps(block["input"]).decode()))
            return pieces
        if kind == "redacted_thinking":
            return [RedactedThinking(block.get("data") or "", ANTHROPIC)]
        return []


# -- writer ------------------------------------------------------------------

_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
_TEXT = b',"delta":{"type":"text_delta","text":'
_THINKING = b',"delta":{"type":"thinking_delta","thinking":'
_SIGNATURE = b',"delta":{"type":"signature_delta","signature":'
_JSON = b',"delta":{"type":"input_json_delta","partial_json":'
_END = b"}}\n\n"
_STOP_BLOCK = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":'
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def _event(name: bytes, payload: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + dumps(payload) + b"\n\n"


def _state(origin: WireGrammar, value: str) -> str:
    """Thinking state as an Anthropic client holds it: Anthropic's own as
    it is, another protocol's sealed (``decode`` tells them apart)."""
    return value if origin == ANTHROPIC else seal(origin, value)


def _usage_object(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "output_tokens": usage.output_tokens,
    }
    if usage.thinking_tokens:
        out["output_tokens_details"] = {"thinking_tokens": usage.thinking_tokens}
    return out


class AnthropicWriter(Writer):
    def __init__(self, facts: RequestFacts, model: str, request_id: str) -> None:
        super().__init__(facts, model, request_id)
        self.message_id = "msg_" + request_id.removeprefix("req_")
        thinking = facts.body.get("thinking")
        # The caller asked for signed thinking without its text.
        self._hide_thinking = isinstance(thinking, dict) and thinking.get("display") == "omitted"
        self._started = False
        self._open: str | None = None  # the type of the block open now
        self._index = b""  # its index, as sent
        self._signed = False  # the open thinking block has its signature: more thinking is a new block
        self._blocks: list[dict[str, Any]] = []  # content blocks as started, for the body
        self._parts: list[list[str]] = []  # each block's text, thinking or input JSON fragments
        self._tool_blocks: dict[int, int] = {}  # tool call index -> block index
        self._stop: Stop | None = None
        self._space = ""  # whitespace read while no text block is open, not yet written

    def write(self, pieces: list[Piece]) -> bytes:
        if not pieces:
            return b""
        out: list[bytes] = []
        if not self._started:
            out.append(self._message_start())
        for piece in pieces:
            match piece:
                case TextDelta(text=text):
                    self._text(out, text)
                case ThinkingDelta(text=text):
                    self._thinking(out, text)
                case ToolArguments():
                    self._arguments(out, piece)
                case ToolCallStart():
                    self._tool_call(out, piece)
                case ThinkingSignature():
                    self._signature(out, piece)
                case RedactedThinking(data=data, origin=origin):
                    block = {"type": "redacted_thinking", "data": _state(origin, data)}
                    self._open_block(out, "redacted_thinking", block)
                    self._close(out)
                case Stop():
                    self._stop = piece
        return b"".join(out)

    def _text(self, out: list[bytes], text: str) -> None:
        if not text:
            return  # an empty text block would be refused when the client sends it back
        if self._open != "text":
            # So would a block of whitespace alone ("text content blocks must
            # contain non-whitespace text"), such as a Chat model's "\n\n"
            # before its tool calls: a block starts with its first real text.
            if text.isspace():
                self._space += text
                return
            text, self._space = self._space + text, ""
            self._open_block(out, "text", {"type": "text", "text": ""})
        out.append(_DELTA + self._index + _TEXT + dumps(text) + _END)
        if self.assembles:
            self._parts[-1].append(text)

    def _thinking(self, out: list[bytes], text: str) -> None:
        if not text:
            return
        if self._open != "thinking" or self._signed:
            self._open_block(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
        if not self._hide_thinking:
            out.append(_DELTA + self._index + _THINKING + dumps(text) + _END)
            if self.assembles:
                self._parts[-1].append(text)

    def _signature(self, out: list[bytes], piece: ThinkingSignature) -> None:
        if self._open != "thinking" or self._signed:  # state that came without (or after) its text
            self._open_block(out, "thinking", {"type": "thinking", "thinking": "", "signature": ""})
        signature = _state(piece.origin, piece.signature)
        out.append(_DELTA + self._index + _SIGNATURE + dumps(signature) + _END)
        self._blocks[-1]["signature"] = signature
        self._signed = True

    def _tool_call(self, out: list[bytes], piece: ToolCallStart) -> None:
        call_id = piece.call_id or f"toolu_{self.message_id[4:]}_{piece.index}"
        self._tool_blocks[piece.index] = len(self._blocks)
        self._open_block(out, "tool_use", {"type": "tool_use", "id": call_id, "name": piece.name, "input": {}})

    def _arguments(self, out: list[bytes], piece: ToolArguments) -> None:
        block = self._tool_blocks.get(piece.index)
        if block is None or not piece.fragment:
            return
        # Arguments of an earlier call (interleaved upstream) still go to its
        # own index: the SDK accumulates by index.
        index = self._index if block == len(self._blocks) - 1 and self._open else str(block).encode()
        out.append(_DELTA + index + _JSON + dumps(piece.fragment) + _END)
        if self.assembles:
            self._parts[block].append(piece.fragment)

    def _open_block(self, out: list[bytes], kind: str, block: dict[str, Any]) -> None:
        self._close(out)
        self._space = ""  # whitespace between two other blocks is no block of its own
        index = len(self._blocks)
        self._blocks.append(block)
        self._parts.append([])
        self._open, self._signed, self._index = kind, False, str(index).encode()
        out.append(_event(b"content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": block}))

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            out.append(_STOP_BLOCK + self._index + b"}\n\n")
            self._open = None

    def _message_start(self) -> bytes:
        self._started = True
        # Usage is known only at the end: message_delta carries all of it
        # (the SDK and Claude Code take its input and cache counts over these).
        message = self._message([], None, None, Usage())
        return _event(b"message_start", {"type": "message_start", "message": message})

    def _stop_reason(self) -> tuple[str, str | None]:
        stop = self._stop
        if stop is None or stop.reason in (StopReason.END, StopReason.TOOL_USE):
            # Claude Code goes on to run tools only when told tool_use.
            return ("tool_use" if self._tool_blocks else "end_turn"), None
        sequence = stop.stop_sequence if stop.reason == StopReason.STOP_SEQUENCE else None
        return STOP_REASONS_OUT[stop.reason], sequence

    def finish(self, usage: Usage) -> bytes:
        out = [] if self._started else [self._message_start()]
        self._close(out)
        reason, sequence = self._stop_reason()
        out.append(_event(b"message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                             "usage": _usage_object(usage)}))
        out.append(_MESSAGE_STOP)
        return b"".join(out)

    def error(self, kind: ErrorKind, message: str) -> bytes:
        _, body = anthropic_error(kind, message)
        return _event(b"error", body)

    def body(self, usage: Usage) -> bytes:
        reason, sequence = self._stop_reason()
        return dumps(self._message([self._content(i) for i in range(len(self._blocks))], reason, sequence, usage))

    def _content(self, i: int) -> dict[str, Any]:
        block, parts = self._blocks[i], self._parts[i]
        kind = block["type"]
        if kind == "text":
            return {"type": "text", "text": "".join(parts)}
        if kind == "thinking":
            return {**block, "thinking": "".join(parts)}
        if kind == "tool_use":
            return {**block, "input": tool_input("".join(parts))}
        return block

    def _message(self, content: list[Any], reason: str | None, sequence: str | None, usage: Usage) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": _usage_object(usage)}
