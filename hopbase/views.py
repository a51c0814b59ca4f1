"""One thin async view per endpoint (P1–P5); the work is in hopbase.intake."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from channels_pool.selection import directory
from hopbase import cached_contents, intake
from hopbase.protocols import CHAT, GEMINI, MESSAGES, RESPONSES
from hopbase.protocols.base import Api


def openai_or_anthropic(request: HttpRequest) -> Api:
    # The Anthropic SDK always sends anthropic-version; the OpenAI SDK never does.
    return MESSAGES if "anthropic-version" in request.headers else CHAT


def model_list_protocol(request: HttpRequest) -> Api:
    # GET /v1/models is also where google-genai (API version v1) lists models.
    if "x-goog-api-key" in request.headers or "key" in request.GET:
        return GEMINI
    return openai_or_anthropic(request)


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    return await intake.serve(request, CHAT)


@csrf_exempt
async def responses(request: HttpRequest) -> HttpResponse:
    return await intake.serve(request, RESPONSES)


@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponse:
    return await intake.serve(request, MESSAGES)


@csrf_exempt
async def gemini_generate(request: HttpRequest, version: str, model: str, action: str) -> HttpResponse:
    route = {"version": version, "model": model, "action": action, "alt": request.GET.get("alt", "")}
    return await intake.serve(request, GEMINI, route)


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponse:
    return await intake.list_models(request, model_list_protocol(request))


@csrf_exempt
async def gemini_cached_contents(request: HttpRequest, version: str) -> HttpResponse:
    if request.method != "POST":
        return intake.unknown_path(GEMINI)
    return await cached_contents.create(request, version)


@csrf_exempt
async def model(request: HttpRequest, model: str) -> HttpResponse:
    return await intake.list_models(request, model_list_protocol(request), model)


@csrf_exempt
async def gemini_models(request: HttpRequest, version: str) -> HttpResponse:
    return await intake.list_models(request, GEMINI)


@csrf_exempt
async def gemini_model(request: HttpRequest, version: str, model: str) -> HttpResponse:
    return await intake.list_models(request, GEMINI, model)


@csrf_exempt
async def unknown_openai_path(request: HttpRequest, rest: str) -> HttpResponse:
    return intake.unknown_path(openai_or_anthropic(request))


@csrf_exempt
async def unknown_gemini_path(request: HttpRequest, version: str, rest: str) -> HttpResponse:
    return intake.unknown_path(GEMINI)


async def healthz(request: HttpRequest) -> HttpResponse:
    await directory.all()
    return JsonResponse({"status": "ok", "unknown_key_requests": intake.unknown_key_count()})
