"""Counting a prompt's tokens: Anthropic's ``/v1/messages/count_tokens`` and
Gemini's ``:countTokens``.

The count comes from a channel serving the model, whatever its protocol or
kind, by the counting endpoint behind it (Anthropic's and Gemini's own,
Vertex's for Gemini and for Claude, Bedrock's CountTokens; the request
translated for it as for a generation, and sent as the channel's kind sends
a call: ``Operation.COUNT``). The first channel that answers at all ends
the search: its count, or, if it refused, the estimate (a refusal of the
request would be every channel's). Channels that cannot be reached are
passed over. When no channel can count (OpenAI and Azure have no counting
endpoint, or none answered), the count is estimated from the prompt's
characters and the answer says so (``x-hopbase-estimated``).

Counting is a request like any other to the key's limits (its RPM and
concurrency; a refusal is the caller's 429), and leaves one request log,
``completed`` at zero charge (the providers do not bill it), or
``rejected``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from django.http import HttpResponse

from channels_pool.health import board
from channels_pool.selection import ChannelInfo, directory
from core import loggers
from core.errors import ErrorKind, GatewayError, UpstreamFailure
from core.usage import Usage, estimate_tokens
from core.vocabulary import RequestStatus
from gateway import assembly
from gateway.intake import Call, admit, error_response, parse_facts, read_json
from providers.base import RequestFacts, dumps
from providers.kind import AuthFailed, Operation, UpstreamRequest
from providers.kind import Call as KindCall
from providers.legs import Legs
from providers.neutral import CannotServe
from providers.registry import GRAMMARS

log = logging.getLogger(loggers.COUNTING)
ESTIMATED_HEADER = "x-hopbase-estimated"
COUNT_TIMEOUT = httpx.Timeout(10.0, connect=3.0)


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
    caller, limits = call.caller, assembly.relay().limits
    model = (route or {}).get("model", "")
    try:
        body, raw = read_json(call.request, call.headers)
        route = {**(route or {}), "action": "generateContent"}
        facts = counting.facts(call, body, raw, route)
        model = facts.model
        await admit(caller, facts.model)
        held = await limits.admit_key(caller.key_id, caller.rpm, caller.concurrency)
    except GatewayError as error:
        assembly.recorder.record(caller.finished(call.request_id, call.api.name, RequestStatus.REJECTED, model=model,
                                                error_kind=error.kind.value))
        return error_response(call.api, error)
    try:
        legs = Legs(call.api, facts, call.request_id)
        channels = board.arrange(await directory.candidates(legs.wires(), facts.model, native=call.api.wire))
        tokens, asked = await _counted_by_a_channel(legs, channels, call.headers) if channels else (None, [])
    finally:
        if held:
            limits.release_key(caller.key_id)
    status, error_kind = (RequestStatus.COMPLETED, "") if channels else (RequestStatus.REJECTED, "model_not_found")
    assembly.recorder.record(caller.finished(
        call.request_id, call.api.name, status, model=facts.model, error_kind=error_kind, attempts=len(asked),
        channel_id=asked[-1].id if asked else None, channel_name=asked[-1].name if asked else "",
        usage=Usage(input_reported=True, output_reported=True)))  # counting is not billed
    if not channels:
        return error_response(call.api, GatewayError(ErrorKind.MODEL_NOT_FOUND))
    counted = tokens if tokens is not None else estimate_tokens(facts.prompt_chars)
    response = HttpResponse(dumps(counting.answer(counted)), content_type="application/json")
    if tokens is None:
        response[ESTIMATED_HEADER] = "true"
    return response


async def _counted_by_a_channel(legs: Legs, channels: list[ChannelInfo],
                                client_headers: dict[str, str]) -> tuple[int | None, list[ChannelInfo]]:
    """The count from the first channel that answers (None: it refused, or
    none answered), and the channels asked."""
    http = assembly.relay().http
    asked: list[ChannelInfo] = []
    for channel in channels:
        if not channel.kind.serves(Operation.COUNT):
            continue
        try:
            leg = legs.to(channel)
        except CannotServe:
            continue
        grammar = GRAMMARS[leg.api.wire]
        if grammar.count_field is None:
            continue
        facts = leg.facts
        headers = leg.api.upstream_call(facts, client_headers).headers  # anthropic-version and -beta, say
        call = KindCall(Operation.COUNT, facts.model, facts.body, b"", headers, facts.route)
        request = channel.kind.request(channel, call)
        asked.append(channel)
        try:
            answer = await _asked(channel, request, http)
        except (httpx.HTTPError, AuthFailed) as error:
            log.info("channel %s could not count tokens: %s", channel.name, type(error).__name__)
            continue
        if answer.status_code != 200:
            log.info("channel %s answered a token count with status %s", channel.name, answer.status_code)
            return None, asked
        try:
            body = request.answer(answer.content, answer.headers) if request.answer else answer.content
            return grammar.count(orjson.loads(body)), asked
        except ValueError as error:
            log.info("channel %s answered a token count unreadably: %s", channel.name, error)
            return None, asked
    return None, asked


async def _asked(channel: ChannelInfo, request: UpstreamRequest, http: httpx.AsyncClient) -> httpx.Response:
    """The counting endpoint's answer; a token the cloud no longer takes
    (401) is dropped by the kind and the request made once more with a new one."""
    answer = await _post(request, http)
    if answer.status_code == 401 and request.authorize is not None:
        channel.kind.failure(channel, 401, answer.content, None,
                             lambda status, body, after: UpstreamFailure(f"http_{status}", status))
        answer = await _post(request, http)
    return answer


async def _post(request: UpstreamRequest, http: httpx.AsyncClient) -> httpx.Response:
    if request.authorize is not None:
        await request.authorize(request, http)
    return await http.post(request.url, headers=request.headers, content=request.content, timeout=COUNT_TIMEOUT)
