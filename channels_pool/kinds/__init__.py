"""Channel kinds, one module each behind ``base.ChannelKind``: where a
channel is and how a request reaches it. Adding a cloud is one module and
one line here."""

from channels_pool.kinds.azure import AzureKind
from channels_pool.kinds.base import (
    AuthFailed,
    BrokenStream,
    Call,
    ChannelKind,
    ClassifyFailure,
    ConfigError,
    Operation,
    Splitter,
    UpstreamRequest,
)
from channels_pool.kinds.bedrock import BedrockKind
from channels_pool.kinds.vendors import AnthropicKind, GeminiKind, OpenAIKind
from channels_pool.kinds.vertex import VertexKind

KINDS: dict[str, ChannelKind] = {
    kind.name: kind for kind in (OpenAIKind(), AnthropicKind(), GeminiKind(), AzureKind(), BedrockKind(), VertexKind())
}

__all__ = [
    "KINDS", "AuthFailed", "BrokenStream", "Call", "ChannelKind", "ClassifyFailure", "ConfigError", "Operation", "Splitter",
    "UpstreamRequest",
]
