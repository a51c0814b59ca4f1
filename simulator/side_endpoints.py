"""The simulator's answers other than generations: model lists, Gemini
cache creation and token counting."""

from __future__ import annotations

import json
import re
import time

from simulator import wire
from simulator.http import Connection, Request
from simulator.records import Record
from simulator.requests import Directives, api_key_of, count_words, gather_directives, prompt_texts

GEMINI_MODELS = re.compile(r"/(v1|v1beta|v1alpha)/models")


class SideEndpoints:
    async def _json(self, conn: Connection, request: Request, status: int, payload: object,
                    record: Record | None = None, extra: dict[str, str] | None = None) -> bool:
        raise NotImplementedError

    async def _models(self, conn: Connection, request: Request, record: Record) -> bool:
        headers = request.headers
        if GEMINI_MODELS.fullmatch(request.path) and request.path != "/v1/models":
            flavour = "gemini"
        elif "x-goog-api-key" in headers or "key" in request.query:
            flavour = "gemini"
        elif "anthropic-version" in headers:
            flavour = "anthropic"
        else:
            flavour = "openai"
        raw = gather_directives(api_key_of(headers, request.query), [], headers.get("x-sim"))
        directives = Directives.from_raw(raw)
        record.directives, record.tag = raw, directives.tag
        if directives.status is not None:
            protocol = {"openai": "chat"}.get(flavour, flavour)
            return await self._json(conn, request, directives.status,
                                    wire.error_body(protocol, directives.status, directives.reason), record)
        record.completed = True
        return await self._json(conn, request, 200, wire.models_list(flavour), record)

    async def _cache(self, conn: Connection, request: Request, record: Record) -> bool:
        """Gemini's cachedContents.create: a named cache of the given contents."""
        try:
            body = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return await self._json(conn, request, 400, wire.error_body("gemini", 400), record)
        texts = prompt_texts("gemini", body)
        raw = gather_directives(api_key_of(request.headers, request.query), texts, request.headers.get("x-sim"))
        record.protocol, record.body, record.directives = "gemini", body, raw
        record.tag, record.model = Directives.from_raw(raw).tag, body["model"].removeprefix("models/")
        record.completed = True
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cache = {
            "name": f"cachedContents/sim{record.id}",
            "model": body["model"],
            "createTime": now,
            "updateTime": now,
            "expireTime": now,
            "usageMetadata": {"totalTokenCount": count_words(texts)},
        }
        return await self._json(conn, request, 200, cache, record)

    async def _count(self, conn: Connection, request: Request, record: Record, gemini_model: str | None) -> bool:
        """Anthropic's count_tokens and Gemini's countTokens: the prompt's words."""
        try:
            body = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            body = None
        body = body if isinstance(body, dict) else {}
        record.protocol, record.body, record.completed = "gemini" if gemini_model else "anthropic", body, True
        record.model = gemini_model or body.get("model")
        texts = prompt_texts(record.protocol, body.get("generateContentRequest", body))
        raw = gather_directives(api_key_of(request.headers, request.query), texts, request.headers.get("x-sim"))
        directives = Directives.from_raw(raw)
        record.directives, record.tag = raw, directives.tag
        if directives.status is not None:  # a misbehaving channel counts no better than it generates
            record.completed = False
            return await self._json(conn, request, directives.status,
                                    wire.error_body(record.protocol, directives.status, directives.reason), record)
        tokens = count_words(texts)
        return await self._json(conn, request, 200, {"totalTokens": tokens} if gemini_model else {"input_tokens": tokens},
                                record)

