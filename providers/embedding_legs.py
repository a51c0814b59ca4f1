"""Embeddings between the two client APIs and every channel grammar (rules V1–V3, T3).

    client body --decode--> EmbeddingRequest --encode--> the channel's bodies
    the channel's answer(s) --read--> vectors, input tokens --write--> the client's body

An OpenAI client on a channel of OpenAI's grammar is passed through
(``providers.openai.embeddings``); every other pair goes this way.
A batch larger than a channel takes is encoded as several bodies, sent as
the parts of one attempt, and their vectors joined in order. A channel that
cannot serve a request (token ids where it takes text, ``dimensions`` it has
no field for) is ruled out; with no candidate left, a 400 names the field.

Where a channel reports no input tokens (Gemini), they are estimated from
the prompt's characters as the request log estimates them (and the log says
so), so the client's count and the row's agree.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from core.sse import Event
from core.usage import Usage, estimate_tokens
from core.vocabulary import ApiName, EmbeddingGrammar
from providers.apis import CHAT, EMBEDDINGS, GEMINI
from providers.aws.bedrock import INPUT_TOKENS_FIELD
from providers.base import Api, Mark, RequestFacts, StreamWatcher, dumps
from providers.embedding_channel import EmbeddingChannel
from providers.google.embeddings import BATCH, content_text, embedding_requests
from providers.google.gemini import API_VERSION, snake_or_camel
from providers.kind import Destination
from providers.neutral import CannotServe
from providers.translation import Leg

# The most inputs one request to each grammar may carry.
MOST_INPUTS = {EmbeddingGrammar.OPENAI: 2048, EmbeddingGrammar.GEMINI: 100, EmbeddingGrammar.VERTEX: 250,
               EmbeddingGrammar.TITAN: 1, EmbeddingGrammar.COHERE: 96}
VERTEX_ONE_AT_A_TIME = "gemini-embedding"  # Vertex's Gemini embedding models take one instance a request
TITAN_DIMENSIONS = (256, 512, 1024)  # Titan Text Embeddings V2; V1 has none to choose
COHERE_DIMENSIONS = (256, 512, 1024, 1536)  # Cohere Embed v4; v3 has none to choose
# Gemini's task types as Cohere's input types (Cohere requires one).
COHERE_INPUT_TYPES = {"RETRIEVAL_QUERY": "search_query", "QUESTION_ANSWERING": "search_query",
                      "CLASSIFICATION": "classification", "CLUSTERING": "clustering"}
COHERE_DEFAULT_INPUT_TYPE = "search_document"


@dataclass
class EmbeddingRequest:
    """One embeddings request, whatever API it came in on: texts, or token ids."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    dimensions: int | None = None
    task_type: str | None = None  # Gemini's taskType
    titles: list[str | None] = field(default_factory=list)  # Gemini's title, per text

    @property
    def count(self) -> int:
        return len(self.token_ids) or len(self.texts)


# -- decode: a client's request -> EmbeddingRequest ------------------------------


def decode_openai(facts: RequestFacts) -> EmbeddingRequest:
    body = facts.body
    inputs = body["input"]
    if isinstance(inputs, str):
        inputs = [inputs]
    elif inputs and isinstance(inputs[0], int):
        inputs = [inputs]  # one input of token ids
    request = EmbeddingRequest(dimensions=body.get("dimensions"))
    if isinstance(inputs[0], str):
        request.texts = list(inputs)
    else:
        request.token_ids = list(inputs)
    return request


def decode_gemini(facts: RequestFacts) -> EmbeddingRequest:
    action = facts.route["action"]
    requests = embedding_requests(facts.body, action)
    first = requests[0]
    return EmbeddingRequest(
        texts=[content_text(r, f"requests[{i}]" if action == BATCH else "request") for i, r in enumerate(requests)],
        dimensions=snake_or_camel(first, "outputDimensionality", "output_dimensionality"),
        task_type=snake_or_camel(first, "taskType", "task_type"),
        titles=[r.get("title") if isinstance(r.get("title"), str) else None for r in requests],
    )


DECODERS: dict[ApiName, Callable[[RequestFacts], EmbeddingRequest]] = {
    ApiName.EMBEDDINGS: decode_openai,
    ApiName.GEMINI: decode_gemini,
}


# -- encode: EmbeddingRequest -> a channel's bodies ------------------------------


def _texts(request: EmbeddingRequest, grammar: str) -> list[str]:
    if request.token_ids:
        raise CannotServe("input", f"A {grammar} embeddings channel takes text, not token ids.")
    return request.texts


