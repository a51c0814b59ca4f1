"""The one small interface every client API implements.

An ``Api`` knows the request side: the facts the gateway needs from a
request body, how to address a channel, and how to render HopBase's own
errors. A ``StreamWatcher`` (one per attempt) knows the response side: what
each upstream event is, the usage it reports, and how to end a stream with an
error in this protocol's encoding. The relay talks only to these two.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import orjson

from core.errors import ErrorKind, GatewayError, UpstreamFailure, failure_from_status
from core.sse import Event
from core.surcharges import Surcharge
from core.usage import Usage, estimate_tokens
from core.vocabulary import ApiName, WireGrammar
from providers.kind import Call, Operation


class Mark:
    """What an upstream event is to the relay: bit flags combined with ``|``
    (a Gemini chunk can be content and terminal at once); 0 is preamble.
    Plain ints, not an IntFlag: every event is marked, and enum arithmetic
    costs several times more."""

    PREAMBLE = 0
    CONTENT = 1  # the first of these ends the hold (F1)
    TERMINAL = 2  # the stream's normal end
    ERROR = 4  # the provider reported a failure
    DROP = 8  # not for the client (the usage chunk HopBase asked for itself)


@dataclass
class RequestFacts:
    model: str
    stream: bool
    body: dict[str, Any]
    raw_body: bytes
    thinking: bool = False
    prompt_chars: int = 0
    # State a single provider account holds (P9): previous_response_id, cachedContent.
    affinity_key: str | None = None
    # Api-specific routing details (e.g. the Gemini API version and action).
    route: dict[str, str] = field(default_factory=dict)
    # A request split for a channel that takes less at once (a batch of
    # embeddings): each part's body, in order; empty: ``raw_body`` whole.
    parts: tuple[bytes, ...] = ()

    @property
    def prompt_tokens_estimate(self) -> int:
        return estimate_tokens(self.prompt_chars)


# Client headers a provider's SDK relies on; everything else stays here.
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta", "user-agent")


def forwarded_headers(client_headers: dict[str, str]) -> dict[str, str]:
    # HTTP header values are ASCII; a client's stray non-ASCII User-Agent is
    # dropped rather than allowed to break the upstream request.
    return {
        name: client_headers[name]
        for name in FORWARDED_HEADERS
        if name in client_headers and client_headers[name].isascii()
    }


def whole_number(value: Any) -> int | None:
    """A positive integer the request gave, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def dumps(obj: Any) -> bytes:
    """Compact JSON, UTF-8 as it is (the providers' own style)."""
    return orjson.dumps(obj)


def prompt_text_chars(value: Any, depth: int = 0) -> int:
    """Characters of prompt text in any nesting of strings, lists and dicts,
    counting only text-bearing fields (so image data and schemas do not count).
    Text nested past MAX_DEPTH is refused (``ValueError``: the request is
    malformed), as no JSON writer could send it on; the bound also keeps the
    recursion far from Python's own limit. Recursive, with strings counted
    in place: it reads every request's messages (a walk with a stack of
    tuples took 1.6x as long)."""
    if isinstance(value, str):
        return len(value)
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    total = 0
    if isinstance(value, list):
        for item in value:
            total += len(item) if isinstance(item, str) else prompt_text_chars(item, depth + 1)
    elif isinstance(value, dict):
        for key in TEXT_KEYS:
            if key in value:
                item = value[key]
                total += len(item) if isinstance(item, str) else prompt_text_chars(item, depth + 1)
    return total


# orjson writes 255 levels at most: a body deeper than that can be read but
# never sent on (translated, or its model renamed).
MAX_DEPTH = 250
TEXT_KEYS = ("content", "text", "parts", "input", "output", "arguments")


