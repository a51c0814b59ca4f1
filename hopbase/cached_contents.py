"""Gemini cached contents, created through HopBase (P9).

A cache lives in one provider account. Creating it through HopBase picks a
channel as any request would, and remembers which channel (and tenant) holds
the cache's name; a later ``generateContent`` naming it in ``cachedContent``
is pinned to that channel by the relay. The creation is logged like any
request, its tokens billed as cache writes.
"""

from __future__ import annotations

import httpx
import orjson
from django.http import HttpRequest, HttpResponse

from billing.recorder import recorder
from channels_pool import affinity
from channels_pool.health import board
from channels_pool.selection import directory
from channels_pool.upstream import client
from core.errors import (
    UPSTREAM_REJECTED_MESSAGE,
    ErrorKind,
    GatewayError,
    UpstreamFailure,
)
from core.usage import Usage
from core.vocabulary import RequestStatus
from hopbase.auth import Caller
from hopbase.intake import (
    REQUEST_ID_HEADER,
    admit,
    client_headers,
    error_response,
    identify,
    read_json,
    record_rejection,
)
from hopbase.protocols import GEMINI
from hopbase.relay import new_request_id


async def create(request: HttpRequest, version: str) -> HttpResponse:
    request_id = new_request_id()
    headers = client_headers(request)
    caller = await identify(request, headers)
    if caller is None:
        return error_response(GEMINI, GatewayError(ErrorKind.INVALID_KEY), request_id)
    model = ""
    try:
        body, raw = read_json(request, headers)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise GatewayError(ErrorKind.MALFORMED, "`model` is required and must be a string.")
        model = body["model"].removeprefix("models/")
        await admit(caller, model)
        candidates = board.arrange(await directory.candidates(GEMINI.wire, model))
        if not candidates:
            raise GatewayError(ErrorKind.MODEL_NOT_FOUND)
    except GatewayError as error:
        record_rejection(request_id, GEMINI, caller, model, error)
        return error_response(GEMINI, error, request_id)

    failures: list[UpstreamFailure] = []
    for channel in candidates:
        try:
            answer = await client().post(
                f"{channel.base_url.rstrip('/')}/{version}/cachedContents",
                headers={"x-goog-api-key": channel.secret, "content-type": "application/json"},
                content=raw,
            )
        except httpx.HTTPError:
            failures.append(UpstreamFailure("connect"))
            board.failed(channel.id, "connect")
            continue
        if answer.status_code == 200:
            cache = orjson.loads(answer.content)
            affinity.remember(cache["name"], caller.tenant_id, channel.id)
            board.succeeded(channel.id, None)
            written = (cache.get("usageMetadata") or {}).get("totalTokenCount") or 0
            finish(request_id, caller, model, channel.id, len(failures) + 1, "completed", written)
            response = HttpResponse(answer.content, content_type="application/json")
            response[REQUEST_ID_HEADER] = request_id
            return response
        failure = GEMINI.upstream_failure(answer.status_code, answer.content, None)
        if not failure.channel_fault:
            finish(request_id, caller, model, channel.id, len(failures) + 1, "failed", 0)
            rejected = GatewayError(ErrorKind.MALFORMED, UPSTREAM_REJECTED_MESSAGE)
            return error_response(GEMINI, rejected, request_id)
        failures.append(failure)
        board.failed(channel.id, failure.kind)
    finish(request_id, caller, model, None, len(failures), "failed", 0)
    busy = all(f.busy for f in failures)
    return error_response(GEMINI, GatewayError(ErrorKind.ALL_BUSY if busy else ErrorKind.ALL_FAILED), request_id)


def finish(
    request_id: str, caller: Caller, model: str, channel_id: int | None, attempts: int, status: str, written: int
) -> None:
    usage = Usage(cache_write_tokens=written, input_reported=True, output_reported=True)
    recorder.record(
        caller.finished(
            request_id, GEMINI.name, RequestStatus(status), model=model, channel_id=channel_id, attempts=attempts, usage=usage
        )
    )
