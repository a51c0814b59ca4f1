"""Counting a prompt's tokens: Anthropic's ``/v1/messages/count_tokens`` and
Gemini's ``:countTokens``.

The count comes from a channel serving the model, whatever its protocol, by
that provider's own counting endpoint (Anthropic and Gemini have one; the
request translated for it as for a generation); when no channel can count
(an OpenAI channel, or every counting channel failing), it is estimated from
the prompt's characters and the answer says so (``x-hopbase-estimated``).
Counting is free at the providers and is not a generation: like model
lists, it leaves no request log and no charge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from django.http import HttpResponse

from channels_pool.health import board
from channels_pool.selection import ChannelInfo, directory
from core.errors import ErrorKind, GatewayError
from core.usage import estimate_tokens
from core.vocabulary import WireProtocol
from hopbase import gateway
from hopbase.intake import Call, admit, error_response, parse_facts, read_json
from hopbase.protocols.base import RequestFacts, dumps
from hopbase.translation.legs import Legs
from hopbase.translation.neutral import CannotServe

log = logging.getLogger("hopbase.counting")
ESTIMATED_HEADER = "x-hopbase-estimated"
COUNT_TIMEOUT = httpx.Timeout(10.0, connect=3.0)
# What Anthropic's counting endpoint takes of a Messages request (it refuses the rest).
ANTHROPIC_COUNTED_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")


@dataclass(frozen=True)
class Counter:
    """A channel protocol's counting endpoint: the request for the facts a
    leg would send it, and the token count in its answer."""

    request: Callable[[ChannelInfo, RequestFacts], tuple[str, dict[str, str], bytes]]
    total: Callable[[Any], int]


def _anthropic_request(channel: ChannelInfo, facts: RequestFacts) -> tuple[str, dict[str, str], bytes]:
    body = {name: facts.body[name] for name in ANTHROPIC_COUNTED_FIELDS if name in facts.body}
    headers = {"x-api-key": channel.secret, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    return channel.base_url.rstrip("/") + "/v1/messages/count_tokens", headers, dumps(body)


def _gemini_request(channel: ChannelInfo, facts: RequestFacts) -> tuple[str, dict[str, str], bytes]:
    model = quote(facts.model, safe="")
    body = {"generateContentRequest": {"model": f"models/{facts.model}", **facts.body}}
    url = f"{channel.base_url.rstrip('/')}/{facts.route.get('version') or 'v1beta'}/models/{model}:countTokens"
    return url, {"x-goog-api-key": channel.secret, "content-type": "application/json"}, dumps(body)


def _count(value: Any, key: str) -> int:
    count = value.get(key) if isinstance(value, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"no {key} in the answer")
    return count


COUNTERS: dict[str, Counter] = {
    WireProtocol.ANTHROPIC: Counter(_anthropic_request, lambda answer: _count(answer, "input_tokens")),
    WireProtocol.GEMINI: Counter(_gemini_request, lambda answer: _count(answer, "totalTokens")),
}


@dataclass(frozen=True)
class CountingApi:
    """A client API's counting endpoint: how its body becomes generation
    facts, and how a count is answered."""

    facts: Callable[[Call, Any, bytes, dict[str, str]], RequestFacts]
    answer: Callable[[int], dict[str, Any]]


def _messages_facts(call: Call, body: Any, raw: bytes, route: dict[str, str]) -> RequestFacts:
    return parse_facts(call.api, body, raw, route)


def _gemini_facts(call: Call, body: Any, raw: bytes, route: dict[str, str]) -> RequestFacts:
    # countTokens takes the contents alone, or a whole generateContentRequest.
    inner = body.get("generateContentRequest") if isinstance(body, dict) else None
    if isinstance(inner, dict):
        inner = {k: v for k, v in inner.items() if k != "model"}
        return parse_facts(call.api, inner, dumps(inner), route)
    return parse_facts(call.api, body, raw, route)


ANTHROPIC_COUNTING = CountingApi(_messages_facts, lambda tokens: {"input_tokens": tokens})
GEMINI_COUNTING = CountingApi(_gemini_facts, lambda tokens: {"totalTokens": tokens})


async def count_tokens(call: Call, counting: CountingApi, route: dict[str, str] | None = None) -> HttpResponse:
    try:
        body, raw = read_json(call.request, call.headers)
        route = {**(route or {}), "action": "generateContent"}
        facts = counting.facts(call, body, raw, route)
        await admit(call.caller, facts.model)
        legs = Legs(call.api, facts, call.request_id)
        channels = board.arrange(await directory.candidates(legs.wires(), facts.model, native=call.api.wire))
        if not channels:
            raise GatewayError(ErrorKind.MODEL_NOT_FOUND)
    except GatewayError as error:
        return error_response(call.api, error)
    tokens = await _counted_by_a_channel(legs, channels)
    counted = tokens if tokens is not None else estimate_tokens(facts.prompt_chars)
    response = HttpResponse(dumps(counting.answer(counted)), content_type="application/json")
    if tokens is None:
        response[ESTIMATED_HEADER] = "true"
    return response


async def _counted_by_a_channel(legs: Legs, channels: list[ChannelInfo]) -> int | None:
    http = gateway.relay().http
    for channel in channels:
        counter = COUNTERS.get(channel.protocol)
        if counter is None:
            continue
        try:
            leg = legs.to(channel)
        except CannotServe:
            continue
        url, headers, content = counter.request(channel, leg.facts)
        try:
            answer = await http.post(url, headers=headers, content=content, timeout=COUNT_TIMEOUT)
            if answer.status_code == 200:
                return counter.total(orjson.loads(answer.content))
            log.info("channel %s answered a token count with status %s", channel.name, answer.status_code)
        except (httpx.HTTPError, ValueError) as error:
            log.info("channel %s could not count tokens: %s", channel.name, type(error).__name__)
    return None
