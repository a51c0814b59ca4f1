"""Anthropic Messages: its events, whole bodies and error bodies."""

from __future__ import annotations

import json
from typing import Any

from simulator.wire.common import (
    FRAME,
    OVERLOADED,
    PREAMBLE,
    TOKEN,
    TOOL_ARGUMENTS,
    TOOL_FRAGMENTS,
    TOOL_NAME,
    Event,
    Renderer,
    simulated_message,
)

_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class AnthropicRenderer(Renderer):
    protocol = "anthropic"
    request_id_header = "request-id"

    def usage(self, output_tokens: int) -> dict[str, Any]:
        s = self.script
        # Anthropic's input_tokens excludes cache reads and writes; the three add up to the prompt.
        return {
            "input_tokens": max(s.input_tokens - s.cached - s.cache_write, 0),
            "cache_creation_input_tokens": s.cache_write,
            "cache_read_input_tokens": s.cached,
            "output_tokens": output_tokens,
        }

    @property
    def stop_reason(self) -> str:
        return "tool_use" if self.script.tool else "end_turn"

    @property
    def signature(self) -> str:
        return f"c2ltdWxhdGVk{self.script.stem}"

    def _blocks(self) -> list[dict[str, Any]]:
        s = self.script
        blocks: list[dict[str, Any]] = []
        if s.thinking:
            blocks.append({"type": "thinking", "thinking": s.full_thinking, "signature": self.signature})
        if s.has_text_block:
            blocks.append({"type": "text", "text": s.full_text})
        if s.tool:
            blocks.append({"type": "tool_use", "id": f"toolu_{s.stem}", "name": TOOL_NAME,
                           "input": json.loads(TOOL_ARGUMENTS)})
        return blocks

    def payloads(self) -> list[tuple[dict[str, Any], str]]:
        """Each event's JSON and its kind, in order: what clouds re-frame (Bedrock's event stream)."""
        s = self.script
        out: list[tuple[dict[str, Any], str]] = []

        def add(payload: dict[str, Any], kind: str = FRAME) -> None:
            out.append((payload, kind))

        start = {**self._message([], None), "usage": {**self.usage(1), "service_tier": "standard"}}
        add({"type": "message_start", "message": start}, PREAMBLE)
        add({"type": "ping"}, PREAMBLE)
        for index, block in enumerate(self._blocks()):
            if block["type"] == "thinking":
                add({"type": "content_block_start", "index": index,
                     "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
                for t in s.thinking:
                    add({"type": "content_block_delta", "index": index,
                         "delta": {"type": "thinking_delta", "thinking": t}}, TOKEN)
                add({"type": "content_block_delta", "index": index,
                     "delta": {"type": "signature_delta", "signature": self.signature}})
            elif block["type"] == "text":
                add({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
                for t in s.text:
                    add({"type": "content_block_delta", "index": index,
                         "delta": {"type": "text_delta", "text": t}}, TOKEN)
            else:
                add({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
                for fragment in ("", *TOOL_FRAGMENTS):
                    add({"type": "content_block_delta", "index": index,
                         "delta": {"type": "input_json_delta", "partial_json": fragment}})
            add({"type": "content_block_stop", "index": index})
        add({"type": "message_delta", "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
             "usage": self.usage(s.output_tokens)})
        add({"type": "message_stop"})
        return out

    def events(self) -> list[Event]:
        return [Event(self.sse(payload, payload["type"]), kind) for payload, kind in self.payloads()]

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None) -> dict[str, Any]:
        s = self.script
        return {"id": f"msg_{s.stem}", "type": "message", "role": "assistant", "model": s.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": None}

    def body(self) -> dict[str, Any]:
        usage = {**self.usage(self.script.output_tokens), "service_tier": "standard"}
        return {**self._message(self._blocks(), self.stop_reason), "usage": usage}

    def error_status(self, kind: str) -> int:
        return 529 if kind == OVERLOADED else 500

    def _error(self, kind: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": f"req_{self.script.stem}"}

    def stream_error(self, kind: str, events_written: int) -> bytes:
        error_type = "overloaded_error" if kind == OVERLOADED else "api_error"
        return self.sse(self._error(error_type, simulated_message(None, kind)), "error")

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        kind = _ANTHROPIC_ERRORS.get(status, "invalid_request_error" if status < 500 else "api_error")
        return self._error(kind, message or simulated_message(status))
