"""Embeddings as each provider answers them: OpenAI's ``/v1/embeddings``
(and Azure's deployments, the same shape), Gemini's ``:embedContent`` and
``:batchEmbedContents``, Vertex ``:predict``, and Bedrock's Titan
(``amazon.titan-embed-…``) and Cohere (``cohere.embed-…``) bodies through
``/invoke``.

The vectors are made up but stable: each text's SHA-256 seeds its numbers,
so the same input always embeds the same and a batch answers in its own
order (what a gateway that splits and joins batches must keep). Input tokens
are counted as everywhere in the simulator, one whitespace-separated word a
token (a token id is one token); Gemini, like Google's API, reports none.
A batch larger than the provider takes is refused as the provider would
(``too_many``): a gateway must split it.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from typing import Any

from simulator.requests import count_words

DEFAULT_DIMENSIONS = 16  # small on purpose: records keep every byte sent

AZURE = "azure"  # and OpenAI's own: the same request and answer
GEMINI = "gemini"  # :embedContent
GEMINI_BATCH = "gemini-batch"  # :batchEmbedContents
VERTEX = "vertex"
TITAN = "titan"
COHERE = "cohere"
# The most inputs one request may carry, per kind (and, for Vertex, per model).
MOST_INPUTS = {AZURE: 2048, GEMINI: 1, GEMINI_BATCH: 100, VERTEX: 250, TITAN: 1, COHERE: 96}
VERTEX_ONE_AT_A_TIME = "gemini-embedding"  # Vertex's Gemini embedding models take one instance a request


def too_many(kind: str, model: str, texts: list[str]) -> str | None:
    """The provider's refusal of a batch larger than it takes, if this is one."""
    most = 1 if kind == VERTEX and VERTEX_ONE_AT_A_TIME in model else MOST_INPUTS[kind]
    if len(texts) > most:
        return f"simulated upstream: at most {most} inputs in one request, got {len(texts)}"
    return None


def _gemini_text(content: object) -> str:
    parts = content.get("parts") if isinstance(content, dict) else None
    return " ".join(p["text"] for p in parts or () if isinstance(p, dict) and isinstance(p.get("text"), str))


def vector(text: str, dimensions: int) -> list[float]:
    """A unit vector of ``dimensions`` numbers, the same for the same text."""
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    values = [rng.uniform(-1.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


def _dimensions(value: object) -> int:
    return value if isinstance(value, int) and 0 < value <= 4096 else DEFAULT_DIMENSIONS


def _strings(value: object) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []


def embedding_texts(kind: str, body: dict[str, Any]) -> list[str]:
    """What a request embeds, in order: where directives are read and words counted."""
    if kind == AZURE:
        items = body.get("input")
        if isinstance(items, str):
            return [items]
        if isinstance(items, list) and items and all(isinstance(i, int) for i in items):
            items = [items]  # one input of token ids
        texts = []
        for item in items if isinstance(items, list) else []:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, list):
                texts.append(" ".join(str(token) for token in item))  # a token id counts as one word
        return texts
    if kind == GEMINI:
        return [_gemini_text(body.get("content"))] if isinstance(body.get("content"), dict) else []
    if kind == GEMINI_BATCH:
        requests = body.get("requests")
        return [_gemini_text(r.get("content")) for r in requests if isinstance(r, dict)] \
            if isinstance(requests, list) else []
    if kind == VERTEX:
        instances = body.get("instances")
        return [i["content"] for i in instances if isinstance(i, dict) and isinstance(i.get("content"), str)] \
            if isinstance(instances, list) else []
    if kind == TITAN:
        return [body["inputText"]] if isinstance(body.get("inputText"), str) else []
    return _strings(body.get("texts"))


def embedding_body(kind: str, body: dict[str, Any], texts: list[str], model: str) -> dict[str, Any]:
    """The answer to an embedding request of ``kind``."""
    if kind == AZURE:
        dimensions = _dimensions(body.get("dimensions"))
        data = []
        for index, text in enumerate(texts):
            values: Any = vector(text, dimensions)
            if body.get("encoding_format") == "base64":
                values = base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode()
            data.append({"object": "embedding", "index": index, "embedding": values})
        tokens = count_words(texts)
        return {"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    if kind == GEMINI:
        dimensions = _dimensions(body.get("outputDimensionality"))
        return {"embedding": {"values": vector(texts[0] if texts else "", dimensions)}}
    if kind == GEMINI_BATCH:
        requests = [r for r in body.get("requests") or () if isinstance(r, dict)]
        return {"embeddings": [{"values": vector(text, _dimensions(r.get("outputDimensionality")))}
                               for text, r in zip(texts, requests, strict=False)]}
    if kind == VERTEX:
        parameters = body.get("parameters") if isinstance(body.get("parameters"), dict) else {}
        dimensions = _dimensions(parameters.get("outputDimensionality"))
        predictions = [{"embeddings": {"values": vector(text, dimensions),
                                       "statistics": {"token_count": count_words([text]), "truncated": False}}}
                       for text in texts]
        return {"predictions": predictions, "metadata": {"billableCharacterCount": sum(len(t) for t in texts)}}
    if kind == TITAN:
        values = vector(texts[0] if texts else "", _dimensions(body.get("dimensions")))
        return {"embedding": values, "embeddingsByType": {"float": values}, "inputTextTokenCount": count_words(texts)}
    dimensions = _dimensions(body.get("output_dimension"))
    return {"id": hashlib.sha256("\n".join(texts).encode()).hexdigest()[:36], "response_type": "embeddings_floats",
            "embeddings": [vector(text, dimensions) for text in texts], "texts": texts}
