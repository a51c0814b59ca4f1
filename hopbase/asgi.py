"""The ASGI entry point Daphne serves.

Two Django handlers share one URL configuration:
- the API paths (``/v1…``, ``/v1beta…``, ``/v1alpha…``, ``/healthz``) go to a
  handler without middleware. Sessions, CSRF, messages and the rest serve
  the admin's browser pages; under ASGI each sync-capable middleware costs
  two thread hand-offs per request, which would be most of the gateway's
  own CPU time;
- everything else (the admin, the dashboard, static files) gets the full
  middleware stack, with static files served by Django's staticfiles
  handler straight from the apps (HopBase needs no CDN).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hopbase.settings")

import django  # noqa: E402

django.setup(set_prefix=False)

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402

API_PREFIXES = ("/v1/", "/v1beta/", "/v1alpha/", "/healthz")


class ApiHandler(ASGIHandler):
    """Django's ASGI handler with an empty middleware chain."""

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
