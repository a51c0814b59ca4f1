"""The ASGI application Daphne and uvicorn serve (through the entry point,
hopbase.asgi, which sets Django up first).

Two Django handlers share one URL configuration:
- the API paths (``/v1…``, ``/v1beta…``, ``/v1alpha…``, ``/healthz``) go to a
  handler without middleware and without Django's per-request hand-offs to
  its one sync thread. Sessions, CSRF, messages and the rest serve the
  admin's browser pages; under ASGI each sync-capable middleware costs two
  thread hand-offs per request, which was most of the gateway's own CPU;
- everything else (the admin, the dashboard, static files) gets the full
  middleware stack, with static files served by Django's staticfiles
  handler straight from the apps (HopBase needs no CDN).

The API handler is also where a request meets the process's life
(core.lifecycle, serving.admission): it is refused at once while the
process drains or is full, and its work runs as a task of its own that
the server's shutdown does not cut short (a graceful drain on SIGTERM). After
its first request, the process's garbage collector is set for serving
(serving.collector).
"""

import asyncio
import functools
import io
import logging
from collections.abc import Awaitable
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http.response import HttpResponseBase
from django.urls import ResolverMatch, URLResolver, get_resolver
from django.utils.log import log_response

from core import lifecycle, loggers
from gateway.relay.backpressure import unsent_counter
from serving import admission, collector, upgrades
from serving.background import ensure_started

log = logging.getLogger(loggers.ASGI)

API_PREFIXES = ("/v1/", "/v1beta/", "/v1alpha/", "/healthz", "/readyz", "/metrics")
# Longer paths are matched afresh each time (see ApiHandler.resolve_request):
# room for a Gemini model name, not for a client filling memory with paths.
REMEMBERED_PATH_LENGTH = 200


