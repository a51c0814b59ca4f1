"""Gemini's grammar in the registry, as a channel's and as a client's."""

from __future__ import annotations

import orjson

from core.sse import Event
from core.vocabulary import WireGrammar
from providers.apis import GEMINI
from providers.google import request
from providers.google.gemini import API_VERSION
from providers.google.stream import GeminiReader, GeminiWriter
from providers.grammar import ClientSide, Grammar, Probe
from providers.kind import Call, Operation


def _probe(model: str, prompt: str, most: int) -> Call:
    body = {"contents": [{"role": "user", "parts": [{"text": prompt}]}], "generationConfig": {"maxOutputTokens": most}}
    return Call(Operation.GENERATE, model, body, orjson.dumps(body), route={"version": API_VERSION})


def _is_end(event: Event) -> bool:
    data = event.json
    candidates = data.get("candidates") if isinstance(data, dict) else None
    return isinstance(candidates, list) and any(
        isinstance(candidate, dict) and candidate.get("finishReason") for candidate in candidates)


GRAMMAR = Grammar(WireGrammar.GEMINI, GEMINI, request.encode, GeminiReader, Probe(_probe, _is_end),
                  count_field="totalTokens")
CLIENTS = (ClientSide(GEMINI, request.decode, GeminiWriter),)
