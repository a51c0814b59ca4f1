"""Gemini generateContent / streamGenerateContent (P4).

The google-genai SDK parses every line that is not ``data: …`` as JSON, so
keep-alives on Gemini streams are bare blank lines. Clients that ask for the
JSON-array stream form (no ``alt=sse``) get the same chunks framed as an array.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import orjson

from core.errors import ErrorKind, GatewayError, UpstreamFailure, failure_from_status
from core.sse import Event
from core.surcharges import Surcharge, gemini_surcharges
from core.usage import plausible_usage
from core.vocabulary import ApiName, WireGrammar
from providers.base import (
    Api,
    Mark,
    RequestFacts,
    StreamWatcher,
    dumps,
    prompt_text_chars,
    whole_number,
)
from providers.kind import Call, Operation

GEMINI_ERRORS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_KEY: (400, "INVALID_ARGUMENT"),
    ErrorKind.MODEL_NOT_FOUND: (404, "NOT_FOUND"),
    ErrorKind.MALFORMED: (400, "INVALID_ARGUMENT"),
    ErrorKind.CONTENT_FILTER: (400, "INVALID_ARGUMENT"),
    ErrorKind.TOO_LARGE: (413, "INVALID_ARGUMENT"),
    ErrorKind.BALANCE: (429, "RESOURCE_EXHAUSTED"),
    ErrorKind.BUDGET: (429, "RESOURCE_EXHAUSTED"),
    ErrorKind.RATE_LIMIT: (429, "RESOURCE_EXHAUSTED"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "INVALID_ARGUMENT"),
    ErrorKind.UNKNOWN_PATH: (404, "NOT_FOUND"),
    ErrorKind.STATE_NOT_FOUND: (404, "NOT_FOUND"),
    ErrorKind.ALL_BUSY: (429, "RESOURCE_EXHAUSTED"),
    ErrorKind.ALL_FAILED: (503, "UNAVAILABLE"),
    ErrorKind.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorKind.STREAM_BUSY: (429, "RESOURCE_EXHAUSTED"),
    ErrorKind.STREAM_FAILED: (503, "UNAVAILABLE"),
}
# What Gemini's 403 for an unknown cache says ("CachedContent not found (or permission denied)").
# The Gemini API version HopBase calls where no client chose one (a translated
# request, the admin's test button).
API_VERSION = "v1beta"
CACHE_UNKNOWN = b"CachedContent not found"
CONTENT_PARTS = ("functionCall", "function_call", "inlineData", "inline_data", "executableCode", "executable_code")


# Google's own words for a key it does not know: SDKs and LiteLLM key on this
# text (LiteLLM maps only it to AuthenticationError).
KEY_NOT_VALID = "API key not valid. Please pass a valid API key."


def gemini_error(kind: ErrorKind, message: str) -> tuple[int, dict[str, Any]]:
    status, name = GEMINI_ERRORS[kind]
    error: dict[str, Any] = {"code": status, "message": message, "status": name}
    if kind is ErrorKind.INVALID_KEY:
        error["message"] = KEY_NOT_VALID
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
            }
        ]
    return status, {"error": error}


def proto_int(value: Any) -> int | None:
    """A positive integer as Google's JSON takes one: a number (8, 8.0) or a
    string of digits ("8"); None for anything else. Reading only numbers
    would let "candidateCount": "8" reserve one answer while eight are made."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    return whole_number(value)


def snake_or_camel(mapping: Any, camel: str, snake: str) -> Any:
    if not isinstance(mapping, dict):
        return None
    return mapping.get(camel, mapping.get(snake))


def refuses_the_key(body: bytes) -> bool:
    """Whether a Gemini 400 is Google refusing the channel's key: an
    ``ErrorInfo`` detail whose reason is API_KEY_INVALID. The words alone
    prove nothing: Google quotes a client's unknown field names back, so a
    tenant could write them into its own bad request (F2)."""
    if b"API_KEY_INVALID" not in body:
        return False
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    details = error.get("details") if isinstance(error, dict) else None
    return any(isinstance(d, dict) and d.get("reason") == "API_KEY_INVALID"
               and str(d.get("@type", "")).endswith("google.rpc.ErrorInfo") for d in details or ()
               if isinstance(details, list))


