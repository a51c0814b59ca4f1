"""Gemini cached contents, created through HopBase (P9).

A cache lives in one provider account. Creating one is a request like any
other (same admission, limits, channel choice, breaker and logging, through
the relay), except that the channel answers with one JSON body instead of an
event stream. The cache's name is provider state: the relay remembers which
channel (and tenant) holds it, so a later ``generateContent`` naming it in
``cachedContent`` is pinned there. Its tokens are billed as cache writes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from core.errors import ErrorKind, GatewayError
from core.sse import Event
from core.surcharges import Surcharge
from core.usage import Usage
from providers.base import Mark, RequestFacts, StreamWatcher, dumps, prompt_text_chars
from providers.google.gemini import Gemini, snake_or_camel
from providers.kind import Call, Operation


class CacheWatcher(StreamWatcher):
    """Watches the one body a cache creation is answered with."""

    def __init__(self, facts: RequestFacts) -> None:
        super().__init__(facts)
        self.content_type = "application/json"
        self.body = b""

    def mark(self, event: Event) -> int:
        try:
            cache = _json_object(event.raw)
        except ValueError:
            return Mark.ERROR  # a 200 that is no cache: the channel's failure
        self.body = event.raw
        self.state_id = cache["name"]
        written = (cache.get("usageMetadata") or {}).get("totalTokenCount") or 0
        self.usage = Usage(cache_write_tokens=written, input_reported=True, output_reported=True)
        return Mark.CONTENT | Mark.TERMINAL

    def assembled_body(self) -> bytes:
        return self.body


class GeminiCaches(Gemini):
    watcher = CacheWatcher
    operation = Operation.CACHE
    upstream_streams = False

    def output_cap(self, facts: RequestFacts) -> int | None:
        return 0  # nothing is written back but what the input costs

    def surcharges(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Surcharge]:
        # A hosted tool kept in a cache is used by every request that names the cache, none of which
        # carries it: it could be priced once, at the cache's making, and used for free after. Refused.
        for surcharge in super().surcharges(facts, client_headers):
            raise GatewayError(ErrorKind.MALFORMED, f"`{surcharge.field}`: a cached content cannot hold "
                               f"`{surcharge.feature}`; send the tool with each request instead.",
                               param=surcharge.field)
        return []

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        model = self.require_model(body)
        return RequestFacts(
            model=model.removeprefix("models/"),
            stream=False,
            body=body,
            raw_body=raw_body,
            prompt_chars=prompt_text_chars(body.get("contents")) + prompt_text_chars(
                snake_or_camel(body, "systemInstruction", "system_instruction")
            ),
            route=route,
        )

    def with_model(self, facts: RequestFacts, model: str) -> RequestFacts:
        if model == facts.model:
            return facts
        body = {**facts.body, "model": f"models/{model}"}
        return replace(facts, model=model, body=body, raw_body=dumps(body))

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        return Call(self.operation, facts.model, facts.body, facts.raw_body, route=facts.route)

    def slow_start_applies(self, model: str, facts: RequestFacts) -> bool:
        return False


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON") from None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ValueError("no cache name")
    usage = value.get("usageMetadata")
    if usage is not None and not isinstance(usage, dict):
        raise ValueError("bad usage")
    tokens = (usage or {}).get("totalTokenCount")
    if tokens is not None and (not isinstance(tokens, int) or tokens < 0):
        raise ValueError("bad token count")
    return value
