"""Azure OpenAI (``azure``, rule C2): OpenAI's grammar at a resource's
endpoint, a deployment as the model, the key in ``api-key``.

Chat Completions (and embeddings) go to the deployment's own path with
``api-version``; Responses goes to the v1 path, the deployment named as
``model``. Azure's
filter-only chunks and its content-filter refusals are the Chat grammar's
to read (``providers.openai.chat``): here only the refusal's status
is told apart, so that it is never counted against the channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

import orjson

from core.errors import UpstreamFailure
from core.vocabulary import ChannelKindName, EmbeddingGrammar, WireGrammar
from providers.kind import (
    Call,
    ChannelConfig,
    ChannelKind,
    ClassifyFailure,
    ConfigError,
    Operation,
    UpstreamRequest,
    base,
    json_headers,
    stream_headers,
    unsupported,
)

# The current GA data-plane version (2024-10-21); an operator may name another.
DEFAULT_API_VERSION = "2024-10-21"
CONTENT_FILTER = "content_filter"


def refused_by_filter(body: bytes) -> bool:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == CONTENT_FILTER


class AzureKind(ChannelKind):
    name = ChannelKindName.AZURE
    settings = ("api_version",)

    def grammar(self, model: str) -> WireGrammar:
        return WireGrammar.OPENAI

    def embedding_grammar(self, model: str) -> EmbeddingGrammar:
        return EmbeddingGrammar.OPENAI

    def serves(self, operation: Operation) -> bool:
        return operation is not Operation.COUNT  # Azure OpenAI has no counting endpoint

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        version = quote(channel.api_version or DEFAULT_API_VERSION, safe="")
        deployment = quote(call.model, safe="")
        if call.operation is Operation.CHAT:
            url = f"{base(channel)}/openai/deployments/{deployment}/chat/completions?api-version={version}"
        elif call.operation is Operation.RESPONSES:
            url = f"{base(channel)}/openai/v1/responses"
        elif call.operation is Operation.EMBED:
            url = f"{base(channel)}/openai/deployments/{deployment}/embeddings?api-version={version}"
        else:
            raise unsupported(self, call)
        headers = json_headers(call) if call.operation is Operation.EMBED else stream_headers(call)
        headers["api-key"] = channel.secret
        return UpstreamRequest(url, headers, call.content)

    def failure(
        self, channel: ChannelConfig, status: int, body: bytes, retry_after: int | None, grammar: ClassifyFailure
    ) -> UpstreamFailure:
        if status == 400 and refused_by_filter(body):
            return UpstreamFailure(CONTENT_FILTER, status, channel_fault=False)
        return grammar(status, body, retry_after)

    def check(self, base_url: str, secret: str, settings: Mapping[str, str]) -> None:
        version = settings.get("api_version", "")
        if version and not all(ch.isalnum() or ch in "-." for ch in version):
            raise ConfigError("api_version", f"{version!r} is not an API version such as {DEFAULT_API_VERSION}")
