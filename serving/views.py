"""The process's own endpoints, for load balancers and Prometheus: is it
alive (``/healthz``), may it take requests (``/readyz``, serving.readiness),
and what it has counted (``/metrics``, gateway.metrics)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from channels_pool.selection import directory
from gateway import intake, metrics
from serving import readiness


async def healthz(request: HttpRequest) -> HttpResponse:
    await directory.all()
    return JsonResponse({"status": "ok", "unknown_key_requests": intake.unknown_key_count()})


async def readyz(request: HttpRequest) -> HttpResponse:
    status, body = await readiness.report()
    # A 503 while starting or draining is the answer asked for, not an error.
    return intake.quiet(JsonResponse(body, status=status, headers={"cache-control": "no-store"}))


async def metrics_text(request: HttpRequest) -> HttpResponse:
    if not metrics.authorized(request):
        response = JsonResponse({"error": {"message": "A bearer token is required.", "type": "invalid_request_error"}}, status=401)
        response["www-authenticate"] = "Bearer"
        return intake.quiet(response)
    body = await metrics.exposition(await readiness.dependencies())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
