"""Channel kinds, one module each behind ``base.ChannelKind``: where a
channel is and how a request reaches it. Adding a cloud is one module and
one line here."""

from providers.anthropic.kind import AnthropicKind
from providers.aws.bedrock import BedrockKind
from providers.google.kind import GeminiKind
from providers.google.vertex import VertexKind
from providers.kind import (
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
from providers.openai.azure import AzureKind
from providers.openai.kind import OpenAIKind

KINDS: dict[str, ChannelKind] = {
    kind.name: kind for kind in (OpenAIKind(), AnthropicKind(), GeminiKind(), AzureKind(), BedrockKind(), VertexKind())
}

__all__ = [
    "KINDS", "AuthFailed", "BrokenStream", "Call", "ChannelKind", "ClassifyFailure", "ConfigError", "Operation", "Splitter",
    "UpstreamRequest",
]
