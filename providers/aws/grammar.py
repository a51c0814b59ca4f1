"""Bedrock's Converse grammar in the registry: a channel's only (no client calls Converse)."""

from __future__ import annotations

import orjson

from core.sse import Event
from core.vocabulary import WireGrammar
from providers.apis import CONVERSE
from providers.aws import converse_request
from providers.aws.converse_stream import ConverseReader
from providers.grammar import Grammar, Probe
from providers.kind import Call, Operation


def _probe(model: str, prompt: str, most: int) -> Call:
    body = {"messages": [{"role": "user", "content": [{"text": prompt}]}], "inferenceConfig": {"maxTokens": most}}
    return Call(Operation.CONVERSE, model, body, orjson.dumps(body))


def _is_end(event: Event) -> bool:
    return event.name == "metadata"  # usage, after messageStop


GRAMMAR = Grammar(WireGrammar.CONVERSE, CONVERSE, converse_request.encode, ConverseReader, Probe(_probe, _is_end),
                  count_field="inputTokens")
CLIENTS: tuple = ()