def _batches(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _openai_bodies(request: EmbeddingRequest, model: str) -> list[dict[str, Any]]:
    inputs: list[Any] = request.token_ids or request.texts
    bodies = []
    for batch in _batches(inputs, MOST_INPUTS[EmbeddingGrammar.OPENAI]):
        body: dict[str, Any] = {"model": model, "input": batch, "encoding_format": "float"}
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        bodies.append(body)
    return bodies


def _gemini_bodies(request: EmbeddingRequest, model: str) -> list[dict[str, Any]]:
    entries = []
    for text, title in zip(_texts(request, "Gemini"), request.titles or [None] * request.count, strict=True):
        entry: dict[str, Any] = {"model": f"models/{model}", "content": {"parts": [{"text": text}]}}
        if request.task_type:
            entry["taskType"] = request.task_type
        if title:
            entry["title"] = title
        if request.dimensions is not None:
            entry["outputDimensionality"] = request.dimensions
        entries.append(entry)
    return [{"requests": batch} for batch in _batches(entries, MOST_INPUTS[EmbeddingGrammar.GEMINI])]


def _vertex_bodies(request: EmbeddingRequest, model: str) -> list[dict[str, Any]]:
    instances = []
    for text, title in zip(_texts(request, "Vertex"), request.titles or [None] * request.count, strict=True):
        instance: dict[str, Any] = {"content": text}
        if request.task_type:
            instance["task_type"] = request.task_type
        if title:
            instance["title"] = title
        instances.append(instance)
    size = 1 if VERTEX_ONE_AT_A_TIME in model else MOST_INPUTS[EmbeddingGrammar.VERTEX]
    parameters = {"outputDimensionality": request.dimensions} if request.dimensions is not None else {}
    return [{"instances": batch, **({"parameters": parameters} if parameters else {})}
            for batch in _batches(instances, size)]


def _titan_bodies(request: EmbeddingRequest, model: str) -> list[dict[str, Any]]:
    texts = _texts(request, "Titan")
    extra: dict[str, Any] = {}
    if request.dimensions is not None:
        if "v2" not in model or request.dimensions not in TITAN_DIMENSIONS:
            raise CannotServe("dimensions", f"Titan embeddings take dimensions of {TITAN_DIMENSIONS} (V2 only).")
        extra = {"dimensions": request.dimensions, "normalize": True}
    return [{"inputText": text, **extra} for text in texts]


def _cohere_bodies(request: EmbeddingRequest, model: str) -> list[dict[str, Any]]:
    texts = _texts(request, "Cohere")
    extra: dict[str, Any] = {"input_type": COHERE_INPUT_TYPES.get(request.task_type or "", COHERE_DEFAULT_INPUT_TYPE)}
    if request.dimensions is not None:
        if "embed-v4" not in model or request.dimensions not in COHERE_DIMENSIONS:
            raise CannotServe("dimensions", f"Cohere embeddings take dimensions of {COHERE_DIMENSIONS} (Embed v4 only).")
        extra["output_dimension"] = request.dimensions
    return [{"texts": batch, **extra} for batch in _batches(texts, MOST_INPUTS[EmbeddingGrammar.COHERE])]


# -- read: a channel's answers -> vectors, input tokens (None: not reported) -----


def _openai_read(answers: list[Any]) -> tuple[list[list[float]], int | None]:
    vectors: list[list[float]] = []
    tokens = 0
    for answer in answers:
        data = sorted(answer["data"], key=lambda item: item["index"])
        vectors += [item["embedding"] for item in data]
        tokens += answer["usage"]["prompt_tokens"]
    return vectors, tokens


def _gemini_read(answers: list[Any]) -> tuple[list[list[float]], int | None]:
    return [embedding["values"] for answer in answers for embedding in answer["embeddings"]], None


def _vertex_read(answers: list[Any]) -> tuple[list[list[float]], int | None]:
    predictions = [p["embeddings"] for answer in answers for p in answer["predictions"]]
    counts = [(p.get("statistics") or {}).get("token_count") for p in predictions]
    reported = all(isinstance(c, int | float) for c in counts)
    return [p["values"] for p in predictions], int(sum(counts)) if reported else None


def _titan_read(answers: list[Any]) -> tuple[list[list[float]], int | None]:
    return [answer["embedding"] for answer in answers], sum(answer["inputTextTokenCount"] for answer in answers)


def _cohere_read(answers: list[Any]) -> tuple[list[list[float]], int | None]:
    vectors: list[list[float]] = []
    for answer in answers:
        found = answer["embeddings"]
        vectors += found["float"] if isinstance(found, dict) else found
    counts = [answer.get(INPUT_TOKENS_FIELD) for answer in answers]
    return vectors, sum(counts) if all(isinstance(c, int) for c in counts) else None


@dataclass(frozen=True)
class EmbeddingSide:
    """A channel grammar as a translation target."""

    api: Api  # addresses the channel's endpoint, judges its failures
    encode: Callable[[EmbeddingRequest, str], list[dict[str, Any]]]
    read: Callable[[list[Any]], tuple[list[list[float]], int | None]]
    probe: Callable[[str], dict[str, Any]]  # the smallest request for a model (the admin's test button)
    route: dict[str, str] = field(default_factory=dict)


PROBE_TEXT = "OK"
SIDES: dict[str, EmbeddingSide] = {
    EmbeddingGrammar.OPENAI: EmbeddingSide(
        EmbeddingChannel(CHAT), _openai_bodies, _openai_read, lambda model: {"model": model, "input": PROBE_TEXT}),
    EmbeddingGrammar.GEMINI: EmbeddingSide(
        EmbeddingChannel(GEMINI), _gemini_bodies, _gemini_read,
        lambda model: {"requests": [{"model": f"models/{model}", "content": {"parts": [{"text": PROBE_TEXT}]}}]},
        {"version": API_VERSION}),
    EmbeddingGrammar.VERTEX: EmbeddingSide(
        EmbeddingChannel(CHAT), _vertex_bodies, _vertex_read, lambda model: {"instances": [{"content": PROBE_TEXT}]}),
    EmbeddingGrammar.TITAN: EmbeddingSide(
        EmbeddingChannel(CHAT), _titan_bodies, _titan_read, lambda model: {"inputText": PROBE_TEXT}),
    EmbeddingGrammar.COHERE: EmbeddingSide(
        EmbeddingChannel(CHAT), _cohere_bodies, _cohere_read,
        lambda model: {"texts": [PROBE_TEXT], "input_type": COHERE_DEFAULT_INPUT_TYPE}),
}


# -- write: vectors -> the client's body -----------------------------------------


def write_openai(facts: RequestFacts, model: str, vectors: list[list[float]], tokens: int) -> bytes:
    packed = facts.body.get("encoding_format") == "base64"
    data = [{"object": "embedding", "index": index,
             "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if packed else v}
            for index, v in enumerate(vectors)]
    return dumps({"object": "list", "data": data, "model": model,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def write_gemini(facts: RequestFacts, model: str, vectors: list[list[float]], tokens: int) -> bytes:
    if facts.route["action"] == BATCH:
        return dumps({"embeddings": [{"values": v} for v in vectors]})
    return dumps({"embedding": {"values": vectors[0]}})


WRITERS: dict[ApiName, Callable[[RequestFacts, str, list[list[float]], int], bytes]] = {
    ApiName.EMBEDDINGS: write_openai,
    ApiName.GEMINI: write_gemini,
}


class EmbeddingWatcher(StreamWatcher):
    """A translated answer: the channel's body (or its parts' bodies, as a
    JSON array) read into vectors and written as the client's body."""

    def __init__(self, facts: RequestFacts, api: Api, side: EmbeddingSide, expected: int, parts: bool) -> None:
        super().__init__(facts)
        self.content_type = "application/json"
        self.api, self.side, self.expected, self.parts = api, side, expected, parts
        self.body = b""

    def mark(self, event: Event) -> int:
        try:
            answer = orjson.loads(event.raw)
            vectors, tokens = self.side.read(answer if self.parts else [answer])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return Mark.ERROR  # a 200 that is no answer of its grammar: the channel's failure
        if len(vectors) != self.expected or not all(isinstance(v, list) and v for v in vectors):
            return Mark.ERROR
        reported = tokens is not None
        counted = tokens if tokens is not None else estimate_tokens(self.facts.prompt_chars)
        self.usage = Usage(input_tokens=counted, input_reported=reported, output_reported=True)
        self.body = WRITERS[self.api.name](self.facts, self.facts.model, vectors, counted)
        return Mark.CONTENT | Mark.TERMINAL

    def assembled_body(self) -> bytes:
        return self.body


class EmbeddingLegs:
    """How one embeddings request reaches each candidate channel (the
    counterpart of ``legs.Legs`` for a chat request)."""

    def __init__(self, api: Api, facts: RequestFacts, request_id: str) -> None:
        self.api = api
        self.facts = facts
        self._decoded: EmbeddingRequest | None = None

    def wires(self) -> frozenset[str]:
        return frozenset(SIDES)

    @staticmethod
    def grammar(channel: Destination, model: str) -> str | None:
        return channel.kind.embedding_grammar(channel.upstream_model(model))

    def to(self, channel: Destination) -> Leg:
        model = channel.upstream_model(self.facts.model)
        grammar = self.grammar(channel, self.facts.model)
        if grammar is None:
            raise CannotServe("model", f"A {channel.protocol} channel has no embeddings for this model.")
        if self.api is EMBEDDINGS and grammar == EmbeddingGrammar.OPENAI:
            facts = self.api.with_model(self.facts, model)
            return Leg(self.api, facts, lambda: self.api.new_watcher(facts))
        side = SIDES[grammar]
        request = self._request()
        bodies = side.encode(request, model)
        encoded = [dumps(body) for body in bodies]
        facts = replace(self.facts, model=model, body=bodies[0], raw_body=encoded[0], route=dict(side.route),
                        parts=tuple(encoded) if len(encoded) > 1 else ())
        parts = len(encoded) > 1

        def new_watcher() -> StreamWatcher:
            return EmbeddingWatcher(self.facts, self.api, side, request.count, parts)

        return Leg(side.api, facts, new_watcher)

    def _request(self) -> EmbeddingRequest:
        if self._decoded is None:
            self._decoded = DECODERS[self.api.name](self.facts)
        return self._decoded
