"""Every channel kind, one line each: where a channel is and how a request
reaches it (each behind ``providers.kind.ChannelKind``, in its vendor's
folder). Adding a cloud is its module and one line here."""

from providers.anthropic.kind import AnthropicKind
from providers.aws.bedrock import BedrockKind
from providers.google.kind import GeminiKind
from providers.google.vertex import VertexKind
from providers.kind import ChannelKind
from providers.openai.azure import AzureKind
from providers.openai.kind import OpenAIKind

KINDS: dict[str, ChannelKind] = {
    kind.name: kind for kind in (OpenAIKind(), AnthropicKind(), GeminiKind(), AzureKind(), BedrockKind(), VertexKind())
}
