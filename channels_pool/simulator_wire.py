"""What the upstream simulator says, in each provider's exact wire shape.

The simulator (``channels_pool.simulator``) decides *how* bytes go out:
pacing, splitting, stalls, cut connections. This module decides *which*
bytes: one renderer per protocol turns a ``Script`` (the tokens, tool call
and usage of one answer) into the streaming events, the non-streaming body
and the error bodies that OpenAI Chat, OpenAI Responses, Anthropic Messages
and Gemini send, as recorded in the shared protocols.md.

Renderers are pure: the same script always gives the same bytes, which is
what lets tests compare a relayed stream with the simulator's record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city":"Paris","unit":"celsius"}'
# Three fragments, like a model streams them; joined they are TOOL_ARGUMENTS.
TOOL_FRAGMENTS = ('{"city":', '"Paris",', '"unit":"celsius"}')

# Multi-byte words on purpose: relays that split or re-encode UTF-8 badly,
# or estimate tokens from characters, give themselves away.
TEXT_WORDS = (
    "héllo", "world", "日本語", "🚀", "naïve", "quick", "Привет", "café",
    "données", "über", "स्वागत", "fox", "Ελλάδα", "brown", "🙂", "tschüß",
)
THINKING_WORDS = ("hmm", "considérons", "思考", "🤔", "step", "réfléchir", "then", "Überlegung")

PREAMBLE = "preamble"
TOKEN = "token"
FRAME = "frame"

OVERLOADED = "overloaded"
SERVER = "server"


def deltas(count: int, vocabulary: tuple[str, ...]) -> tuple[str, ...]:
    """Token i of an answer, each carrying the space that separates it from the previous one."""
    return tuple((" " if i else "") + vocabulary[i % len(vocabulary)] for i in range(count))


@dataclass(frozen=True)
class Script:
    """Everything one answer contains; protocol-neutral."""

    model: str
    thinking: tuple[str, ...]
    text: tuple[str, ...]
    tool: bool
    input_tokens: int
    stem: str  # the id every protocol-specific id is built from
    created: int
    cached: int = 0
    cache_write: int = 0
    crlf: bool = False
    include_usage: bool = False  # Chat: stream_options.include_usage
    sse: bool = True  # Gemini: ?alt=sse, else the JSON array form
    request: Mapping[str, Any] | None = None

    @property
    def output_tokens(self) -> int:
        return len(self.thinking) + len(self.text)

    @property
    def full_text(self) -> str:
        return "".join(self.text)

    @property
    def full_thinking(self) -> str:
        return "".join(self.thinking)

    @property
    def has_text_block(self) -> bool:
        # A bare tool call has no text part; an answer with neither still has an empty one.
        return bool(self.text) or not self.tool


@dataclass(frozen=True)
class Event:
    data: bytes
    kind: str  # PREAMBLE, TOKEN (one text or thinking token) or FRAME


def dump(payload: object) -> str:
    # Providers send raw UTF-8, not \u escapes; compact separators like OpenAI.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def simulated_message(status: int | None, kind: str | None = None) -> str:
    what = f"status {status}" if status else f"{kind} error"
    return f"simulated upstream failure ({what}), requested by a [sim] directive"


class Renderer:
    protocol = ""
    request_id_header = "x-request-id"
    stream_content_type = "text/event-stream"
    json_content_type = "application/json"

    def __init__(self, script: Script) -> None:
        self.script = script
        self.nl = "\r\n" if script.crlf else "\n"

    def sse(self, payload: object, event: str | None = None) -> bytes:
        head = f"event: {event}{self.nl}" if event else ""
        return f"{head}data: {dump(payload)}{self.nl}{self.nl}".encode()

    def events(self) -> list[Event]:
        raise NotImplementedError

    def body(self) -> dict[str, Any]:
        raise NotImplementedError

    def stream_error(self, kind: str, events_written: int) -> bytes:
        raise NotImplementedError

    def error_status(self, kind: str) -> int:
        """The HTTP status a non-streaming request gets for a failure of this kind."""
        return 429 if kind == OVERLOADED else 500

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        raise NotImplementedError


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


# --------------------------------------------------------------------------- Anthropic Messages

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

    def events(self) -> list[Event]:
        s = self.script
        out: list[Event] = []

        def add(payload: dict[str, Any], kind: str = FRAME) -> None:
            out.append(Event(self.sse(payload, payload["type"]), kind))

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


# --------------------------------------------------------------------------- Gemini

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
                                 "metadata": {"service": "generativelanguage.googleapis.com"}}]
        return {"error": error}

    def stream_error(self, kind: str, events_written: int) -> bytes:
        payload = self._error(self.error_status(kind), simulated_message(None, kind))
        return self._frame(payload, events_written == 0, True)

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return self._error(status, message or simulated_message(status), reason)


RENDERERS: dict[str, type[Renderer]] = {
    r.protocol: r for r in (ChatRenderer, ResponsesRenderer, AnthropicRenderer, GeminiRenderer)
}


def error_body(protocol: str, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    """An error body for requests that failed before a script could be built."""
    script = Script(model="", thinking=(), text=(), tool=False, input_tokens=0, stem="sim", created=0)
    return RENDERERS[protocol](script).error_body(status, reason, message)


# --------------------------------------------------------------------------- model lists

SIM_MODELS = ("gpt-4o-mini", "claude-sonnet-4-5", "gemini-2.5-flash", "sim-model")


def models_list(flavour: str) -> dict[str, Any]:
    if flavour == "gemini":
        return {"models": [{"name": f"models/{m}", "version": "001", "displayName": m,
                            "inputTokenLimit": 1048576, "outputTokenLimit": 65536,
                            "supportedGenerationMethods": ["generateContent", "countTokens",
                                                           "streamGenerateContent"]} for m in SIM_MODELS]}
    if flavour == "anthropic":
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in SIM_MODELS]
        return {"data": data, "has_more": False, "first_id": SIM_MODELS[0], "last_id": SIM_MODELS[-1]}
    return {"object": "list",
            "data": [{"id": m, "object": "model", "created": 1735689600, "owned_by": "hopbase-sim"}
                     for m in SIM_MODELS]}
