"""Google AI Studio's Gemini API as a channel kind (``gemini``): generation,
caches, embeddings and counting, with its key in ``x-goog-api-key``; the
client's own bytes go as they are when the grammars match (P6)."""

from __future__ import annotations

from urllib.parse import quote

import orjson

from core.vocabulary import ChannelKindName, EmbeddingGrammar, WireGrammar
from providers.kind import (
    Call,
    ChannelConfig,
    ChannelKind,
    Operation,
    UpstreamRequest,
    base,
    json_headers,
    stream_headers,
    unsupported,
)


class GeminiKind(ChannelKind):
    name = ChannelKindName.GEMINI

    def grammar(self, model: str) -> WireGrammar:
        return WireGrammar.GEMINI

    def embedding_grammar(self, model: str) -> EmbeddingGrammar:
        return EmbeddingGrammar.GEMINI

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        version = call.route["version"]
        if call.operation is Operation.GENERATE:
            # The model name is the client's text: escaped whole, so that no
            # `?`, `#`, `/` or `..` in it can change the URL.
            url = f"{base(channel)}/{version}/models/{quote(call.model, safe='')}:streamGenerateContent?alt=sse"
            headers = stream_headers(call)
        elif call.operation is Operation.CACHE:
            url = f"{base(channel)}/{version}/cachedContents"
            headers = {**call.headers, "content-type": "application/json"}
        elif call.operation is Operation.EMBED:
            url = f"{base(channel)}/{version}/models/{quote(call.model, safe='')}:batchEmbedContents"
            headers = json_headers(call)
        elif call.operation is Operation.COUNT:
            url = f"{base(channel)}/{version}/models/{quote(call.model, safe='')}:countTokens"
            headers = json_headers(call)
            body = {k: v for k, v in call.body.items() if k != "model"}
            content = orjson.dumps({"generateContentRequest": {"model": f"models/{call.model}", **body}})
            headers["x-goog-api-key"] = channel.secret
            return UpstreamRequest(url, headers, content)
        else:
            raise unsupported(self, call)
        headers["x-goog-api-key"] = channel.secret
        return UpstreamRequest(url, headers, call.content)