class GeminiWatcher(StreamWatcher):
    def __init__(self, facts: RequestFacts) -> None:
        super().__init__(facts)
        self.array_form = facts.route.get("alt") != "sse"
        if self.array_form:
            self.content_type = "application/json"
        self.chunks_sent = 0
        self.parts: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}
        self.candidate: dict[str, Any] = {}

    def mark(self, event: Event) -> int:
        chunk = event.json
        if not isinstance(chunk, dict):
            return Mark.PREAMBLE
        if next(iter(chunk), None) == "error":
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            self.busy_error = error.get("code") == 429 or error.get("status") == "RESOURCE_EXHAUSTED"
            return Mark.ERROR
        self.last = chunk
        usage = chunk.get("usageMetadata")
        if isinstance(usage, dict):
            self._take_usage(usage)
        mark = Mark.PREAMBLE
        for candidate in chunk.get("candidates") or ():
            self.candidate = {**self.candidate, **{k: v for k, v in candidate.items() if k != "content"}}
            for part in (candidate.get("content") or {}).get("parts") or ():
                if self._take_part(part):
                    mark |= Mark.CONTENT
            if candidate.get("finishReason"):
                mark |= Mark.TERMINAL
        if "promptFeedback" in chunk and not chunk.get("candidates"):
            mark |= Mark.TERMINAL
        return mark

    def _take_part(self, part: dict[str, Any]) -> bool:
        text = part.get("text")
        if isinstance(text, str):
            self.sent_chars += len(text)
            if self.assembles:
                previous = self.parts[-1] if self.parts else None
                if previous is not None and "text" in previous and previous.get("thought") == part.get("thought"):
                    previous["text"] += text
                else:
                    self.parts.append(dict(part))
            return bool(text)
        if self.assembles:
            self.parts.append(dict(part))
        return any(key in part for key in CONTENT_PARTS)

    def _take_usage(self, usage: dict[str, Any]) -> None:
        if not plausible_usage(usage):
            self.usage.distrusted = True
            return
        cached = usage.get("cachedContentTokenCount") or 0
        thoughts = usage.get("thoughtsTokenCount") or 0
        u = self.usage
        # What a tool fetched (search results, a URL's page) is input Google bills too.
        tool_use = usage.get("toolUsePromptTokenCount") or 0
        u.input_tokens = max(0, (usage.get("promptTokenCount") or 0) - cached) + tool_use
        u.cache_read_tokens = cached
        u.output_tokens = (usage.get("candidatesTokenCount") or 0) + thoughts
        u.thinking_tokens = thoughts
        u.input_reported = u.output_reported = True

    def client_bytes(self, event: Event) -> bytes:
        if not self.array_form:
            return event.raw
        if not event.data:
            return b""
        separator = b"[" if self.chunks_sent == 0 else b"\n,\r\n"
        self.chunks_sent += 1
        return separator + event.data.encode()

    def end_of_stream(self) -> bytes:
        if not self.array_form:
            return b""
        return b"]" if self.chunks_sent else b"[]"

    def stream_error(self, kind: ErrorKind, message: str) -> bytes:
        _, body = gemini_error(kind, message)
        if self.array_form:
            separator = b"[" if self.chunks_sent == 0 else b"\n,\r\n"
            self.chunks_sent += 1
            return separator + dumps(body)
        return b"data: " + dumps(body) + b"\r\n\r\n"

    def assembled_body(self) -> bytes:
        body = dict(self.last)
        candidate = dict(self.candidate)
        if self.parts or candidate:
            ordered: dict[str, Any] = {"content": {"parts": self.parts, "role": "model"}}
            ordered.update(candidate)
            body["candidates"] = [ordered]
        return dumps(body)