class Sender:
    """A request's ``send``: notes whether its response has started, adds
    ``Connection: close`` to one that starts while the process drains, so
    that a keep-alive client takes its next request elsewhere, and tells a
    stream whose client falls too far behind (gateway.relay.backpressure)."""

    __slots__ = ("send", "started", "too_slow", "unsent", "max_unsent")

    def __init__(self, send) -> None:
        self.send = send
        self.started = False
        self.too_slow = None  # the stream's hook, once its response exists
        self.unsent = None
        self.max_unsent = 0

    def watch(self, too_slow) -> None:
        """Call ``too_slow`` once when the client falls too far behind."""
        self.unsent = unsent_counter(self.send) if too_slow is not None else None
        self.too_slow = too_slow if self.unsent is not None else None
        self.max_unsent = settings.HOPBASE_MAX_UNSENT_BYTES

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            if lifecycle.is_draining():
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await self.send(message)
        if self.too_slow is not None and message.get("more_body"):
            try:
                behind = self.unsent() > self.max_unsent
            except (AttributeError, RuntimeError, TypeError):  # a transport closed, or not as expected
                return
            if behind:
                too_slow, self.too_slow = self.too_slow, None
                too_slow()


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain, and none of the
    per-request hand-offs to Django's one sync thread: nothing on the API
    path runs there (database work goes to pool threads that look after
    their own connections), so the request signals and the response's close
    run right on the event loop."""

    def __call__(self, scope, receive, send) -> lifecycle.SeenThrough:
        """The request's work, under way; what Daphne holds is a future for
        it (core.lifecycle.SeenThrough), which Daphne awaits as it would a coroutine."""
        ensure_started()
        # Decided before the request counts itself (see_through), so that a
        # burst refuses only its excess.
        admitted = admission.has_room(scope["path"])
        work = lifecycle.process.see_through(self.serve(scope, receive, Sender(send), admitted))
        if not collector.settled:
            work.add_done_callback(settle_collector)
        return work

    async def serve(self, scope, receive, send: Sender, admitted: bool) -> None:
        """One request's work, from its body to its response's close."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                await self.send_response(error_response, send)
                error_response.close()
                return
            if (refusal := admission.refusal(request, admitted)) is not None:
                await self.send_response(refusal, send)
                return
            try:
                await self.respond(request, receive, send)
            except asyncio.CancelledError:
                if lifecycle.is_draining() and not send.started:
                    # Cut at the drain's end before its answer began (a
                    # request still held): table E's 503 rather than nothing.
                    await self.send_response(admission.unavailable(request), send)
                raise
        finally:
            body_file.close()

    async def respond(self, request, receive, send) -> None:
        # As Django does: a disconnect cancels the view (or the stream), so
        # the relay hangs up on the channel at once (B1). Unlike Django, the
        # view runs in this task, which the listener cancels: one task and
        # two waits fewer per request.
        work = asyncio.current_task()
        running, client_left = True, False

        def hang_up(listener: asyncio.Task) -> None:
            nonlocal client_left
            if running and not listener.cancelled():
                client_left = True
                work.cancel()

        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        listener.add_done_callback(hang_up)
        response: HttpResponseBase | None = None
        taken_back = False
        try:
            response = await self.run_get_response(request)
            # (A whole answer has no hook: asked for one, it would raise and
            # catch an AttributeError.)
            send.watch(getattr(response, "too_slow", None) if response.streaming else None)
            await self.send_response(response, send)
        except asyncio.CancelledError:
            # The listener's cancel (the client left, while the view ran or
            # the answer went out) is taken back; one from outside as well
            # (a drain that ran out of time) goes on.
            if not client_left:
                raise
            taken_back = True
            if work.uncancel() > 0:
                raise
        finally:
            running = False
            if client_left and not taken_back:
                work.uncancel()  # a view that caught the cancel and ended otherwise
            listener.cancel()
            if response is not None:
                # Also when the client left before a stream was ever read: its
                # closers let go of the channel and record the request.
                release(response)
        if listener.done() and not listener.cancelled() and not isinstance(listener.exception(), RequestAborted):
            listener.result()

    async def send_response(self, response, send) -> None:
        """Django's, but a stream's parts go out as they come: one ASGI
        message per relayed event, without Django's two extra generator
        layers and re-chunking (each costs more per event than the event's
        own bytes do), and for the relay's own streams (``parts``) without
        its check that each part is bytes."""
        if not (response.streaming and response.is_async):
            return await super().send_response(response, send)
        headers = [
            (bytes(name.encode("ascii") if isinstance(name, str) else name),
             bytes(value.encode("latin1") if isinstance(value, str) else value))
            for name, value in response.items()
        ]
        headers += [(b"Set-Cookie", c.output(header="").encode("ascii").strip()) for c in response.cookies.values()]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        parts = getattr(response, "parts", None)
        async with aclosing(response.streaming_content if parts is None else parts) as content:
            async for part in content:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body"})

    async def read_body(self, receive) -> io.BytesIO:
        """The body, in memory: the API reads it whole (as JSON) anyway, so
        Django's spooled temporary file only cost time. Past
        ``HOPBASE_MAX_BODY_BYTES`` the rest is read and dropped (the request
        is refused for its size, 413, by gateway.intake), so this copy never
        outgrows the limit. (A larger body never gets here: under Daphne
        serving.twisted_web, under uvicorn serving.uvicorn_web refuses it
        while it is read and hands the request on with no body and a
        Content-Length over the limit, which gateway.intake refuses; this
        bound stays, a second line.)"""
        keep = settings.HOPBASE_MAX_BODY_BYTES + 1
        body = io.BytesIO()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestAborted()
            chunk = message.get("body", b"")
            if chunk and keep > 0:
                body.write(chunk[:keep])
                keep -= len(chunk)
            if not message.get("more_body", False):
                body.seek(0)
                return body

    def resolve_request(self, request):
        """Django's, with the answers remembered: the API's few paths come
        again and again, and matching them anew was about 2 % of a request's
        CPU. (No middleware here sets a request's own URLconf.) Every path
        under the API matches a route (an unknown one, table E's 404), so
        whatever a client sends may be remembered: only paths of up to
        ``REMEMBERED_PATH_LENGTH`` characters, the last 1,024 of them."""
        path, resolver = request.path_info, get_resolver()
        match = resolved(resolver, path) if len(path) <= REMEMBERED_PATH_LENGTH else resolver.resolve(path)
        request.resolver_match = match
        return match

    async def get_response_async(self, request):
        """Django's, without what the API does not use: the URLconf is the
        default one, and an answer HopBase has logged already (its
        refusals, each with its request's record) skips the hop to a thread
        that Django takes to find that out."""
        response = await self._middleware_chain(request)
        response._resource_closers.append(request.close)
        if response.status_code >= 400 and not getattr(response, "_has_been_logged", False):
            await sync_to_async(log_response, thread_sensitive=False)(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        return response

    async def _get_response_async(self, request):
        """The view, called: every API view is a coroutine function, none is
        atomic, and there is no view or template-response middleware."""
        callback, callback_args, callback_kwargs = self.resolve_request(request)
        response = await callback(request, *callback_args, **callback_kwargs)
        self.check_response(response, callback)
        return response

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(handler)


def settle_collector(work: asyncio.Future) -> None:
    """After a process's first API requests (serving.collector)."""
    collector.request_ended(lifecycle.process.open_requests())


@functools.lru_cache(maxsize=1024)
def resolved(resolver: URLResolver, path: str) -> ResolverMatch:
    """The view for ``path`` (a shared ``ResolverMatch``: Django hands a
    view copies of its arguments)."""
    return resolver.resolve(path)


def release(response: HttpResponseBase) -> None:
    """``response.close()`` without Django's ``request_finished`` signal:
    its receivers close the caches and this thread's database connections
    and reset the URLconf, none of which an API request touches on the
    event loop (its database work runs on pool threads), and sending it was
    about 1.5 % of a request's CPU. A closer that fails is logged, not
    passed over in silence: the request's record is among them."""
    for closer in response._resource_closers:
        try:
            closer()
        except Exception:
            log.exception("closing a response failed")
    response._resource_closers.clear()
    response.closed = True


site = ASGIStaticFilesHandler(get_asgi_application())
api = ApiHandler()


def application(scope, receive, send) -> Awaitable[None]:
    if scope["type"] == "http" and scope["path"].startswith(API_PREFIXES):
        if scope["method"] == "GET" and upgrades.wants_websocket(scope["headers"]):
            return refuse_upgrade(send)
        return api(scope, receive, send)
    return site(scope, receive, send)


async def refuse_upgrade(send) -> None:
    """A WebSocket upgrade that reached the application as plain HTTP
    (uvicorn without a WebSocket library): 426 (serving.upgrades)."""
    for message in upgrades.ANSWER:
        await send(message)


# An ASGI 3 application, though not a coroutine function: it returns what
# the server awaits (asgiref and Daphne would otherwise take it for ASGI 2).
application._asgi_single_callable = True
