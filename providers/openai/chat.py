"""OpenAI Chat Completions (P1, S2)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import orjson

from core.errors import RESPONSES_ONLY, ErrorKind, GatewayError, UpstreamFailure
from core.sse import Event
from core.surcharges import Surcharge, openai_surcharges
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

# Table E for both OpenAI protocols: status, error type, error code.
OPENAI_ERRORS: dict[ErrorKind, tuple[int, str, str | None]] = {
    ErrorKind.INVALID_KEY: (401, "invalid_request_error", "invalid_api_key"),
    ErrorKind.MODEL_NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    ErrorKind.MALFORMED: (400, "invalid_request_error", None),
    ErrorKind.CONTENT_FILTER: (400, "invalid_request_error", "content_filter"),
    ErrorKind.TOO_LARGE: (413, "invalid_request_error", "request_too_large"),
    ErrorKind.BALANCE: (429, "insufficient_quota", "insufficient_quota"),
    ErrorKind.BUDGET: (429, "insufficient_quota", "budget_exceeded"),
    ErrorKind.RATE_LIMIT: (429, "requests", "rate_limit_exceeded"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "invalid_request_error", "method_not_allowed"),
    ErrorKind.UNKNOWN_PATH: (404, "invalid_request_error", "unknown_url"),
    ErrorKind.STATE_NOT_FOUND: (404, "invalid_request_error", "previous_response_not_found"),
    ErrorKind.ALL_BUSY: (429, "rate_limit_exceeded", "rate_limit_exceeded"),
    ErrorKind.ALL_FAILED: (500, "server_error", "server_error"),
    ErrorKind.UNAVAILABLE: (503, "server_error", "server_error"),
    ErrorKind.STREAM_BUSY: (429, "rate_limit_exceeded", "rate_limit_exceeded"),
    ErrorKind.STREAM_FAILED: (500, "server_error", "server_error"),
}

# Delta keys that carry text the client is sent: the answer, a refusal, and
# reasoning (DeepSeek's and OpenRouter's names for it).
REASONING_KEYS = frozenset(("reasoning_content", "reasoning"))
TEXT_KEYS = frozenset(("content", "refusal")) | REASONING_KEYS

BUSY_CODES = {"rate_limit_exceeded", "overloaded", "overloaded_error", "server_overloaded", "slow_down"}


def openai_error(kind: ErrorKind, message: str, param: str | None = None) -> tuple[int, dict[str, Any]]:
    status, error_type, code = OPENAI_ERRORS[kind]
    return status, {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def openai_error_is_busy(error: Any) -> bool:
    if not isinstance(error, dict):
        return False
    return bool({error.get("code"), error.get("type")} & BUSY_CODES)


# OpenAI's refusal of Chat Completions for a model it serves on Responses alone
# ("This model is only supported in v1/responses and not in v1/chat/completions.").
RESPONSES_ONLY_WORDS = b"only supported in v1/responses"


def refuses_chat_for_the_model(body: bytes) -> bool:
    """Whether a 400 is OpenAI's own words about the model, not a client's
    field name quoted back in another refusal (any tenant could otherwise
    turn a shared model over to Responses)."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    message = error.get("message") if isinstance(error, dict) else None
    return isinstance(message, str) and message.startswith("This model is only supported in v1/responses")


