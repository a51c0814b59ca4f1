"""How one request reaches each candidate channel: a *leg* per channel.

The channel's protocol matches the client's: the request goes through as it
is (only the model renamed for an alias) and the answer comes back byte for
byte. Otherwise the request is decoded once into the neutral form, encoded
for the channel's protocol, and the answer translated back event by event
(``TranslatingWatcher``). Provider state (``previous_response_id``,
``cachedContent``, Gemini cache creation) never leaves its own protocol.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from channels_pool.kinds import Operation
from channels_pool.selection import ChannelInfo
from core import loggers
from core.errors import GatewayError
from core.vocabulary import ApiName, WireProtocol
from hopbase.protocols import CHAT, CONVERSE, GEMINI, MESSAGES, RESPONSES
from hopbase.protocols.base import Api, RequestFacts, StreamWatcher
from hopbase.translation import (
    anthropic_request,
    chat_request,
    converse_request,
    gemini_request,
    responses_request,
    responses_upstream,
)
from hopbase.translation.anthropic_stream import AnthropicReader, AnthropicWriter
from hopbase.translation.base import Leg, Reader, Writer
from hopbase.translation.chat_stream import ChatReader, ChatWriter
from hopbase.translation.converse_stream import ConverseReader
from hopbase.translation.embeddings import EmbeddingLegs
from hopbase.translation.gemini_stream import GeminiReader, GeminiWriter
from hopbase.translation.neutral import CannotServe, Conversation
from hopbase.translation.responses_stream import ResponsesWriter
from hopbase.translation.responses_upstream import ResponsesReader
from hopbase.translation.sealed import unsealed
from hopbase.translation.watcher import TranslatingWatcher

DECODERS: dict[ApiName, Callable[[RequestFacts], Conversation]] = {
    ApiName.CHAT: chat_request.decode,
    ApiName.RESPONSES: responses_request.decode,
    ApiName.MESSAGES: anthropic_request.decode,
    ApiName.GEMINI: gemini_request.decode,
}
WRITERS: dict[ApiName, type[Writer]] = {
    ApiName.CHAT: ChatWriter,
    ApiName.RESPONSES: ResponsesWriter,
    ApiName.MESSAGES: AnthropicWriter,
    ApiName.GEMINI: GeminiWriter,
}


@dataclass(frozen=True)
class ChannelSide:
    """A wire protocol as a translation target: the Api that addresses its
    channels (an ``openai`` channel is called with Chat Completions), its
    encoder and its reader."""

    api: Api
    encode: Callable[[Conversation, str], RequestFacts]
    reader: type[Reader]


# A model an OpenAI or Azure channel serves on the Responses API alone.
RESPONSES_SIDE = ChannelSide(RESPONSES, responses_upstream.encode, ResponsesReader)
CHANNEL_SIDES: dict[str, ChannelSide] = {
    WireProtocol.OPENAI: ChannelSide(CHAT, chat_request.encode, ChatReader),
    WireProtocol.ANTHROPIC: ChannelSide(MESSAGES, anthropic_request.encode, AnthropicReader),
    WireProtocol.GEMINI: ChannelSide(GEMINI, gemini_request.encode, GeminiReader),
    WireProtocol.CONVERSE: ChannelSide(CONVERSE, converse_request.encode, ConverseReader),
}
ALL_WIRES = frozenset(CHANNEL_SIDES)
log = logging.getLogger(loggers.TRANSLATION)


class Legs:
    """The legs of one request (its neutral form decoded, and its own
    protocol's form cleaned, at most once)."""

    def __init__(self, api: Api, facts: RequestFacts, request_id: str) -> None:
        self.api = api
        self.facts = facts
        self.request_id = request_id
        self._decoded: Conversation | None = None
        self._unsealed: RequestFacts | None = None

    @staticmethod
    def grammar(channel: ChannelInfo, model: str) -> str | None:
        """The grammar ``channel`` would be reached in (``wires()`` holds those that may serve)."""
        return channel.grammar(model)

    def wires(self) -> frozenset[str]:
        """The channel protocols that may serve this request."""
        if self.facts.affinity_key or self.api.name not in DECODERS or not self.api.upstream_streams:
            return frozenset((self.api.wire,))
        return ALL_WIRES

    def to(self, channel: ChannelInfo) -> Leg:
        """The leg to ``channel``; raises ``CannotServe`` when its protocol
        cannot express the request."""
        model = channel.upstream_model(self.facts.model)
        grammar = channel.kind.grammar(model)
        side = CHANNEL_SIDES[grammar]
        if grammar == WireProtocol.OPENAI and responses_only(channel, model):
            side = RESPONSES_SIDE  # a Chat client too is translated: the model refuses Chat Completions
        # A client of the channel's own grammar passes through, unless the model takes Responses alone and
        # the client is a Chat one.
        native = grammar == self.api.wire and not (side is RESPONSES_SIDE and self.api is not RESPONSES)
        api = self.api if native else side.api
        if not channel.kind.serves(api.operation):
            raise CannotServe("model", f"A {channel.protocol} channel cannot take this request.")
        if api is self.api:
            facts = self.api.with_model(self._passed_through(), model)
            return Leg(self.api, facts, lambda: self.api.new_watcher(facts))
        try:
            facts = side.encode(self._conversation(), model)
        except GatewayError as error:
            # Unreadable for translation, or not what this protocol can take
            # (a Gemini tool result with no name, say): another candidate,
            # of the client's own protocol perhaps, may still serve it.
            raise CannotServe(error.param or "body", error.message) from None
        except (orjson.JSONEncodeError, RecursionError):
            # JSON readers take 1,024 levels, its writer 255: a body deeper
            # than that can pass through, never be written anew.
            raise CannotServe("body", TOO_DEEP) from None
        writer = WRITERS[self.api.name]

        def new_watcher() -> StreamWatcher:
            channel_watcher = side.api.new_watcher(facts)
            return TranslatingWatcher(channel_watcher, side.reader(), writer(self.facts, self.facts.model, self.request_id))

        return Leg(side.api, facts, new_watcher)

    def _passed_through(self) -> RequestFacts:
        """The request as it goes to a channel of its own protocol (made once)."""
        if self._unsealed is None:
            self._unsealed = unsealed(self.api.name, self.facts)
        return self._unsealed

    def _conversation(self) -> Conversation:
        if self._decoded is None:
            self._decoded = DECODERS[self.api.name](self.facts)
        return self._decoded


# Models learned to be served on Responses alone (the channel refused Chat
# Completions for them), by (channel id, upstream name): this process's.
_learned_responses_only: set[tuple[int, str]] = set()


def responses_only(channel: ChannelInfo, model: str) -> bool:
    return model in channel.responses_only or (channel.id, model) in _learned_responses_only


def learn_responses_only(channel: ChannelInfo, model: str) -> None:
    """The channel refused Chat Completions for ``model`` as served on
    Responses alone: from now on this process reaches it there."""
    if (channel.id, model) not in _learned_responses_only:
        _learned_responses_only.add((channel.id, model))
        log.warning("channel %s serves %s on the Responses API only: reached there from now on in this process "
                    "(mark it Responses-only on the channel to keep it so)", channel.name, model)


TOO_DEEP = "The request is nested too deeply to be sent on to a model provider (255 levels at most)."


def legs_for(api: Api, facts: RequestFacts, request_id: str) -> Legs | EmbeddingLegs:
    """The legs of one request: a generation's, or an embeddings request's."""
    if api.operation is Operation.EMBED:
        return EmbeddingLegs(api, facts, request_id)
    return Legs(api, facts, request_id)
