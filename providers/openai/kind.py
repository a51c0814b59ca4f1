"""OpenAI's own API as a channel kind (``openai``): Chat Completions, Responses
and embeddings at its public endpoint, with its key as a bearer token; the
client's own bytes go as they are when the grammars match (P6)."""

from __future__ import annotations

from typing import ClassVar

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


class OpenAIKind(ChannelKind):
    name = ChannelKindName.OPENAI
    PATHS: ClassVar[dict[Operation, str]] = {Operation.CHAT: "/chat/completions", Operation.RESPONSES: "/responses",
                                             Operation.EMBED: "/embeddings"}

    def grammar(self, model: str) -> WireGrammar:
        return WireGrammar.OPENAI

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
