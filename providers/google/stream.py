"""Gemini streams to and from pieces (T1–T2).

``GeminiReader`` reads a Gemini channel's ``streamGenerateContent`` chunks
into pieces. ``GeminiWriter`` writes pieces as the chunks a Gemini client's
SDK parses (``GenerateContentResponse`` each), framed as the client asked:
SSE with ``alt=sse``, else the JSON array form, as ``GeminiWatcher`` frames a
pass-through stream; or assembles them into the whole non-streaming body.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from core.errors import ErrorKind
from core.sse import Event
from core.usage import Usage
from core.vocabulary import WireGrammar
from providers.base import RequestFacts, dumps
from providers.google.contents import field, sealed_signature
from providers.google.gemini import gemini_error
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
)
from providers.translation import Reader, Writer

GEMINI = WireGrammar.GEMINI
STOP_REASONS = {
    "STOP": StopReason.END,
    "MAX_TOKENS": StopReason.LENGTH,
    **dict.fromkeys(("SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"),
                    StopReason.CONTENT_FILTER),
}
# Gemini has no tool-use or stop-sequence reason: both end as STOP.
FINISH_REASONS = {StopReason.LENGTH: "MAX_TOKENS", StopReason.CONTENT_FILTER: "SAFETY"}
NOTHING: list[Piece] = []


class GeminiReader(Reader):
    def __init__(self) -> None:
        self.calls = 0

    def read(self, event: Event) -> list[Piece]:
        chunk = event.json
        if not isinstance(chunk, dict):
            return NOTHING
        candidates = chunk.get("candidates")
        if not candidates:
            feedback = chunk.get("promptFeedback")
            if isinstance(feedback, dict) and feedback.get("blockReason"):
                return [Stop(StopReason.CONTENT_FILTER)]
            return NOTHING
        candidate = candidates[0]
        pieces: list[Piece] = []
        content = candidate.get("content")
        for part in (content.get("parts") or ()) if content else ():
            signature = part.get("thoughtSignature")
            if signature:
                # The state closes the thinking before this part: it goes first.
                pieces.append(ThinkingSignature(signature, GEMINI))
            text = part.get("text")
            if text:
                pieces.append(ThinkingDelta(text) if part.get("thought") else TextDelta(text))
            elif "functionCall" in part:
                self._call(part["functionCall"], pieces)
        reason = candidate.get("finishReason")
        if reason:
            # Gemini ends a turn that calls functions with STOP.
            stop = StopReason.TOOL_USE if reason == "STOP" and self.calls else STOP_REASONS.get(reason, StopReason.END)
            pieces.append(Stop(stop))
        return pieces

    def _call(self, call: dict[str, Any], pieces: list[Piece]) -> None:
        index = self.calls
        self.calls += 1
        call_id = call.get("id") or "call_" + secrets.token_hex(12)
        pieces.append(ToolCallStart(index, call_id, call.get("name") or ""))
        # Gemini sends a call whole: its arguments are one fragment.
        pieces.append(ToolArguments(index, dumps(call.get("args") or {}).decode()))


def usage_metadata(usage: Usage) -> dict[str, int]:
    """Gemini's usage: the prompt counts cached input, the candidates exclude thoughts."""
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    metadata = {"promptTokenCount": prompt, "candidatesTokenCount": usage.output_tokens - usage.thinking_tokens,
                "totalTokenCount": prompt + usage.output_tokens}
    if usage.cache_read_tokens:
        metadata["cachedContentTokenCount"] = usage.cache_read_tokens
    if usage.thinking_tokens:
        metadata["thoughtsTokenCount"] = usage.thinking_tokens
    return metadata


