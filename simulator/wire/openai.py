"""OpenAI's two wire formats: Chat Completions and Responses.

Streaming chunks, whole bodies and error bodies exactly as OpenAI sends them;
both share OpenAI's error shape.
"""

from __future__ import annotations

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

# --------------------------------------------------------------------------- OpenAI Chat

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}


def openai_error(status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    kind, code = _OPENAI_ERRORS.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return {"error": {"message": message or simulated_message(status), "type": kind, "param": None,
                      "code": reason or code}}


def openai_stream_error(kind: str) -> dict[str, Any]:
    kind_type, code = ("requests", "rate_limit_exceeded") if kind == OVERLOADED else ("server_error", "server_error")
    return {"message": simulated_message(None, kind), "type": kind_type, "param": None, "code": code}


class ChatRenderer(Renderer):
    protocol = "chat"

    def usage(self) -> dict[str, Any]:
        s = self.script
        return {
            "prompt_tokens": s.input_tokens,
            "completion_tokens": s.output_tokens,
            "total_tokens": s.input_tokens + s.output_tokens,
            "prompt_tokens_details": {"cached_tokens": s.cached, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": len(s.thinking),
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.script.tool else "stop"

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        s = self.script
        chunk: dict[str, Any] = {
            "id": f"chatcmpl-{s.stem}",
            "object": "chat.completion.chunk",
            "created": s.created,
            "model": s.model,
            "service_tier": "default",
            "system_fingerprint": "fp_hopbase_sim",
            "choices": choices,
        }
        # OpenAI puts "usage":null on every chunk once the client asked for usage.
        if s.include_usage:
            chunk["usage"] = usage
        return chunk

    def _delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self.sse(self._chunk([choice]))

    def events(self) -> list[Event]:
        s = self.script
        out = [Event(self._delta({"role": "assistant", "content": "", "refusal": None}), PREAMBLE)]
        out += [Event(self._delta({"reasoning_content": t}), TOKEN) for t in s.thinking]
        out += [Event(self._delta({"content": t}), TOKEN) for t in s.text]
        if s.tool:
            call = {"index": 0, "id": f"call_{s.stem}", "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": ""}}
            out.append(Event(self._delta({"tool_calls": [call]}), FRAME))
            for fragment in TOOL_FRAGMENTS:
                part = {"index": 0, "function": {"arguments": fragment}}
                out.append(Event(self._delta({"tool_calls": [part]}), FRAME))
        out.append(Event(self._delta({}, self.finish_reason), FRAME))
        if s.include_usage:
            out.append(Event(self.sse(self._chunk([], self.usage())), FRAME))
        out.append(Event(f"data: [DONE]{self.nl}{self.nl}".encode(), FRAME))
        return out

    def body(self) -> dict[str, Any]:
        s = self.script
        message: dict[str, Any] = {
            "role": "assistant",
            "content": s.full_text if s.has_text_block else None,
            "refusal": None,
            "annotations": [],
        }
        if s.thinking:
            message["reasoning_content"] = s.full_thinking
        if s.tool:
            message["tool_calls"] = [{"id": f"call_{s.stem}", "type": "function",
                                      "function": {"name": TOOL_NAME, "arguments": TOOL_ARGUMENTS}}]
        return {
            "id": f"chatcmpl-{s.stem}",
            "object": "chat.completion",
            "created": s.created,
            "model": s.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}],
            "usage": self.usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_hopbase_sim",
        }

    def stream_error(self, kind: str, events_written: int) -> bytes:
        return self.sse({"error": openai_stream_error(kind)})

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return openai_error(status, reason, message)


# --------------------------------------------------------------------------- OpenAI Responses