# What a request's input that is not text may cost (G7), for the reservation
# only: images bill at most about 1,600 tokens on Anthropic, 2,500 on OpenAI's
# patch-based models and 258 a tile on Gemini, so one image is reserved at the
# largest; a file or audio part sent inline counts its data as text would
# (its base64 characters / 4, which is above what the decoded bytes bill), and
# never less than an image; a tool definition counts its JSON as text, plus
# the tool-use preamble the providers add (Anthropic's is several hundred).
MEDIA_TOKENS = 2_500
TOOLS_PREAMBLE_TOKENS = 1_000
# Keys of a content part that carry non-text input in any of the grammars.
MEDIA_KEYS = frozenset({"image_url", "input_audio", "file", "source", "inline_data", "inlineData", "file_data",
                        "fileData", "image", "document", "file_id", "file_url", "file_data_url"})
MEDIA_TYPES = frozenset({"image", "image_url", "input_image", "document", "file", "input_file", "input_audio",
                         "audio"})
# Request fields holding tool definitions or output schemas, billed as input
# (Responses puts its output schema in ``text``).
SCHEMA_KEYS = ("tools", "functions", "response_format", "text", "tool_config", "toolConfig")


def nontext_tokens(body: Any) -> int:
    """A worst-case estimate of the input tokens in ``body`` that
    ``prompt_text_chars`` does not count: images, files, audio and tool
    schemas (G7). Reservation only: billing uses the provider's count."""
    if not isinstance(body, dict):
        return 0
    tokens = 0
    for key in SCHEMA_KEYS:
        value = body.get(key)
        if isinstance(value, (list, dict)) and value:
            tokens += estimate_tokens(json_chars(value))
            if key in ("tools", "functions"):
                tokens += TOOLS_PREAMBLE_TOKENS
    # Media sits in the conversation, never in the schemas counted above: those are not walked again.
    pending: list[Any] = [value for key, value in body.items() if key not in SCHEMA_KEYS]
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(item for item in value if isinstance(item, (list, dict)))
        elif isinstance(value, dict):
            if value.get("type") in MEDIA_TYPES or not MEDIA_KEYS.isdisjoint(value):
                tokens += max(MEDIA_TOKENS, estimate_tokens(longest_string(value)))
            else:
                pending.extend(item for item in value.values() if isinstance(item, (list, dict)))
    return tokens


def json_chars(value: Any) -> int:
    """The characters of ``value`` written as JSON; past what a JSON writer
    takes (255 levels), about as many, counted by hand."""
    try:
        return len(dumps(value))
    except orjson.JSONEncodeError:
        pass
    chars = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            chars += len(item) + 2
        elif isinstance(item, dict):
            chars += 2 + sum(len(key) + 4 for key in item)
            pending.extend(item.values())
        elif isinstance(item, list):
            chars += 2 + len(item)
            pending.extend(item)
        else:
            chars += 5
    return chars


def longest_string(value: Any) -> int:
    longest = 0
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            longest = max(longest, len(item))
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return longest


class StreamWatcher:
    """Watches one attempt's events: marks them, collects usage and the text
    already sent, assembles a non-streaming body, renders in-stream errors."""

    def __init__(self, facts: RequestFacts) -> None:
        self.facts = facts
        self.content_type = "text/event-stream"
        self.usage = Usage()
        self.sent_chars = 0
        # Only an answer the client takes whole is assembled (F4). A stream's
        # text is counted as it passes, never kept: kept, a long answer would
        # hold tens of bytes a token for as long as its stream is open.
        self.assembles = not facts.stream
        self.busy_error = False
        # Id of provider-held state this stream created (P9), e.g. a response id.
        self.state_id: str | None = None

    def mark(self, event: Event) -> int:
        raise NotImplementedError

    def client_bytes(self, event: Event) -> bytes:
        """What the client receives for a forwarded event: its own bytes."""
        return event.raw

    def stream_error(self, kind: ErrorKind, message: str) -> bytes:
        raise NotImplementedError

    def assembled_body(self) -> bytes:
        """The provider's non-streaming JSON for everything watched so far."""
        raise NotImplementedError

    def end_of_stream(self) -> bytes:
        return b""


