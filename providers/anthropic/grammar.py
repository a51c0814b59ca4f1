"""Anthropic's Messages grammar in the registry, as a channel's and as a client's."""

from __future__ import annotations

import orjson

from core.sse import Event
from core.vocabulary import WireGrammar
from providers.anthropic import request
from providers.anthropic.stream import AnthropicReader, AnthropicWriter
from providers.apis import MESSAGES
from providers.grammar import ClientSide, Grammar, Probe
from providers.kind import Call, Operation


def _probe(model: str, prompt: str, most: int) -> Call:
    body = {"model": model, "max_tokens": most, "messages": [{"role": "user", "content": prompt}], "stream": True}
    return Call(Operation.MESSAGES, model, body, orjson.dumps(body))


def _is_end(event: Event) -> bool:
    data = event.json
    return (event.name or (data.get("type") if isinstance(data, dict) else None)) == "message_stop"


GRAMMAR = Grammar(WireGrammar.ANTHROPIC, MESSAGES, request.encode, AnthropicReader, Probe(_probe, _is_end),
                  count_field="input_tokens")
CLIENTS = (ClientSide(MESSAGES, request.decode, AnthropicWriter),)
