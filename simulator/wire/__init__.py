"""What the upstream simulator says, in each provider's exact wire shape.

The simulator's server (``simulator.server``) decides *how*
bytes go out: pacing, splitting, stalls, cut connections. This package
decides *which* bytes: one renderer per protocol turns a ``Script`` (the
tokens, tool call and usage of one answer) into the streaming events, the
non-streaming body and the error bodies that OpenAI Chat, OpenAI Responses,
Anthropic Messages and Gemini send, as the official SDKs parse them.

- ``common``: the script, events, vocabularies and the renderer base class;
- ``openai``: Chat Completions and Responses;
- ``anthropic``: Messages;
- ``gemini``: generateContent and streamGenerateContent;
- ``converse``: Amazon Bedrock's Converse, and what every Bedrock answer shares;
- ``clouds``: what Azure, Bedrock and Vertex change in the vendors' grammars.

Renderers are pure: the same script always gives the same bytes, which is
what lets tests compare a relayed stream with the simulator's record.
"""

from __future__ import annotations

from typing import Any

from simulator.wire.anthropic import AnthropicRenderer
from simulator.wire.clouds import (
    AzureChatRenderer,
    AzureResponsesRenderer,
    BedrockAnthropicRenderer,
    VertexAnthropicRenderer,
    VertexGeminiRenderer,
)
from simulator.wire.common import (
    FRAME,
    OVERLOADED,
    PREAMBLE,
    SERVER,
    TEXT_WORDS,
    THINKING_WORDS,
    TOKEN,
    TOOL_ARGUMENTS,
    TOOL_FRAGMENTS,
    TOOL_NAME,
    Event,
    Renderer,
    Script,
    deltas,
    dump,
    simulated_message,
)
from simulator.wire.converse import ConverseRenderer
from simulator.wire.gemini import GeminiRenderer
from simulator.wire.openai import ChatRenderer, ResponsesRenderer

__all__ = [
    "FRAME", "OVERLOADED", "PREAMBLE", "RENDERERS", "SERVER", "SIM_MODELS", "TEXT_WORDS", "THINKING_WORDS", "TOKEN",
    "TOOL_ARGUMENTS", "TOOL_FRAGMENTS", "TOOL_NAME", "AnthropicRenderer", "ChatRenderer", "Event", "GeminiRenderer",
    "Renderer", "ResponsesRenderer", "Script", "deltas", "dump", "error_body", "grammar", "models_list",
    "simulated_message",
]

RENDERERS: dict[str, type[Renderer]] = {
    r.protocol: r for r in (ChatRenderer, ResponsesRenderer, AnthropicRenderer, GeminiRenderer, AzureChatRenderer,
                            AzureResponsesRenderer, BedrockAnthropicRenderer, ConverseRenderer,
                            VertexGeminiRenderer, VertexAnthropicRenderer)
}


def grammar(protocol: str) -> str:
    """The request grammar a protocol's requests are written in (``bedrock-anthropic`` -> ``anthropic``)."""
    renderer = RENDERERS.get(protocol)
    return (renderer.grammar or renderer.protocol) if renderer else protocol


def error_body(protocol: str, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    """An error body for requests that failed before a script could be built."""
    script = Script(model="", thinking=(), text=(), tool=False, input_tokens=0, stem="sim", created=0)
    return RENDERERS[protocol](script).error_body(status, reason, message)


# --------------------------------------------------------------------------- model lists

SIM_MODELS = ("gpt-4o-mini", "claude-sonnet-4-5", "gemini-2.5-flash", "sim-model")


def models_list(flavour: str) -> dict[str, Any]:
    if flavour == "gemini":
        return {"models": [{"name": f"models/{m}", "version": "001", "displayName": m,
                            "inputTokenLimit": 1048576, "outputTokenLimit": 65536,
                            "supportedGenerationMethods": ["generateContent", "countTokens",
                                                           "streamGenerateContent"]} for m in SIM_MODELS]}
    if flavour == "anthropic":
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in SIM_MODELS]
        return {"data": data, "has_more": False, "first_id": SIM_MODELS[0], "last_id": SIM_MODELS[-1]}
    return {"object": "list",
            "data": [{"id": m, "object": "model", "created": 1735689600, "owned_by": "hopbase-sim"}
                     for m in SIM_MODELS]}