class Gemini(Api):
    name = ApiName.GEMINI
    wire = WireGrammar.GEMINI
    operation = Operation.GENERATE
    keepalive = b"\n"
    watcher = GeminiWatcher
    state_field = "cachedContent"
    model_in_body = False

    def output_cap(self, facts: RequestFacts) -> int | None:
        config = snake_or_camel(facts.body, "generationConfig", "generation_config")
        return proto_int(snake_or_camel(config, "maxOutputTokens", "max_output_tokens"))

    def choices(self, facts: RequestFacts) -> int:
        config = snake_or_camel(facts.body, "generationConfig", "generation_config")
        return proto_int(snake_or_camel(config, "candidateCount", "candidate_count")) or 1

    def surcharges(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Surcharge]:
        return gemini_surcharges(facts.body)

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        if not isinstance(body, dict):
            raise GatewayError(ErrorKind.MALFORMED, "The request body must be a JSON object.")
        contents = self.require_list(body, "contents")
        config = snake_or_camel(body, "generationConfig", "generation_config")
        thinking = snake_or_camel(config, "thinkingConfig", "thinking_config")
        budget = snake_or_camel(thinking, "thinkingBudget", "thinking_budget")
        cached = self._cached_content(body)
        system = snake_or_camel(body, "systemInstruction", "system_instruction")
        return RequestFacts(
            model=route["model"],
            stream=route["action"] == "streamGenerateContent",
            body=body,
            raw_body=raw_body,
            thinking=budget != 0,
            prompt_chars=prompt_text_chars(contents) + prompt_text_chars(system),
            affinity_key=cached,
            route=route,
        )

    @staticmethod
    def _cached_content(body: dict[str, Any]) -> str | None:
        """The cache a request names, whichever spelling it uses (P9). The
        owner check must see what Google will read: a body with both
        spellings, or with one that is not a cache name, is refused."""
        given = [(name, body[name]) for name in ("cachedContent", "cached_content") if name in body]
        if len(given) > 1:
            raise GatewayError(ErrorKind.MALFORMED, "Give `cachedContent` once: this request has both "
                                                    "`cachedContent` and `cached_content`.", param="cachedContent")
        if not given or given[0][1] is None:
            return None
        name, value = given[0]
        if not isinstance(value, str) or not value:
            raise GatewayError(ErrorKind.MALFORMED, f"`{name}` must be the name of a cached content.", param=name)
        return value

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        agent = client_headers.get("user-agent")
        headers = {"user-agent": agent} if agent and agent.isascii() else {}
        return Call(self.operation, facts.model, facts.body, facts.raw_body, headers, facts.route)

    def upstream_failure(self, status: int, body: bytes, retry_after: int | None) -> UpstreamFailure:
        if status == 403 and CACHE_UNKNOWN in body:
            # Gemini answers a cachedContent it does not know (or that is
            # another account's) with 403: the request's fault, not the channel's.
            return UpstreamFailure(f"http_{status}", status, channel_fault=False, about_state=True)
        # Gemini refuses a bad key with a 400; that is the channel's fault.
        return failure_from_status(status, api_key_invalid=status == 400 and refuses_the_key(body),
                                   retry_after=retry_after)

    def error_body(self, error: GatewayError) -> tuple[int, bytes]:
        status, body = gemini_error(error.kind, error.message)
        return status, dumps(body)

    def model_entry(self, model: str, embeds: bool = False) -> dict[str, Any]:
        methods = ["embedContent", "batchEmbedContents"] if embeds else ["generateContent", "streamGenerateContent"]
        return {"name": f"models/{model}", "displayName": model, "supportedGenerationMethods": methods}

    def models_body(self, models: list[str], embedding: Collection[str] = ()) -> bytes:
        return dumps({"models": [self.model_entry(m, m in embedding) for m in models]})
