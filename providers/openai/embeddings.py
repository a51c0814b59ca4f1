"""OpenAI Embeddings, ``POST /v1/embeddings`` (rules V1–V3).

``input`` is a string, an array of strings, an array of token ids or an
array of such arrays; ``encoding_format`` ``float`` or ``base64``;
``dimensions``; ``user``. What HopBase refuses itself, before any channel is
called (V3): no input or an empty one, more than 2,048 inputs, an item that
is neither a string nor token ids, a token id that is not a non-negative
integer, ``dimensions`` that is not a positive integer.

A channel that speaks OpenAI's grammar (``openai``, ``azure``) gets the
request as it is and its answer goes back as it came: a base64 answer is
never decoded and encoded again. Only its usage is read, from the answer's
end, where OpenAI writes it. Other channels are reached translated
(``providers.embedding_legs``).
"""

from __future__ import annotations

from typing import Any

import orjson

from core.errors import ErrorKind, GatewayError
from core.sse import Event
from core.usage import CHARS_PER_TOKEN, Usage
from core.vocabulary import ApiName
from providers.base import Mark, RequestFacts, StreamWatcher
from providers.kind import Call, Operation
from providers.openai.chat import OpenAIApi

MAX_INPUTS = 2048
ENCODINGS = ("float", "base64")


def malformed(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorKind.MALFORMED, message, param=param)


def checked_dimensions(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise malformed(f"`{param}` must be a positive integer.", param)
    return value


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def input_chars(inputs: Any) -> int:
    """Characters of ``input`` as V3 estimates them: a text's own, and four
    for each token id (so that an estimate counts one token each). Raises
    the refusals V3 lists."""
    if isinstance(inputs, str):
        inputs = [inputs]
    elif is_token_ids(inputs):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise malformed("`input` must be a non-empty string, array of strings or array of token ids.", "input")
    if len(inputs) > MAX_INPUTS:
        raise malformed(f"`input` may hold at most {MAX_INPUTS} inputs; it holds {len(inputs)}.", "input")
    chars = 0
    texts = isinstance(inputs[0], str)
    for index, item in enumerate(inputs):
        if texts and isinstance(item, str):
            if not item:
                raise malformed(f"`input[{index}]` is empty: there is nothing to embed.", "input")
            chars += len(item)
        elif not texts and isinstance(item, list) and item:
            if not is_token_ids(item) or any(token < 0 for token in item):
                raise malformed(f"`input[{index}]` must hold token ids: non-negative integers.", "input")
            chars += CHARS_PER_TOKEN * len(item)
        else:
            kind = "a non-empty string" if texts else "a non-empty array of token ids"
            raise malformed(f"`input[{index}]` must be {kind}, like the other inputs.", "input")
    return chars


def usage_tokens(raw: bytes) -> int | None:
    """``usage.prompt_tokens`` of an OpenAI embeddings answer, read from its
    end without parsing the vectors before it; None if there is none."""
    at = raw.rfind(b'"usage"')
    start = raw.find(b"{", at) if at >= 0 else -1
    end = raw.find(b"}", start)
    try:
        usage = orjson.loads(raw[start:end + 1]) if start >= 0 and end > start else None
    except orjson.JSONDecodeError:
        return None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else None


class EmbeddingsWatcher(StreamWatcher):
    """An OpenAI-grammar channel's answer, passed through whole."""

    def __init__(self, facts: RequestFacts) -> None:
        super().__init__(facts)
        self.content_type = "application/json"
        self.body = b""

    def mark(self, event: Event) -> int:
        tokens = usage_tokens(event.raw)
        if tokens is None or b'"data"' not in event.raw:
            return Mark.ERROR  # a 200 that is no embeddings answer: the channel's failure
        self.body = event.raw
        self.usage = Usage(input_tokens=tokens, input_reported=True, output_reported=True)
        return Mark.CONTENT | Mark.TERMINAL

    def assembled_body(self) -> bytes:
        return self.body


class Embeddings(OpenAIApi):
    name = ApiName.EMBEDDINGS
    operation = Operation.EMBED
    watcher = EmbeddingsWatcher
    upstream_streams = False

    def output_cap(self, facts: RequestFacts) -> int | None:
        return 0  # nothing is written back but what the input costs

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        model = self.require_model(body)
        prompt_chars = input_chars(body.get("input"))
        checked_dimensions(body.get("dimensions"), "dimensions")
        encoding = body.get("encoding_format")
        if encoding is not None and encoding not in ENCODINGS:
            raise malformed("`encoding_format` must be `float` or `base64`.", "encoding_format")
        user = body.get("user")
        if user is not None and not isinstance(user, str):
            raise malformed("`user` must be a string.", "user")
        return RequestFacts(model=model, stream=False, body=body, raw_body=raw_body, prompt_chars=prompt_chars)

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        return Call(self.operation, facts.model, facts.body, facts.raw_body)

    def slow_start_applies(self, model: str, facts: RequestFacts) -> bool:
        return False
