"""The front door's first word on an API request, before its key is read:
a process that is draining (D1) or already holds as many requests as it can
refuses it at once, in the caller's format (table E), with ``retry-after``
and ``Connection: close``.

- Draining: 503 (``server_error`` / ``api_error`` / ``UNAVAILABLE``).
- Full: the capacity error, as when every channel is busy (429
  ``rate_limit_exceeded`` / 529 ``overloaded_error`` / 429
  ``RESOURCE_EXHAUSTED``). A process holds two sockets per stream (the
  client's and the channel's), so without a limit a burst runs it out of
  file descriptors, or queues requests behind the upstream pool, and they
  fail minutes later instead of being sent elsewhere now. The limit is
  ``gateway.governance.capacity``; past the door, each tenant is held to its share
  of it (G8).

Neither refusal leaves a request log: the key is not looked at (a cache or
database look-up is what a full or stopping process can least afford), and
requests whose key is not known are counted, not logged (P8). The counts
are in ``/readyz``. The probes (``/healthz``, ``/readyz``) are never refused.
"""

from __future__ import annotations

import logging
import time

from django.http import HttpRequest, HttpResponse

from core import lifecycle, loggers
from core.errors import ErrorKind, GatewayError
from gateway import metrics, views
from gateway.governance.capacity import max_open_requests
from gateway.intake import REQUEST_ID_HEADER, error_response
from gateway.relay.run import new_request_id
from providers.apis import CHAT, GEMINI, MESSAGES, RESPONSES
from providers.base import Api

log = logging.getLogger(loggers.ADMISSION)

PROBES = ("/healthz", "/readyz", "/metrics")
DRAINING = "This HopBase process is shutting down. Please retry."
FULL = "HopBase is at capacity right now. Please retry shortly."
WARN_EVERY = 10.0

refused = {"draining": 0, "full": 0}
_warned_at = 0.0


def has_room(path: str) -> bool:
    """May one more request be taken? Decided as the request arrives, before
    it counts itself, so that a burst refuses only its excess."""
    return path.startswith(PROBES) or lifecycle.process.open_requests() < max_open_requests()


def api_for(request: HttpRequest) -> Api:
    """The API a request is answered in, from its path (and, where the
    views look at them, its headers)."""
    path = request.path
    if path.startswith(("/v1beta/", "/v1alpha/")) or path == "/v1/cachedContents":
        return GEMINI
    if path.startswith("/v1/models"):
        # Also Gemini's generate on API version v1, which carries its key.
        return views.model_list_api(request)
    if path == "/v1/responses":
        return RESPONSES
    if path == "/v1/messages":
        return MESSAGES
    if path == "/v1/chat/completions":
        return CHAT
    return views.openai_or_anthropic(request)


def refusal(request: HttpRequest, admitted: bool) -> HttpResponse | None:
    """The answer to a request that is not to be served, or None."""
    if request.path.startswith(PROBES):
        return None
    if lifecycle.is_draining():
        refused["draining"] += 1
        return unavailable(request)
    if not admitted:
        refused["full"] += 1
        metrics.refusals_total.labels("capacity").inc()
        _warn_full()
        return refused_response(request, GatewayError(ErrorKind.ALL_BUSY, FULL, retry_after=1))
    return None


def unavailable(request: HttpRequest) -> HttpResponse:
    """Table E's answer to a request this process will not serve because it
    is draining: refused on arrival, or cut before its answer began."""
    return refused_response(request, GatewayError(ErrorKind.UNAVAILABLE, DRAINING, retry_after=1))


def refused_response(request: HttpRequest, error: GatewayError) -> HttpResponse:
    response = error_response(api_for(request), error)
    response[REQUEST_ID_HEADER] = new_request_id()
    # The client should take its next request elsewhere. (Twisted keeps its
    # side open; the client closes it, or the drain's end does.)
    response["connection"] = "close"
    return response


def _warn_full() -> None:
    global _warned_at
    now = time.monotonic()
    if now - _warned_at >= WARN_EVERY:
        _warned_at = now
        log.warning(
            "at capacity: %d requests open (limit %d); refusing new ones (%d so far)",
            lifecycle.process.open_requests(), max_open_requests(), refused["full"] + 1,
        )
