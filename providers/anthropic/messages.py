"""Anthropic Messages (P3, S4)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from core.errors import ErrorKind, GatewayError
from core.sse import Event
from core.surcharges import Surcharge, anthropic_surcharges
from core.usage import plausible_usage
from core.vocabulary import ApiName, WireGrammar
from providers.base import (
    Api,
    Mark,
    RequestFacts,
    StreamWatcher,
    dumps,
    forwarded_headers,
    prompt_text_chars,
    whole_number,
)
from providers.kind import Call, Operation

ANTHROPIC_ERRORS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_KEY: (401, "authentication_error"),
    ErrorKind.MODEL_NOT_FOUND: (404, "not_found_error"),
    ErrorKind.MALFORMED: (400, "invalid_request_error"),
    ErrorKind.CONTENT_FILTER: (400, "invalid_request_error"),
    ErrorKind.TOO_LARGE: (413, "request_too_large"),
    ErrorKind.BALANCE: (400, "invalid_request_error"),
    ErrorKind.BUDGET: (429, "rate_limit_error"),
    ErrorKind.RATE_LIMIT: (429, "rate_limit_error"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    ErrorKind.UNKNOWN_PATH: (404, "not_found_error"),
    ErrorKind.STATE_NOT_FOUND: (404, "not_found_error"),
    ErrorKind.ALL_BUSY: (529, "overloaded_error"),
    ErrorKind.ALL_FAILED: (500, "api_error"),
    ErrorKind.UNAVAILABLE: (503, "api_error"),
    ErrorKind.STREAM_BUSY: (529, "overloaded_error"),
    ErrorKind.STREAM_FAILED: (500, "api_error"),
}
BUSY_TYPES = {"overloaded_error", "rate_limit_error"}
CONTENT_BLOCK_STARTS = {"tool_use", "server_tool_use", "redacted_thinking"}
# Events that are preamble whatever their data says (the event line names
# them, and it decides): not worth parsing.
PLAIN_EVENTS = {"ping", "content_block_stop"}


def anthropic_error(kind: ErrorKind, message: str) -> tuple[int, dict[str, Any]]:
    status, error_type = ANTHROPIC_ERRORS[kind]
    return status, {"type": "error", "error": {"type": error_type, "message": message}}


class MessagesWatcher(StreamWatcher):
    def __init__(self, facts: RequestFacts) -> None:
        super().__init__(facts)
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}

    def mark(self, event: Event) -> int:
        if event.name in PLAIN_EVENTS:
            return Mark.PREAMBLE
        data = event.json
        if not isinstance(data, dict):
            return Mark.PREAMBLE
        kind = event.name or data.get("type")
        if kind == "error":
            self.busy_error = (data.get("error") or {}).get("type") in BUSY_TYPES
            return Mark.ERROR
        if kind == "message_stop":
            return Mark.TERMINAL
        if kind == "message_start":
            self.message = dict(data.get("message") or {})
            self._take_usage(self.message.get("usage") or {})
            return Mark.PREAMBLE
        if kind == "message_delta":
            self.message.update(data.get("delta") or {})
            self._take_usage(data.get("usage") or {})
            return Mark.PREAMBLE
        if kind == "content_block_start":
            block = dict(data.get("content_block") or {})
            self.blocks[data.get("index", len(self.blocks))] = block
            return Mark.CONTENT if block.get("type") in CONTENT_BLOCK_STARTS else Mark.PREAMBLE
        if kind == "content_block_delta":
            return self._take_delta(data.get("index", 0), data.get("delta") or {})
        return Mark.PREAMBLE

    def _take_delta(self, index: int, delta: dict[str, Any]) -> int:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        keep = self.assembles
        if kind == "text_delta":
            text = delta.get("text") or ""
            if keep:
                block["text"] = block.get("text", "") + text
            self.sent_chars += len(text)
            return Mark.CONTENT if text else Mark.PREAMBLE
        if kind == "thinking_delta":
            text = delta.get("thinking") or ""
            if keep:
                block["thinking"] = block.get("thinking", "") + text
            self.sent_chars += len(text)
            return Mark.CONTENT
        if kind == "signature_delta":
            if keep:
                block["signature"] = block.get("signature", "") + (delta.get("signature") or "")
            return Mark.CONTENT
        if kind == "input_json_delta":
            fragment = delta.get("partial_json") or ""
            if keep:
                self.partial_json.setdefault(index, []).append(fragment)
            self.sent_chars += len(fragment)
            return Mark.CONTENT
        if kind == "citations_delta" and keep:
            block.setdefault("citations", []).append(delta.get("citation"))
        return Mark.PREAMBLE

    def _take_usage(self, usage: dict[str, Any]) -> None:
        # message_delta usage is cumulative: it replaces, never adds.
        u = self.usage
        self.message["usage"] = {**(self.message.get("usage") or {}), **usage}
        if not plausible_usage(usage):
            u.distrusted = True
            return
        if "input_tokens" in usage:
            u.input_tokens = usage["input_tokens"] or 0
            u.input_reported = True
        if "cache_read_input_tokens" in usage:
            u.cache_read_tokens = usage["cache_read_input_tokens"] or 0
        if "cache_creation_input_tokens" in usage:
            u.cache_write_tokens = usage["cache_creation_input_tokens"] or 0
        if "output_tokens" in usage:
            u.output_tokens = usage["output_tokens"] or 0
            u.output_reported = True
        details = usage.get("output_tokens_details")
        if isinstance(details, dict) and "thinking_tokens" in details:
            u.thinking_tokens = details["thinking_tokens"] or 0

    def stream_error(self, kind: ErrorKind, message: str) -> bytes:
        _, body = anthropic_error(kind, message)
        return b"event: error\ndata: " + dumps(body) + b"\n\n"

    def assembled_body(self) -> bytes:
        content = []
        for index in sorted(self.blocks):
            block = dict(self.blocks[index])
            if index in self.partial_json:
                raw = "".join(self.partial_json[index])
                try:
                    block["input"] = json.loads(raw) if raw else {}
                except ValueError:
                    block["input"] = {}
            content.append(block)
        message = dict(self.message)
        message["content"] = content
        return dumps(message)


class Messages(Api):
    name = ApiName.MESSAGES
    wire = WireGrammar.ANTHROPIC
    operation = Operation.MESSAGES
    watcher = MessagesWatcher

    def output_cap(self, facts: RequestFacts) -> int | None:
        return whole_number(facts.body.get("max_tokens"))

    def surcharges(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Surcharge]:
        return anthropic_surcharges(facts.body, facts.raw_body)

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        model = self.require_model(body)
        stream = self.stream_flag(body)
        messages = self.require_list(body, "messages")
        thinking = body.get("thinking")
        return RequestFacts(
            model=model,
            stream=stream,
            body=body,
            raw_body=raw_body,
            thinking=isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"),
            prompt_chars=prompt_text_chars(messages) + prompt_text_chars(body.get("system")),
        )

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        content = facts.raw_body if facts.body.get("stream") is True else dumps({**facts.body, "stream": True})
        return Call(self.operation, facts.model, facts.body, content, forwarded_headers(client_headers))

    def error_body(self, error: GatewayError) -> tuple[int, bytes]:
        status, body = anthropic_error(error.kind, error.message)
        return status, dumps(body)

    def model_entry(self, model: str, embeds: bool = False) -> dict[str, Any]:
        return {"type": "model", "id": model, "display_name": model, "created_at": "2025-01-01T00:00:00Z"}

    def models_body(self, models: list[str], embedding: Collection[str] = ()) -> bytes:
        return dumps(
            {
                "data": [self.model_entry(m) for m in models],
                "has_more": False,
                "first_id": models[0] if models else None,
                "last_id": models[-1] if models else None,
            }
        )