class ChatWatcher(StreamWatcher):
    def __init__(self, facts: RequestFacts) -> None:
        super().__init__(facts)
        options = facts.body.get("stream_options")
        self.client_wants_usage = facts.stream and isinstance(options, dict) and options.get("include_usage") is True
        # The chunk a whole answer takes its id, created, model and fingerprint
        # from: the first with choices. Azure opens its streams with a
        # filter-only chunk (no choices, empty id and model), kept only until then.
        self.first: dict[str, Any] | None = None
        self._first_pending = True
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage_obj: dict[str, Any] | None = None

    def mark(self, event: Event) -> int:
        chunk = event.json
        if not isinstance(chunk, dict):
            return Mark.TERMINAL if event.data_bytes == b"[DONE]" else Mark.PREAMBLE
        if "error" in chunk:
            self.busy_error = openai_error_is_busy(chunk["error"])
            return Mark.ERROR
        mark = Mark.PREAMBLE
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._take_usage(usage)
        choices = chunk.get("choices")
        if self._first_pending and (choices or self.first is None):
            self.first = chunk
            self._first_pending = not choices
        if not choices:
            return Mark.DROP if usage and not self.client_wants_usage else mark
        for choice in choices:
            if self._take_choice(choice):
                mark = Mark.CONTENT
        return mark

    def _take_usage(self, usage: dict[str, Any]) -> None:
        self.usage_obj = usage
        if not plausible_usage(usage):
            self.usage.distrusted = True
            return
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
        u = self.usage
        u.input_tokens = max(0, (usage.get("prompt_tokens") or 0) - cached)
        u.cache_read_tokens = cached
        u.output_tokens = usage.get("completion_tokens") or 0
        u.thinking_tokens = reasoning
        u.input_reported = u.output_reported = True

    def _take_choice(self, choice: dict[str, Any]) -> bool:
        index = choice.get("index", 0)
        state = self.choices.get(index)
        if state is None:
            state = self.choices[index] = {
                "role": None, "content": [], "refusal": [], "reasoning": {}, "tools": {}, "finish": None,
            }
        finish = choice.get("finish_reason")
        if finish:
            state["finish"] = finish
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        content = False
        # The keys the delta has (usually one), rather than a lookup of
        # every key a delta may have: this runs for every event.
        for key, value in delta.items():
            if key in TEXT_KEYS:
                if isinstance(value, str) and value:
                    if self.assembles:
                        if key in REASONING_KEYS:
                            state["reasoning"].setdefault(key, []).append(value)
                        else:
                            state[key].append(value)
                    self.sent_chars += len(value)
                    content = True
            elif key == "role":
                if value:
                    state["role"] = value
            elif key == "tool_calls":
                for call in value or ():
                    content = True
                    self._take_call(state, call)
            elif key == "audio" and value:
                content = True
        return content

    def _take_call(self, state: dict[str, Any], call: dict[str, Any]) -> None:
        slot = state["tools"].setdefault(call.get("index", 0), {"id": None, "type": "function", "name": "", "args": []})
        if call.get("id"):
            slot["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            slot["name"] += function["name"]
        if function.get("arguments"):
            if self.assembles:
                slot["args"].append(function["arguments"])
            self.sent_chars += len(function["arguments"])

    def stream_error(self, kind: ErrorKind, message: str) -> bytes:
        _, body = openai_error(kind, message)
        return b"data: " + dumps(body) + b"\n\n"

    def assembled_body(self) -> bytes:
        first = self.first or {}
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            message: dict[str, Any] = {
                "role": state["role"] or "assistant",
                "content": "".join(state["content"]) if state["content"] else None,
                "refusal": "".join(state["refusal"]) if state["refusal"] else None,
                "annotations": [],
            }
            for key, parts in state["reasoning"].items():
                message[key] = "".join(parts)
            if state["tools"]:
                message["tool_calls"] = [
                    {
                        "id": tool["id"],
                        "type": tool["type"],
                        "function": {"name": tool["name"], "arguments": "".join(tool["args"])},
                    }
                    for _, tool in sorted(state["tools"].items())
                ]
            choices.append({"index": index, "message": message, "logprobs": None, "finish_reason": state["finish"]})
        body: dict[str, Any] = {
            "id": first.get("id"),
            "object": "chat.completion",
            "created": first.get("created"),
            "model": first.get("model", self.facts.model),
            "choices": choices,
            "usage": self.usage_obj,
        }
        for key in ("system_fingerprint", "service_tier"):
            if key in first:
                body[key] = first[key]
        return dumps(body)


class OpenAIApi(Api):
    """What both OpenAI protocols share: errors, model lists, bearer auth."""

    wire = WireGrammar.OPENAI

    def error_body(self, error: GatewayError) -> tuple[int, bytes]:
        status, body = openai_error(error.kind, error.message, error.param)
        return status, dumps(body)

    def model_entry(self, model: str, embeds: bool = False) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": 0, "owned_by": "hopbase"}

    def models_body(self, models: list[str], embedding: Collection[str] = ()) -> bytes:
        return dumps({"object": "list", "data": [self.model_entry(m) for m in models]})


class ChatCompletions(OpenAIApi):
    name = ApiName.CHAT
    operation = Operation.CHAT
    watcher = ChatWatcher

    def output_cap(self, facts: RequestFacts) -> int | None:
        return whole_number(facts.body.get("max_completion_tokens")) or whole_number(facts.body.get("max_tokens"))

    def choices(self, facts: RequestFacts) -> int:
        return whole_number(facts.body.get("n")) or 1

    def upstream_failure(self, status: int, body: bytes, retry_after: int | None) -> UpstreamFailure:
        if status == 400 and RESPONSES_ONLY_WORDS in body and refuses_chat_for_the_model(body):
            # The model is served on the Responses API alone (the gpt-5-codex class): not the
            # request's fault nor the channel's; the relay reaches it there (translation.legs).
            return UpstreamFailure(RESPONSES_ONLY, status, channel_fault=False)
        return super().upstream_failure(status, body, retry_after)

    def surcharges(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Surcharge]:
        return openai_surcharges(facts.body, tools_hosted=False)

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        model = self.require_model(body)
        stream = self.stream_flag(body)
        messages = self.require_list(body, "messages")
        return RequestFacts(
            model=model,
            stream=stream,
            body=body,
            raw_body=raw_body,
            thinking=bool(body.get("reasoning_effort")),
            prompt_chars=prompt_text_chars(messages),
        )

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        body = facts.body
        options = body.get("stream_options")
        # The channel always streams (F4) and always reports usage (S2); the
        # client's own bytes go as they are when they already ask for both.
        if body.get("stream") is True and isinstance(options, dict) and options.get("include_usage") is True:
            content = facts.raw_body
        else:
            upstream = dict(body)
            upstream["stream"] = True
            upstream["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
            content = dumps(upstream)
        return Call(self.operation, facts.model, body, content, forwarded_headers(client_headers))
