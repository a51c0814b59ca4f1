"""The front door: from a Django request to a relayed reply.

key -> caller (auth, in ``authorized``) -> body checks -> protocol facts ->
model allowed, priced, balance left -> relay -> HTTP response. Every refusal
is an error in the caller's API format (table E), and every refusal after
the key is known is recorded as ``rejected`` (P8).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from billing.balances import balances
from billing.pricing import prices
from channels_pool.selection import directory
from core.client_address import client_address
from core.errors import ErrorKind, GatewayError
from core.vocabulary import ApiName, RequestStatus
from gateway import assembly, key_usage
from gateway.auth import Caller, key_from_request, keys
from gateway.auth_throttle import THROTTLED_MESSAGE, failures
from gateway.body_keys import repeated_key
from gateway.metrics import refusals_total
from gateway.relay.run import new_request_id
from gateway.reply import Reply, error_reply
from providers.base import Api, RequestFacts, dumps

REQUEST_ID_HEADER = "x-hopbase-request-id"
SPOOL_FULL_MESSAGE = "The gateway cannot record requests right now. Please retry shortly."
SPOOL_FULL_RETRY_AFTER = 10
# A byte value, not b"_": on Python 3.11 a bytes needle makes "in" raise and
# clear a TypeError before it searches (core.sse says more).
UNDERSCORE = ord("_")
# Requests with an unknown key are counted (per process), not logged (P8).
_unknown_keys = 0


def unknown_key_count() -> int:
    return _unknown_keys


@dataclass(frozen=True)
class Call:
    """An API request whose key is known, and the API it is answered in."""

    request: HttpRequest
    request_id: str
    headers: dict[str, str]
    caller: Caller
    api: Api


EntryView = Callable[..., Awaitable[HttpResponse]]


def authorized(api: Api | Callable[[HttpRequest], Api]) -> Callable[[EntryView], EntryView]:
    """An API entry point: the view gets a ``Call`` (request id, headers, the
    caller) instead of the bare request; an unknown key is refused in the
    API's format before the view runs. ``api`` may be chosen per request."""

    def decorate(view: EntryView) -> EntryView:
        @csrf_exempt
        @functools.wraps(view)
        async def entry(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            chosen = api if isinstance(api, Api) else api(request)
            request_id = new_request_id()
            headers = client_headers(request)
            try:
                caller = await identify(request, headers, chosen)
                if caller is None:
                    response = error_response(chosen, GatewayError(ErrorKind.INVALID_KEY))
                else:
                    key_usage.note(caller.key_id, datetime.now(UTC))
                    response = await view(Call(request, request_id, headers, caller, chosen), **kwargs)
            except GatewayError as error:
                # D3: the database did not answer and nothing known does (a
                # key never seen, say): 503 in the caller's format, not "no
                # such key". Or the address has failed too often: 429.
                response = error_response(chosen, error)
            response[REQUEST_ID_HEADER] = request_id
            return response

        return entry

    return decorate


def client_headers(request: HttpRequest) -> dict[str, str]:
    """The request's headers by lower-case name, as Django reads them: a
    repeated one joined with commas, one whose name has an underscore left
    out (it could pass for its hyphenated twin behind a proxy). Read from
    the ASGI scope's list where there is one: Django's ``request.headers``
    rebuilds every name from ``META`` (about 1 % of a request's CPU)."""
    scope = getattr(request, "scope", None)
    if scope is None:
        return {name.lower(): value for name, value in request.headers.items()}
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        if UNDERSCORE in raw_name:
            continue
        name, value = raw_name.decode("latin1").lower(), raw_value.decode("latin1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def to_response(reply: Reply) -> HttpResponse | StreamingHttpResponse:
    if reply.chunks is not None:
        response: HttpResponse | StreamingHttpResponse = StreamingHttpResponse(
            reply.chunks, status=reply.status, content_type=reply.content_type
        )
        if reply.abandon is not None:
            # Run by response.close(), which the API handler always calls.
            response._resource_closers.append(reply.abandon)
        # Called by the API handler when the client falls too far behind.
        response.too_slow = reply.too_slow
        # The API handler sends the parts as they are: bytes already, they
        # need none of Django's per-part layer (streaming_content).
        response.parts = reply.chunks
    else:
        response = HttpResponse(reply.body, status=reply.status, content_type=reply.content_type)
    for name, value in reply.headers.items():
        response[name] = value
    if reply.status >= 400:
        quiet(response)
    return response


def quiet(response: HttpResponse) -> HttpResponse:
    """One of HopBase's own answers (a refusal, table E): it has its request
    line already (billing.recorder), so Django is not to log it again as a
    server error."""
    response._has_been_logged = True
    return response


def error_response(api: Api, error: GatewayError) -> HttpResponse:
    return to_response(error_reply(api, error))


async def identify(request: HttpRequest, headers: dict[str, str], api: Api) -> Caller | None:
    """The caller, or None for no such key (a failed authentication, counted
    against the client's address). Raises ``GatewayError`` (429) while the
    address is over its limit of failures, unless the key is one this
    process already knows is live (gateway.auth_throttle)."""
    global _unknown_keys
    # ?key= only where Gemini's SDK sends it: elsewhere no key rides in a URL.
    secret = key_from_request(headers, request.GET.get("key") if api.name == ApiName.GEMINI else None)
    if failures.blocking():
        retry_after = failures.retry_after(client_address(request))
        if retry_after is not None and not (secret and keys.knows(secret)):
            _unknown_keys += 1
            raise GatewayError(ErrorKind.RATE_LIMIT, THROTTLED_MESSAGE, retry_after=retry_after)
    caller = await keys.authenticate(secret) if secret else None
    if caller is None:
        _unknown_keys += 1
        await failures.failed(client_address(request))
    return caller


def read_json(request: HttpRequest, headers: dict[str, str]) -> tuple[Any, bytes]:
    if request.method != "POST":
        raise GatewayError(ErrorKind.METHOD_NOT_ALLOWED, f"Method {request.method} is not allowed here; use POST.")
    content_type = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise GatewayError(ErrorKind.MALFORMED, "The request body must be JSON (Content-Type: application/json).")
    limit = settings.HOPBASE_MAX_BODY_BYTES
    declared = headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise GatewayError(ErrorKind.TOO_LARGE, f"The request body exceeds {limit} bytes.")
    raw = request.body
    if len(raw) > limit:
        raise GatewayError(ErrorKind.TOO_LARGE, f"The request body exceeds {limit} bytes.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise GatewayError(ErrorKind.MALFORMED, "The request body is not valid JSON.") from None
    # One reading of the body: what is billed and routed is what the provider reads.
    repeated = repeated_key(raw, body)
    if repeated is not None:
        raise GatewayError(ErrorKind.MALFORMED, f"The request body repeats the key {repeated!r}.", param=repeated)
    return body, raw


async def admit(caller: Caller, model: str) -> None:
    """May this caller use this model now? Raises the refusal if not."""
    if not caller.allows(model):
        raise GatewayError(ErrorKind.MODEL_NOT_FOUND)
    if not await prices.is_priced(model):
        # Nothing unpriced is ever served: it could not be billed.
        raise GatewayError(ErrorKind.MODEL_NOT_FOUND, "The model is not available: it has no price yet.")
    if await balances.exhausted(caller.tenant_id):
        raise GatewayError(ErrorKind.BALANCE)


def parse_facts(api: Api, body: Any, raw: bytes, route: dict[str, str]) -> RequestFacts:
    try:
        return api.parse(body, raw, route)
    except GatewayError:
        raise
    except (RecursionError, TypeError, ValueError, AttributeError):
        # A body shaped in a way no check foresaw (absurd nesting, a field
        # of the wrong type deep inside) is malformed, not a server error.
        raise GatewayError(ErrorKind.MALFORMED, "The request body has an unexpected shape.") from None


async def serve(call: Call, route: dict[str, str] | None = None) -> HttpResponse:
    """Serve one generation request (or a Gemini cache creation, or embeddings)."""
    model = (route or {}).get("model", "")
    try:
        if assembly.recorder.spool.full:
            # Nothing may be served that could not be recorded (D2); and the
            # refusal itself is counted, not recorded: recording it would
            # grow the spool it is refused for, without bound.
            refusals_total.labels("spool_full").inc()
            full = GatewayError(ErrorKind.UNAVAILABLE, SPOOL_FULL_MESSAGE, retry_after=SPOOL_FULL_RETRY_AFTER)
            return error_response(call.api, full)
        body, raw = read_json(call.request, call.headers)
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            model = body["model"]
        facts = parse_facts(call.api, body, raw, route or {})
        model = facts.model
        await admit(call.caller, facts.model)
    except GatewayError as error:
        rejected = call.caller.finished(
            call.request_id, call.api.name, RequestStatus.REJECTED, model=model, error_kind=error.kind.value
        )
        assembly.recorder.record(rejected)
        return error_response(call.api, error)
    reply = await assembly.relay().serve(call.request_id, call.api, call.caller, facts, call.headers)
    return to_response(reply)


async def list_models(call: Call, model: str | None = None) -> HttpResponse:
    """P5: the models this key may use, in the SDK's list shape; or one of
    them, as the SDK's model lookup shows it."""
    api, caller = call.api, call.caller
    if call.request.method != "GET":
        return error_response(api, GatewayError(ErrorKind.METHOD_NOT_ALLOWED))
    models = [m for m in await directory.models() if caller.allows(m)]
    embedding = await directory.embedding_models()
    if model is None:
        body = api.models_body(models, embedding)
    elif model in models:
        body = dumps(api.model_entry(model, model in embedding))
    else:
        return error_response(api, GatewayError(ErrorKind.MODEL_NOT_FOUND))
    return HttpResponse(body, content_type="application/json")


def unknown_path(api: Api) -> HttpResponse:
    response = error_response(api, GatewayError(ErrorKind.UNKNOWN_PATH))
    response[REQUEST_ID_HEADER] = new_request_id()
    return response
