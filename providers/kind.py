"""The one small interface every channel kind implements (rule C1).

A client API (``providers.apis``) says *what* it asks of a channel: a
``Call`` (the operation, the model as the channel knows it, the body). The
channel's kind says *how* that reaches the account: the URL, the
credentials (a header, a signature, a token), the envelope a cloud wants
around the body, how its answer's bytes split into events, and which of its
errors are whose fault. The relay, limits, metering and billing never ask
which kind a channel is.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import httpx

from core.errors import UpstreamFailure
from core.sse import Event, EventSplitter
from core.vocabulary import EmbeddingGrammar, WireGrammar


class Operation(enum.StrEnum):
    """What a client API asks a channel to do, whatever the channel's kind."""

    CHAT = "chat"  # OpenAI Chat Completions, streamed
    RESPONSES = "responses"  # OpenAI Responses, streamed
    MESSAGES = "messages"  # Anthropic Messages, streamed
    GENERATE = "generate"  # Gemini streamGenerateContent
    CACHE = "cache"  # Gemini cachedContents (a whole JSON answer)
    CONVERSE = "converse"  # Bedrock ConverseStream
    EMBED = "embed"  # embeddings (a whole JSON answer), in the grammar ``ChannelKind.embedding_grammar`` names
    # A prompt's tokens, counted by the vendor (a whole JSON answer): the body
    # is the generation's, in the channel's grammar; the answer is that
    # grammar's count (``input_tokens``, ``totalTokens``, ``inputTokens``).
    COUNT = "count"


@dataclass
class Call:
    """One request as its API would send it to the vendor's own endpoint.
    ``content`` is ``body`` encoded (a vendor kind sends it as it is, so a
    client's own bytes pass through); ``headers`` are the client headers the
    provider reads (``anthropic-version``, ``anthropic-beta``, ``user-agent``)."""

    operation: Operation
    model: str
    body: dict[str, Any]
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)
    route: Mapping[str, str] = field(default_factory=dict)  # Gemini's API version


class Splitter(Protocol):
    """Bytes as read from the channel -> whole events (``core.sse.EventSplitter``'s shape)."""

    @property
    def pending_size(self) -> int: ...
    def feed(self, chunk: bytes) -> list[Event]: ...
    def finish(self) -> list[Event]: ...


class BrokenStream(Exception):
    """The channel's framing cannot be read on (a bad checksum): the stream
    is cut there, as if the connection had dropped."""


class AuthFailed(Exception):
    """The channel's credentials could not be turned into a request's
    authorization (a refused token exchange, no AWS credentials). Its text
    is for operators: channel health and the log, never a client."""


# Completes a request's credentials in the attempt's own task, off the
# relay's path: a token from a cache (or one exchange over the given
# client), a signature.
Authorize = Callable[["UpstreamRequest", httpx.AsyncClient], Awaitable[None]]


# A whole answer's body as the relay reads it, from the body and headers the
# channel sent (a cloud that reports usage in a header, say).
AnswerBody = Callable[[bytes, httpx.Headers], bytes]


@dataclass
class UpstreamRequest:
    url: str
    headers: dict[str, str]
    content: bytes
    authorize: Authorize | None = None
    splitter: Callable[[], Splitter] = EventSplitter
    answer: AnswerBody | None = None


class ChannelConfig(Protocol):
    """What a kind reads of a channel (``channels_pool.selection.ChannelInfo``)."""

    id: int
    name: str
    base_url: str
    secret: str
    region: str
    project: str
    location: str
    api_version: str


class Destination(ChannelConfig, Protocol):
    """What a request's legs read of a candidate channel to choose how to
    reach it (``channels_pool.selection.ChannelInfo``)."""

    protocol: str  # its kind's name
    responses_only: frozenset[str]

    @property
    def kind(self) -> ChannelKind: ...
    def upstream_model(self, model: str) -> str: ...
    def grammar(self, model: str) -> str: ...


# How an HTTP error answer (status, body, retry-after) counts for failover.
ClassifyFailure = Callable[[int, bytes, "int | None"], UpstreamFailure]


class ConfigError(ValueError):
    """A channel's settings this kind cannot use; ``field`` names the setting."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name
        self.message = message


class ChannelKind:
    name: ClassVar[str]
    # The settings beside base URL and secret this kind reads (admin, addchannel).
    settings: ClassVar[tuple[str, ...]] = ()
    # False: the kind needs no secret (a cloud's own credential chain may serve).
    secret_required: ClassVar[bool] = True

    def grammar(self, model: str) -> WireGrammar:
        """The grammar the channel speaks for ``model`` (the name it is sent)."""
        raise NotImplementedError

    def embedding_grammar(self, model: str) -> EmbeddingGrammar | None:
        """The grammar of this kind's embeddings endpoint for ``model``; None
        where the kind has no embeddings for it."""
        return None

    def serves(self, operation: Operation) -> bool:
        """Whether this kind has an endpoint for ``operation`` (a Gemini cache
        lives at Google AI Studio only, say)."""
        return True

    def request(self, channel: ChannelConfig, call: Call) -> UpstreamRequest:
        raise NotImplementedError

    def failure(
        self, channel: ChannelConfig, status: int, body: bytes, retry_after: int | None, grammar: ClassifyFailure
    ) -> UpstreamFailure:
        """An HTTP error answer as failover sees it; ``grammar`` is the
        classification of the grammar's own vendor API."""
        return grammar(status, body, retry_after)

    def check(self, base_url: str, secret: str, settings: Mapping[str, str]) -> None:
        """Raise ``ConfigError`` for settings this kind cannot work with."""


def base(channel: ChannelConfig) -> str:
    return channel.base_url.rstrip("/")


def stream_headers(call: Call) -> dict[str, str]:
    return {**call.headers, "content-type": "application/json", "accept": "text/event-stream"}


def json_headers(call: Call) -> dict[str, str]:
    """Headers for a request answered with one JSON body."""
    return {**call.headers, "content-type": "application/json", "accept": "application/json"}


def unsupported(kind: ChannelKind, call: Call) -> ConfigError:
    # Legs only pair a call with a channel of its grammar: reaching here is a bug.
    return ConfigError("protocol", f"a {kind.name} channel cannot take a {call.operation} request")
