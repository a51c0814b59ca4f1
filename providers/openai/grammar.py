"""OpenAI's grammar in the registry: its channels addressed with Chat
Completions (or with Responses, for a model served there alone), and its
two client APIs as translation sides."""

from __future__ import annotations

from typing import Any

import orjson

from core.sse import Event
from core.vocabulary import WireGrammar
from providers.apis import CHAT, RESPONSES
from providers.grammar import ClientSide, Grammar, Probe
from providers.kind import Call, Operation
from providers.openai import chat_request, responses_request, responses_upstream
from providers.openai.chat_stream import ChatReader, ChatWriter
from providers.openai.responses_stream import ResponsesWriter
from providers.openai.responses_upstream import ResponsesReader


def _probe(model: str, prompt: str, most: int) -> Call:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                            "max_completion_tokens": most, "stream": True}
    return Call(Operation.CHAT, model, body, orjson.dumps(body))


def _is_end(event: Event) -> bool:
    return event.data_bytes == b"[DONE]"


# One probe for the grammar: the admin's test button asks with Chat Completions.
PROBE = Probe(_probe, _is_end)
GRAMMAR = Grammar(WireGrammar.OPENAI, CHAT, chat_request.encode, ChatReader, PROBE)
# A model an OpenAI or Azure channel serves on the Responses API alone.
ON_RESPONSES = Grammar(WireGrammar.OPENAI, RESPONSES, responses_upstream.encode, ResponsesReader, PROBE)
CLIENTS = (ClientSide(CHAT, chat_request.decode, ChatWriter),
           ClientSide(RESPONSES, responses_request.decode, ResponsesWriter))