class Api:
    name: ClassVar[ApiName]  # the API a client called
    wire: ClassVar[WireGrammar]  # the protocol of the channels that serve it
    operation: ClassVar[Operation]  # what it asks of a channel (providers.kind)
    keepalive: ClassVar[bytes] = b": hopbase-keepalive\n\n"
    watcher: ClassVar[type[StreamWatcher]]
    # False: the channel answers with one JSON body, not an event stream.
    upstream_streams: ClassVar[bool] = True
    # The request field that names provider state (``RequestFacts.affinity_key``), if any.
    state_field: ClassVar[str] = ""
    # False: the model is named in the URL, not in the body (Gemini).
    model_in_body: ClassVar[bool] = True

    def with_model(self, facts: RequestFacts, model: str) -> RequestFacts:
        """The same request for a channel that knows the model as ``model``
        (an alias, ``public=upstream``)."""
        if model == facts.model:
            return facts
        if not self.model_in_body:
            return replace(facts, model=model, route={**facts.route, "model": model})
        body = {**facts.body, "model": model}
        return replace(facts, model=model, body=body, raw_body=dumps(body))

    def slow_start_applies(self, model: str, facts: RequestFacts) -> bool:
        """F3: Claude models without extended thinking must start within a
        limit (``model`` is the name the channel is sent)."""
        # Bedrock names Claude by its vendor (anthropic.claude-…, or an
        # inference profile: us.anthropic.claude-…).
        claude = model.startswith("claude") or "anthropic.claude" in model
        return claude and not facts.thinking

    def parse(self, body: Any, raw_body: bytes, route: dict[str, str]) -> RequestFacts:
        raise NotImplementedError

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        """What this request asks of a channel that speaks this API's grammar
        (its kind then addresses it: providers.kinds)."""
        raise NotImplementedError

    def output_cap(self, facts: RequestFacts) -> int | None:
        """The most output tokens the request allows, where it says (G2, G5)."""
        return None

    def choices(self, facts: RequestFacts) -> int:
        """How many answers the request asks for, each up to its output cap (G7)."""
        return 1

    def surcharges(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Surcharge]:
        """What the request's body switches on that a channel bills beyond
        its tokens (B10, ``core.surcharges``; priced beta headers are every
        API's, ``beta_surcharges``)."""
        return []

    def upstream_calls(self, facts: RequestFacts, client_headers: dict[str, str]) -> list[Call]:
        """The calls this request is to a channel: one, or one per part."""
        call = self.upstream_call(facts, client_headers)
        if not facts.parts:
            return [call]
        return [replace(call, content=part) for part in facts.parts]

    def upstream_failure(self, status: int, body: bytes, retry_after: int | None) -> UpstreamFailure:
        return failure_from_status(status, retry_after=retry_after)

    def error_body(self, error: GatewayError) -> tuple[int, bytes]:
        raise NotImplementedError

    def model_entry(self, model: str, embeds: bool = False) -> dict[str, Any]:
        """One model as the SDK's model list and model lookup show it
        (``embeds``: a model served for embeddings)."""
        raise NotImplementedError

    def models_body(self, models: list[str], embedding: Collection[str] = ()) -> bytes:
        raise NotImplementedError

    def new_watcher(self, facts: RequestFacts) -> StreamWatcher:
        return self.watcher(facts)

    @staticmethod
    def require_model(body: Any) -> str:
        if not isinstance(body, dict):
            raise GatewayError(ErrorKind.MALFORMED, "The request body must be a JSON object.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise GatewayError(ErrorKind.MALFORMED, "`model` is required and must be a string.")
        return model

    @staticmethod
    def require_list(body: dict[str, Any], name: str) -> list[Any]:
        value = body.get(name)
        if not isinstance(value, list):
            raise GatewayError(ErrorKind.MALFORMED, f"`{name}` is required and must be an array.")
        return value

    @staticmethod
    def stream_flag(body: dict[str, Any]) -> bool:
        stream = body.get("stream", False)
        if stream is None:
            return False
        if not isinstance(stream, bool):
            raise GatewayError(ErrorKind.MALFORMED, "`stream` must be a boolean.")
        return stream
