"""Every wire grammar HopBase speaks, one entry each (providers.grammar).
A new grammar is its vendor's folder, its word in core.vocabulary and one
line here."""

from __future__ import annotations

from core.vocabulary import ApiName
from providers.anthropic import grammar as anthropic
from providers.aws import grammar as aws
from providers.google import grammar as google
from providers.grammar import ClientSide, Grammar
from providers.openai import grammar as openai

GRAMMARS: dict[str, Grammar] = {entry.name: entry for entry in (
    openai.GRAMMAR, anthropic.GRAMMAR, google.GRAMMAR, aws.GRAMMAR,
)}
# The client APIs a request may be translated from, to any grammar.
CLIENT_SIDES: dict[ApiName, ClientSide] = {
    side.api.name: side for side in (*openai.CLIENTS, *anthropic.CLIENTS, *google.CLIENTS, *aws.CLIENTS)
}
# A model an OpenAI or Azure channel serves on the Responses API alone.
ON_RESPONSES = openai.ON_RESPONSES
