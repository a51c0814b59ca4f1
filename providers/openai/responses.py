"""OpenAI Responses (P2, S3)."""

from __future__ import annotations

from typing import Any

from core.errors import ErrorKind
from core.sse import Event
from core.surcharges import Surcharge, openai_surcharges
from core.usage import plausible_usage
from core.vocabulary import ApiName
from providers.base import (
    Mark,
    RequestFacts,
    StreamWatcher,
    dumps,
    forwarded_headers,
    prompt_text_chars,
    whole_number,
)
from providers.kind import Call, Operation
from providers.openai.chat import OpenAIApi, openai_error, openai_error_is_busy

TEXT_DELTAS = {
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta",
}
TOOL_ITEMS = {"function_call", "custom_tool_call"}
TERMINALS = {"response.completed", "response.incomplete"}


class ResponsesWatcher(StreamWatcher):
    def __init__(self, facts: RequestFacts) -> None:
        super().__init__(facts)
        self.response: dict[str, Any] | None = None
        self.sequence = -1

    def mark(self, event: Event) -> int:
        data = event.json
        if not isinstance(data, dict):
            return Mark.PREAMBLE
        kind = data.get("type") or event.name
        if isinstance(data.get("sequence_number"), int):
            self.sequence = data["sequence_number"]
        if kind == "error" or "error" in data and kind != "response.failed":
            self.busy_error = openai_error_is_busy(data.get("error") or data)
            return Mark.ERROR
        if isinstance(data.get("response"), dict):
            self.response = data["response"]
            self.state_id = self.response.get("id") or self.state_id
            usage = self.response.get("usage")
            if isinstance(usage, dict):
                self._take_usage(usage)
        if kind == "response.failed":
            self.busy_error = openai_error_is_busy((self.response or {}).get("error"))
            return Mark.ERROR
        if kind in TERMINALS:
            return Mark.TERMINAL
        if kind in TEXT_DELTAS:
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                self.sent_chars += len(delta)
                return Mark.CONTENT
            return Mark.PREAMBLE
        if kind == "response.output_item.added" and (data.get("item") or {}).get("type") in TOOL_ITEMS:
            return Mark.CONTENT
        return Mark.PREAMBLE

    def _take_usage(self, usage: dict[str, Any]) -> None:
        u = self.usage
        if not plausible_usage(usage):
            u.distrusted = True
            return
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
        u.input_tokens = max(0, (usage.get("input_tokens") or 0) - cached)
        u.cache_read_tokens = cached
        u.output_tokens = usage.get("output_tokens") or 0
        u.thinking_tokens = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
        u.input_reported = u.output_reported = True

    def stream_error(self, kind: ErrorKind, message: str) -> bytes:
        # M4: an `error` event that also holds a top-level `error` object (the
        # openai SDK raises on it), then `response.failed` with the upstream id
        # so the SDK's stream helper sees one consistent response.
        _, body = openai_error(kind, message)
        error = body["error"]
        self.sequence += 1
        error_event = {
            "type": "error",
            "code": error["code"],
            "message": message,
            "param": None,
            "sequence_number": self.sequence,
            "error": error,
        }
        self.sequence += 1
        failed = dict(self.response or {"id": None, "object": "response", "model": self.facts.model, "output": []})
        failed["status"] = "failed"
        failed["error"] = {"code": error["code"], "message": message}
        failed_event = {"type": "response.failed", "sequence_number": self.sequence, "response": failed}
        return (
            b"event: error\ndata: "
            + dumps(error_event)
            + b"\n\nevent: response.failed\ndata: "
            + dumps(failed_event)
            + b"\n\n"
        )

    def assembled_body(self) -> bytes:
        return dumps(self.response or {})


class Responses(OpenAIApi):
    name = ApiName.RESPONSES
    operation = Operation.RESPONSES
    watcher = ResponsesWatcher
    state_field = "previous_response_id"

    def output_cap(self, facts: RequestFacts) -> int | None:
        return whole_number(facts.body.get("max_output_tokens"))

    def surcharges(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Surcharge]:
        return openai_surcharges(facts.body, tools_hosted=True)

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        model = self.require_model(body)
        stream = self.stream_flag(body)
        previous = body.get("previous_response_id")
        reasoning = body.get("reasoning")
        return RequestFacts(
            model=model,
            stream=stream,
            body=body,
            raw_body=raw_body,
            thinking=isinstance(reasoning, dict) and bool(reasoning.get("effort") or reasoning.get("summary")),
            prompt_chars=prompt_text_chars(body.get("input")) + prompt_text_chars(body.get("instructions")),
            affinity_key=previous if isinstance(previous, str) and previous else None,
        )

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        if facts.body.get("stream") is True:
            content = facts.raw_body
        else:
            content = dumps({**facts.body, "stream": True})
        return Call(self.operation, facts.model, facts.body, content, forwarded_headers(client_headers))
