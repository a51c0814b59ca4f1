"""The vendors' own APIs as channel kinds: ``openai``, ``anthropic``, ``gemini``.

Each speaks one grammar at its public endpoint, with its key in a header;
the client's own bytes go as they are when the grammars match (P6).
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import quote

import orjson

from channels_pool.kinds.base import Call, ChannelConfig, ChannelKind, ConfigError, Operation, UpstreamRequest, base
from core.vocabulary import ChannelKindName, EmbeddingGrammar, WireProtocol

# The Messages API version HopBase speaks when a client names none.
ANTHROPIC_VERSION = "2023-06-01"
# What Anthropic's counting endpoint takes of a Messages body (it refuses the rest).
ANTHROPIC_COUNTED_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")


def anthropic_counted(body: dict, model: str | None = None) -> bytes:
    """A Messages body as a counting endpoint takes it."""
    counted = {name: body[name] for name in ANTHROPIC_COUNTED_FIELDS if name in body}
    if model is not None:
        counted["model"] = model
    return orjson.dumps(counted)


def stream_headers(call: Call) -> dict[str, str]:
    return {**call.headers, "content-type": "application/json", "accept": "text/event-stream"}


def json_headers(call: Call) -> dict[str, str]:
    """Headers for a request answered with one JSON body."""
    return {**call.headers, "content-type": "application/json", "accept": "application/json"}


def unsupported(kind: ChannelKind, call: Call) -> ConfigError:
    # Legs only pair a call with a channel of its grammar: reaching here is a bug.
    return ConfigError("protocol", f"a {kind.name} channel cannot take a {call.operation} request")


class OpenAIKind(ChannelKind):
    name = ChannelKindName.OPENAI
    PATHS: ClassVar[dict[Operation, str]] = {Operation.CHAT: "/chat/completions", Operation.RESPONSES: "/responses",
                                             Operation.EMBED: "/embeddings"}

    def grammar(self, model: str) -> WireProtocol:
        return WireProtocol.OPENAI

    def embedding_grammar(self, model: str) -> EmbeddingGrammar:
        return EmbeddingGrammar.OPENAI

    def serves(self, operation: Operation) -> bool:
        return operation is not Operation.COUNT  # OpenAI has no counting endpoint

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        path = self.PATHS.get(call.operation)
        if path is None:
            raise unsupported(self, call)
        headers = json_headers(call) if call.operation is Operation.EMBED else stream_headers(call)
        headers["authorization"] = f"Bearer {channel.secret}"
        return UpstreamRequest(base(channel) + path, headers, call.content)


class AnthropicKind(ChannelKind):
    name = ChannelKindName.ANTHROPIC

    def grammar(self, model: str) -> WireProtocol:
        return WireProtocol.ANTHROPIC

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        if call.operation is Operation.MESSAGES:
            url, headers, content = base(channel) + "/v1/messages", stream_headers(call), call.content
        elif call.operation is Operation.COUNT:
            url, headers = base(channel) + "/v1/messages/count_tokens", json_headers(call)
            content = anthropic_counted(call.body)
        else:
            raise unsupported(self, call)
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
        headers["x-api-key"] = channel.secret
        return UpstreamRequest(url, headers, content)


class GeminiKind(ChannelKind):
    name = ChannelKindName.GEMINI

    def grammar(self, model: str) -> WireProtocol:
        return WireProtocol.GEMINI

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
