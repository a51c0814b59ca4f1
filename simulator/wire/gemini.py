"""Gemini: server-sent events (``alt=sse``) or the JSON array stream, whole bodies and Google's error bodies."""

from __future__ import annotations

import json
from typing import Any

from simulator.wire.common import (
    FRAME,
    TOKEN,
    TOOL_ARGUMENTS,
    TOOL_NAME,
    Event,
    Renderer,
    Script,
    dump,
    simulated_message,
)

_GEMINI_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class GeminiRenderer(Renderer):
    protocol = "gemini"
    json_content_type = "application/json; charset=UTF-8"
    service = "generativelanguage.googleapis.com"  # named in an error's details

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        if not script.sse:
            self.stream_content_type = self.json_content_type

    def usage(self, final: bool) -> dict[str, Any]:
        s = self.script
        usage: dict[str, Any] = {"promptTokenCount": s.input_tokens}
        if final:
            usage["candidatesTokenCount"] = len(s.text)
        # Google repeats a prompt-only usage on every chunk; the last chunk's is the one that counts.
        usage["totalTokenCount"] = s.input_tokens + (s.output_tokens if final else 0)
        if s.cached:
            usage["cachedContentTokenCount"] = s.cached
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": s.input_tokens}]
        if s.cached:
            usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": s.cached}]
        if final and s.thinking:
            usage["thoughtsTokenCount"] = len(s.thinking)
        return usage

    def _chunk(self, parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if final:
            candidate["finishReason"] = "STOP"
        candidate["index"] = 0
        return {"candidates": [candidate], "usageMetadata": self.usage(final),
                "modelVersion": self.script.model, "responseId": self.script.stem}

    def _frame(self, payload: dict[str, Any], first: bool, last: bool) -> bytes:
        if self.script.sse:
            return f"data: {dump(payload)}{self.nl}{self.nl}".encode()
        # The JSON array form Google sends without alt=sse.
        return (("[" if first else "\n,\r\n") + dump(payload) + ("\n]" if last else "")).encode()

    def _tool_part(self) -> dict[str, Any]:
        return {"functionCall": {"name": TOOL_NAME, "args": json.loads(TOOL_ARGUMENTS)}}

    def events(self) -> list[Event]:
        s = self.script
        chunks: list[tuple[dict[str, Any], str]] = []
        chunks += [(self._chunk([{"text": t, "thought": True}], False), TOKEN) for t in s.thinking]
        chunks += [(self._chunk([{"text": t}], False), TOKEN) for t in s.text]
        final_part = self._tool_part() if s.tool else {"text": ""}
        chunks.append((self._chunk([final_part], True), FRAME))
        last = len(chunks) - 1
        return [Event(self._frame(payload, i == 0, i == last), kind) for i, (payload, kind) in enumerate(chunks)]

    def body(self) -> dict[str, Any]:
        s = self.script
        parts: list[dict[str, Any]] = []
        if s.thinking:
            parts.append({"text": s.full_thinking, "thought": True})
        if s.has_text_block:
            parts.append({"text": s.full_text})
        if s.tool:
            parts.append(self._tool_part())
        candidate = {"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}
        return {"candidates": [candidate], "usageMetadata": self.usage(True),
                "modelVersion": s.model, "responseId": s.stem}

    def _error(self, status: int, message: str, reason: str | None = None) -> dict[str, Any]:
        # "error" must stay the first key: genai only raises for chunks starting with {"error":
        error: dict[str, Any] = {"code": status, "message": message,
                                 "status": _GEMINI_STATUSES.get(status, "UNKNOWN")}
        if reason:
            error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                                 "domain": "googleapis.com",
                                 "metadata": {"service": self.service}}]
        return {"error": error}

    def stream_error(self, kind: str, events_written: int) -> bytes:
        payload = self._error(self.error_status(kind), simulated_message(None, kind))
        return self._frame(payload, events_written == 0, True)

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return self._error(status, message or simulated_message(status), reason)
