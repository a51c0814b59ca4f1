"""Anthropic's own API as a channel kind (``anthropic``): Messages and its
counting endpoint, with its key in ``x-api-key``; the client's own bytes go
as they are when the grammars match (P6)."""

from __future__ import annotations

import orjson

from core.vocabulary import ChannelKindName, WireGrammar
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



class AnthropicKind(ChannelKind):
    name = ChannelKindName.ANTHROPIC

    def grammar(self, model: str) -> WireGrammar:
        return WireGrammar.ANTHROPIC

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
