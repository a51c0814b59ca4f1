"""The ASGI entry point Daphne serves.

Two Django handlers share one URL configuration:
- the API paths (``/v1…``, ``/v1beta…``, ``/v1alpha…``, ``/healthz``) go to a
  handler without middleware and without Django's per-request hand-offs to
  its one sync thread. Sessions, CSRF, messages and the rest serve the
  admin's browser pages; under ASGI each sync-capable middleware costs two
  thread hand-offs per request, which was most of the gateway's own CPU;
- everything else (the admin, the dashboard, static files) gets the full
  middleware stack, with static files served by Django's staticfiles
  handler straight from the apps (HopBase needs no CDN).
"""

import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hopbase.settings")

import django  # noqa: E402

django.setup(set_prefix=False)

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.http.response import HttpResponseBase  # noqa: E402

from hopbase.background import ensure_started  # noqa: E402

API_PREFIXES = ("/v1/", "/v1beta/", "/v1alpha/", "/healthz")


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain, and none of the
    per-request hand-offs to Django's one sync thread: nothing on the API
    path runs there (database work goes to pool threads that look after
    their own connections), so the request signals and the response's close
    run right on the event loop."""

    async def __call__(self, scope, receive, send) -> None:
        await self.handle(scope, receive, send)

    async def handle(self, scope, receive, send) -> None:
        ensure_started()
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            error_response.close()
            return

        produced: list[HttpResponseBase] = []

        async def process_request() -> HttpResponseBase:
            response = await self.run_get_response(request)
            produced.append(response)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client left while the response was going out
            return response

        # As Django does: a disconnect cancels the view (or the stream), so
        # the relay hangs up on the channel at once (B1).
        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        processor = asyncio.create_task(process_request())
        await asyncio.wait((listener, processor), return_when=asyncio.FIRST_COMPLETED)
        for task in (listener, processor):
            if not task.done():
                task.cancel()
            try:
                await task
            except (asyncio.CancelledError, RequestAborted):
                pass
        for response in produced:
            # Also when the client left before a stream was ever read: its
            # closers let go of the channel and record the request.
            response.close()
        body_file.close()

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        handler = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(handler)


site = ASGIStaticFilesHandler(get_asgi_application())
api = ApiHandler()


async def application(scope, receive, send):
    if scope["type"] == "http" and scope["path"].startswith(API_PREFIXES):
        return await api(scope, receive, send)
    return await site(scope, receive, send)
