"""One thin async view per endpoint (P1–P5, B8); the work is in
gateway.intake (generation, model lists) and billing.usage (usage)."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from billing.usage import parse_page, read_page
from core.errors import ErrorKind, GatewayError
from core.snapshots import database_call
from gateway import counting, intake
from gateway.intake import Call, authorized
from providers.apis import CHAT, EMBEDDINGS, GEMINI, GEMINI_CACHES, GEMINI_EMBEDDINGS, MESSAGES, RESPONSES
from providers.base import Api


def openai_or_anthropic(request: HttpRequest) -> Api:
    # The Anthropic SDK always sends anthropic-version; the OpenAI SDK never does.
    return MESSAGES if "anthropic-version" in request.headers else CHAT


def model_list_api(request: HttpRequest) -> Api:
    # GET /v1/models is also where google-genai (API version v1) lists models.
    if "x-goog-api-key" in request.headers or "key" in request.GET:
        return GEMINI
    return openai_or_anthropic(request)


@authorized(CHAT)
async def chat_completions(call: Call) -> HttpResponse:
    return await intake.serve(call)


@authorized(RESPONSES)
async def responses(call: Call) -> HttpResponse:
    return await intake.serve(call)


@authorized(MESSAGES)
async def messages(call: Call) -> HttpResponse:
    return await intake.serve(call)


@authorized(GEMINI)
async def gemini_generate(call: Call, version: str, model: str, action: str) -> HttpResponse:
    route = {"version": version, "model": model, "action": action, "alt": call.request.GET.get("alt", "")}
    return await intake.serve(call, route)


@authorized(EMBEDDINGS)
async def embeddings(call: Call) -> HttpResponse:
    return await intake.serve(call)


@authorized(GEMINI_EMBEDDINGS)
async def gemini_embed(call: Call, version: str, model: str, action: str) -> HttpResponse:
    return await intake.serve(call, {"version": version, "model": model, "action": action})


@authorized(MESSAGES)
async def messages_count_tokens(call: Call) -> HttpResponse:
    return await counting.count_tokens(call, counting.ANTHROPIC_COUNTING)


@authorized(GEMINI)
async def gemini_count_tokens(call: Call, version: str, model: str) -> HttpResponse:
    return await counting.count_tokens(call, counting.GEMINI_COUNTING, {"version": version, "model": model})


@csrf_exempt
async def gemini_cached_contents(request: HttpRequest, version: str) -> HttpResponse:
    if request.method != "POST":
        # Reading, updating and deleting caches are not offered.
        return intake.unknown_path(GEMINI)
    return await create_gemini_cache(request, version=version)


@authorized(GEMINI_CACHES)
async def create_gemini_cache(call: Call, version: str) -> HttpResponse:
    return await intake.serve(call, {"version": version})


@authorized(model_list_api)
async def models(call: Call) -> HttpResponse:
    return await intake.list_models(call)


@authorized(model_list_api)
async def model(call: Call, model: str) -> HttpResponse:
    return await intake.list_models(call, model)


@authorized(GEMINI)
async def gemini_models(call: Call, version: str) -> HttpResponse:
    return await intake.list_models(call)


@authorized(GEMINI)
async def gemini_model(call: Call, version: str, model: str) -> HttpResponse:
    return await intake.list_models(call, model)


@authorized(CHAT)
async def usage(call: Call) -> HttpResponse:
    try:
        if call.request.method != "GET":
            raise GatewayError(ErrorKind.METHOD_NOT_ALLOWED, f"Method {call.request.method} is not allowed here; use GET.")
        page = parse_page(call.caller.tenant_id, call.caller.key_id, call.request.GET)
        body = await database_call(read_page, page)
    except GatewayError as error:
        return intake.error_response(CHAT, error)
    return HttpResponse(json.dumps(body, separators=(",", ":")), content_type="application/json")


@csrf_exempt
async def unknown_openai_path(request: HttpRequest, rest: str) -> HttpResponse:
    return intake.unknown_path(openai_or_anthropic(request))


@csrf_exempt
async def unknown_gemini_path(request: HttpRequest, version: str, rest: str) -> HttpResponse:
    return intake.unknown_path(GEMINI)