class GeminiWriter(Writer):
    def __init__(self, facts: RequestFacts, model: str, request_id: str) -> None:
        super().__init__(facts, model, request_id)
        self.sse = facts.route.get("alt") == "sse"
        if not self.sse:
            self.content_type = "application/json"
        # Gemini shows thoughts only to a client that asked for them.
        thinking = field(field(facts.body, "generationConfig"), "thinkingConfig")
        self.show_thoughts = bool(field(thinking, "includeThoughts"))
        self.ids = {"modelVersion": model, "responseId": request_id}
        # Every chunk is the same but for its parts: built around them once.
        self._head = b'{"candidates":[{"content":{"parts":'
        self._tail = b',"role":"model"},"index":0}],' + dumps(self.ids)[1:]
        self.chunks_sent = 0
        self.parts: list[dict[str, Any]] = []  # all parts written, for ``body``
        self.signature: str | None = None  # for the next part written
        self.calls: dict[int, tuple[str, str, list[str]]] = {}  # index -> id, name, argument fragments
        self.stop = StopReason.END

    def write(self, pieces: list[Piece]) -> bytes:
        parts: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, TextDelta | ThinkingDelta):
                if self.calls:
                    self._flush_calls(parts)
                if isinstance(piece, TextDelta):
                    self._add(parts, {"text": piece.text})
                elif self.show_thoughts:
                    self._add(parts, {"text": piece.text, "thought": True})
            elif isinstance(piece, ToolArguments):
                call = self.calls.get(piece.index)
                if call is not None:
                    call[2].append(piece.fragment)
            elif isinstance(piece, ToolCallStart):
                self.calls[piece.index] = (piece.call_id, piece.name, [])
            elif isinstance(piece, ThinkingSignature | RedactedThinking):
                if self.calls:  # the calls before it take the signature before them
                    self._flush_calls(parts)
                if isinstance(piece, ThinkingSignature):
                    self._sign(parts, sealed_signature(piece.origin, piece.signature))
                else:
                    self._sign(parts, sealed_signature(piece.origin, piece.data, redacted=True))
            elif isinstance(piece, Stop):
                self.stop = piece.reason
                self._flush_calls(parts)
        if not parts:
            return b""
        if self.assembles:
            self.parts.extend(parts)
        return self._frame(self._head + dumps(parts) + self._tail)

    def _add(self, parts: list[dict[str, Any]], part: dict[str, Any]) -> None:
        if self.signature is not None:
            part["thoughtSignature"] = self.signature
            self.signature = None
        parts.append(part)

    def _sign(self, parts: list[dict[str, Any]], signature: str) -> None:
        if self.signature is not None:
            self._add(parts, {"text": ""})  # one signature per part: the earlier one goes out alone
        self.signature = signature

    def _flush_calls(self, parts: list[dict[str, Any]]) -> None:
        # Gemini sends a function call whole, so it goes out once complete.
        for call_id, name, fragments in self.calls.values():
            self._add(parts, {"functionCall": {"name": name, "args": _arguments(fragments), "id": call_id}})
        self.calls.clear()

    def _close(self) -> list[dict[str, Any]]:
        """The parts still held: unfinished calls, a signature with no part after it."""
        parts: list[dict[str, Any]] = []
        self._flush_calls(parts)
        if self.signature is not None:
            self._add(parts, {"text": ""})
        if self.assembles:
            self.parts.extend(parts)
        return parts

    def _frame(self, payload: bytes) -> bytes:
        if self.sse:
            return b"data: " + payload + b"\r\n\r\n"
        separator = b"[" if self.chunks_sent == 0 else b"\n,\r\n"
        self.chunks_sent += 1
        return separator + payload

    def _response(self, parts: list[dict[str, Any]], usage: Usage) -> bytes:
        candidate = {"content": {"parts": parts, "role": "model"}, "finishReason": FINISH_REASONS.get(self.stop, "STOP"),
                     "index": 0}
        return dumps({"candidates": [candidate], "usageMetadata": usage_metadata(usage), **self.ids})

    def finish(self, usage: Usage) -> bytes:
        # Gemini's last chunk carries an (empty) text part beside its finishReason.
        last = self._frame(self._response(self._close() or [{"text": ""}], usage))
        return last if self.sse else last + b"]"

    def error(self, kind: ErrorKind, message: str) -> bytes:
        _, body = gemini_error(kind, message)
        if self.sse:
            return b"data: " + dumps(body) + b"\r\n\r\n"
        return self._frame(dumps(body))

    def body(self, usage: Usage) -> bytes:
        self._close()
        return self._response(_merged(self.parts), usage)


def _arguments(fragments: list[str]) -> dict[str, Any]:
    try:
        args = orjson.loads("".join(fragments) or "{}")
    except orjson.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def _merged(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of text (or of thought text) as one part each, as Gemini's own
    whole answers have them; a signed part starts a new run."""
    merged: list[dict[str, Any]] = []
    runs: list[list[str] | None] = []
    for part in parts:
        last = merged[-1] if merged else None
        text = part.get("text")
        if (text is not None and last is not None and "text" in last and "thoughtSignature" not in part
                and last.get("thought") == part.get("thought")):
            run = runs[-1]
            if run is not None:
                run.append(text)
                continue
        merged.append(dict(part))
        runs.append([text] if text is not None else None)
    for part, run in zip(merged, runs, strict=True):
        if run is not None and len(run) > 1:
            part["text"] = "".join(run)
    return merged
