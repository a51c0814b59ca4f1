"""Gemini embeddings: ``POST /{version}/models/{model}:embedContent`` and
``:batchEmbedContents`` (rules V1–V3).

One ``content`` (its text parts) is one input; ``taskType``, ``title`` and
``outputDimensionality`` ride with each. What HopBase refuses itself, before
any channel is called: no content or one without text, a part that is not
text, more than 2,048 requests in a batch, an ``outputDimensionality`` that
is not a positive integer. Every channel is reached translated
(``providers.embedding_legs``), a Gemini one too: the batch may have
to be split, and each request names the model as the channel knows it.
"""

from __future__ import annotations

from typing import Any

from core.errors import ErrorKind, GatewayError
from providers.base import RequestFacts
from providers.google.gemini import Gemini, snake_or_camel
from providers.kind import Operation
from providers.openai.embeddings import MAX_INPUTS, checked_dimensions

BATCH = "batchEmbedContents"


def malformed(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorKind.MALFORMED, message, param=param)


def content_text(request: Any, param: str) -> str:
    """The text one embedding request embeds (its content's text parts, joined)."""
    content = request.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not parts:
        raise malformed(f"`{param}.content` must have parts with text to embed.", f"{param}.content")
    texts = []
    for part in parts:
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str):
            raise malformed(f"`{param}.content` may hold only text parts: only text is embedded.", f"{param}.content")
        texts.append(text)
    joined = " ".join(texts)
    if not joined:
        raise malformed(f"`{param}.content` is empty: there is nothing to embed.", f"{param}.content")
    return joined


def embedding_requests(body: Any, action: str) -> list[dict[str, Any]]:
    """The requests of a body, one for ``embedContent``, each checked."""
    if not isinstance(body, dict):
        raise malformed("The request body must be a JSON object.", "body")
    if action != BATCH:
        requests, param = [body], ""
    else:
        requests, param = body.get("requests"), "requests"
        if not isinstance(requests, list) or not requests:
            raise malformed("`requests` must be a non-empty array.", "requests")
        if len(requests) > MAX_INPUTS:
            raise malformed(f"`requests` may hold at most {MAX_INPUTS} requests; it holds {len(requests)}.", "requests")
    for index, request in enumerate(requests):
        name = f"{param}[{index}]" if param else "request"
        if not isinstance(request, dict):
            raise malformed(f"`{name}` must be an object.", name)
        dimensions = snake_or_camel(request, "outputDimensionality", "output_dimensionality")
        checked_dimensions(dimensions, "outputDimensionality")
    return requests


class GeminiEmbeddings(Gemini):
    operation = Operation.EMBED
    upstream_streams = False
    state_field = ""

    def output_cap(self, facts: RequestFacts) -> int | None:
        return 0  # nothing is written back but what the input costs

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        requests = embedding_requests(body, route["action"])
        chars = sum(len(content_text(r, f"requests[{i}]" if route["action"] == BATCH else "request"))
                    for i, r in enumerate(requests))
        return RequestFacts(model=route["model"], stream=False, body=body, raw_body=raw_body, prompt_chars=chars,
                            route=route)

    def slow_start_applies(self, model: str, facts: RequestFacts) -> bool:
        return False