class ResponsesRenderer(Renderer):
    protocol = "responses"

    def usage(self) -> dict[str, Any]:
        s = self.script
        return {
            "input_tokens": s.input_tokens,
            "input_tokens_details": {"cached_tokens": s.cached},
            "output_tokens": s.output_tokens,
            "output_tokens_details": {"reasoning_tokens": len(s.thinking)},
            "total_tokens": s.input_tokens + s.output_tokens,
        }

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        s = self.script
        req = s.request or {}
        reasoning = req.get("reasoning")
        if not isinstance(reasoning, dict):
            reasoning = {}
        return {
            "id": f"resp_{s.stem}",
            "object": "response",
            "created_at": s.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "max_tool_calls": None,
            "model": s.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": req.get("previous_response_id"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "service_tier": "default",
            "store": req.get("store", True),
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": req.get("tool_choice", "auto"),
            "tools": req.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": req.get("metadata") or {},
        }

    def _items(self) -> list[dict[str, Any]]:
        """The completed output items, in order."""
        s = self.script
        items: list[dict[str, Any]] = []
        if s.thinking:
            items.append({"id": f"rs_{s.stem}", "type": "reasoning",
                          "summary": [{"type": "summary_text", "text": s.full_thinking}]})
        if s.has_text_block:
            items.append({"id": f"msg_{s.stem}", "type": "message", "status": "completed", "role": "assistant",
                          "content": [self._text_part(s.full_text)]})
        if s.tool:
            items.append({"id": f"fc_{s.stem}", "type": "function_call", "status": "completed",
                          "arguments": TOOL_ARGUMENTS, "call_id": f"call_{s.stem}", "name": TOOL_NAME})
        return items

    @staticmethod
    def _text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def events(self) -> list[Event]:
        s = self.script
        out: list[Event] = []

        def add(payload: dict[str, Any], kind: str = FRAME) -> None:
            payload["sequence_number"] = len(out)
            out.append(Event(self.sse(payload, payload["type"]), kind))

        add({"type": "response.created", "response": self.response("in_progress", [], None)}, PREAMBLE)
        add({"type": "response.in_progress", "response": self.response("in_progress", [], None)}, PREAMBLE)
        for index, item in enumerate(self._items()):
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "reasoning":
                add({"type": "response.output_item.added", "output_index": index,
                     "item": {"id": item["id"], "type": "reasoning", "summary": []}})
                part = {"type": "summary_text", "text": ""}
                add({"type": "response.reasoning_summary_part.added", **where, "summary_index": 0, "part": part})
                for t in s.thinking:
                    add({"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": t},
                        TOKEN)
                add({"type": "response.reasoning_summary_text.done", **where, "summary_index": 0,
                     "text": s.full_thinking})
                add({"type": "response.reasoning_summary_part.done", **where, "summary_index": 0,
                     "part": {"type": "summary_text", "text": s.full_thinking}})
            elif item["type"] == "message":
                add({"type": "response.output_item.added", "output_index": index,
                     "item": {**item, "status": "in_progress", "content": []}})
                add({"type": "response.content_part.added", **where, "content_index": 0,
                     "part": self._text_part("")})
                for t in s.text:
                    add({"type": "response.output_text.delta", **where, "content_index": 0, "delta": t,
                         "logprobs": []}, TOKEN)
                add({"type": "response.output_text.done", **where, "content_index": 0, "text": s.full_text,
                     "logprobs": []})
                add({"type": "response.content_part.done", **where, "content_index": 0,
                     "part": self._text_part(s.full_text)})
            else:
                add({"type": "response.output_item.added", "output_index": index,
                     "item": {**item, "status": "in_progress", "arguments": ""}})
                for fragment in TOOL_FRAGMENTS:
                    add({"type": "response.function_call_arguments.delta", **where, "delta": fragment})
                add({"type": "response.function_call_arguments.done", **where, "name": TOOL_NAME,
                     "arguments": TOOL_ARGUMENTS})
            add({"type": "response.output_item.done", "output_index": index, "item": item})
        add({"type": "response.completed", "response": self.body()})
        return out

    def body(self) -> dict[str, Any]:
        return self.response("completed", self._items(), self.usage())

    def stream_error(self, kind: str, events_written: int) -> bytes:
        code = "rate_limit_exceeded" if kind == OVERLOADED else "server_error"
        payload = {"type": "error", "code": code, "message": simulated_message(None, kind), "param": None,
                   "sequence_number": events_written}
        return self.sse(payload, "error")

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return openai_error(status, reason, message)
