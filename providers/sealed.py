"""Thinking state sealed for another protocol, taken out of a request that
goes through unchanged.

A client served by a channel of another protocol gets that provider's
thinking state sealed (``neutral.seal``) and sends it back on its next turn.
If that turn is passed through to a channel of the client's own protocol,
the provider would refuse state it did not make: state sealed from the
client's own protocol is unsealed, any other is dropped, and the rest of the
body is left alone. Only bodies that contain a seal are written again, and
Responses bodies with a reasoning item HopBase wrote from thinking that had
no provider state (no ``encrypted_content``): OpenAI would look its id up,
find nothing and refuse the request (with ``store: false``, as Codex sends,
"Item with id 'rs_…' not found"), so such an item is dropped too.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

from core.vocabulary import ApiName, WireGrammar
from providers.base import RequestFacts, dumps
from providers.google.contents import opened_signature
from providers.neutral import SEAL_PREFIX, unseal
from providers.openai.responses_request import WRITTEN_REASONING_ID

SEAL_MARK = b'"' + SEAL_PREFIX.encode()
# Gemini's SDK takes a thoughtSignature as base64 bytes, so a seal handed to
# a Gemini client is base64 too (gemini_contents.sealed_signature).
GEMINI_SEAL_MARK = b'"' + base64.urlsafe_b64encode(SEAL_PREFIX.encode())[:5]


def _own(value: Any, wire: WireGrammar) -> str | None:
    """The provider's own state inside a sealed value of ``wire``; None for
    another protocol's (to drop). Unsealed values are returned as they are."""
    if not isinstance(value, str) or not value.startswith(SEAL_PREFIX):
        return value
    opened = unseal(value)
    return opened[1] if opened is not None and opened[0] == wire else None


def _written_without_state(item: dict[str, Any]) -> bool:
    """A reasoning item HopBase wrote from thinking that had no provider
    state: nothing OpenAI could use, and an id it never issued."""
    item_id = item.get("id")
    return (not item.get("encrypted_content") and isinstance(item_id, str)
            and WRITTEN_REASONING_ID.fullmatch(item_id) is not None)


def _responses(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` itself when there is nothing to take out."""
    items = body.get("input")
    if not isinstance(items, list):
        return body
    kept, changed = [], False
    for item in items:
        if isinstance(item, dict) and item.get("type") == "reasoning":
            state = item.get("encrypted_content")
            if isinstance(state, str) and state.startswith(SEAL_PREFIX):
                changed = True
                state = _own(state, WireGrammar.OPENAI)
                if state is None:
                    continue
                item = {**item, "encrypted_content": state}
            elif _written_without_state(item):
                changed = True
                continue
        kept.append(item)
    return {**body, "input": kept} if changed else body


def _messages(body: dict[str, Any]) -> dict[str, Any]:
    messages = []
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            blocks = []
            for block in content:
                field = {"thinking": "signature", "redacted_thinking": "data"}.get(
                    block.get("type") if isinstance(block, dict) else None)
                if field is not None and field in block:
                    state = _own(block[field], WireGrammar.ANTHROPIC)
                    if state is None:
                        continue
                    block = {**block, field: state}
                blocks.append(block)
            message = {**message, "content": blocks}
        messages.append(message)
    return {**body, "messages": messages}


def _gemini(body: dict[str, Any]) -> dict[str, Any]:
    contents = []
    for content in body.get("contents") or ():
        parts = content.get("parts") if isinstance(content, dict) else None
        if isinstance(parts, list):
            cleaned = []
            for part in parts:
                if isinstance(part, dict):
                    for key in ("thoughtSignature", "thought_signature"):
                        if isinstance(part.get(key), str):
                            opened = opened_signature(part[key])
                            part = {k: v for k, v in part.items() if k != key}
                            if opened.origin == WireGrammar.GEMINI and not opened.redacted and opened.signature:
                                part[key] = opened.signature
                cleaned.append(part)
            content = {**content, "parts": cleaned}
        contents.append(content)
    return {**body, "contents": contents}


CLEANERS = {ApiName.RESPONSES: _responses, ApiName.MESSAGES: _messages, ApiName.GEMINI: _gemini}


def unsealed(api: ApiName, facts: RequestFacts) -> RequestFacts:
    """``facts`` without thinking state sealed from another protocol (nor,
    for Responses, reasoning items HopBase wrote without any state)."""
    clean = CLEANERS.get(api)
    raw = facts.raw_body
    if clean is None or not isinstance(facts.body, dict):
        return facts
    if SEAL_MARK not in raw and GEMINI_SEAL_MARK not in raw and not (api == ApiName.RESPONSES and b'"rs_' in raw):
        return facts
    body = clean(facts.body)
    if body is facts.body:
        return facts
    return replace(facts, body=body, raw_body=dumps(body))
