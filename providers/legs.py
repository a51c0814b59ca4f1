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

import orjson

from core import loggers
from core.errors import GatewayError
from core.vocabulary import WireGrammar
from providers.apis import RESPONSES
from providers.base import Api, RequestFacts, StreamWatcher
from providers.embedding_legs import EmbeddingLegs
from providers.kind import Destination, Operation
from providers.neutral import CannotServe, Conversation
from providers.registry import CLIENT_SIDES, GRAMMARS, ON_RESPONSES
from providers.sealed import unsealed
from providers.translating_watcher import TranslatingWatcher
from providers.translation import Leg

ALL_WIRES = frozenset(GRAMMARS)
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
    def grammar(channel: Destination, model: str) -> str | None:
        """The grammar ``channel`` would be reached in (``wires()`` holds those that may serve)."""
        return channel.grammar(model)

    def wires(self) -> frozenset[str]:
        """The channel protocols that may serve this request."""
        if self.facts.affinity_key or self.api.name not in CLIENT_SIDES or not self.api.upstream_streams:
            return frozenset((self.api.wire,))
        return ALL_WIRES

    def to(self, channel: Destination) -> Leg:
        """The leg to ``channel``; raises ``CannotServe`` when its protocol
        cannot express the request."""
        model = channel.upstream_model(self.facts.model)
        grammar = channel.kind.grammar(model)
        side = GRAMMARS[grammar]
        if grammar == WireGrammar.OPENAI and responses_only(channel, model):
            side = ON_RESPONSES  # a Chat client too is translated: the model refuses Chat Completions
        # A client of the channel's own grammar passes through, unless the model takes Responses alone and
        # the client is a Chat one.
        native = grammar == self.api.wire and not (side is ON_RESPONSES and self.api is not RESPONSES)
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
        writer = CLIENT_SIDES[self.api.name].writer

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
            self._decoded = CLIENT_SIDES[self.api.name].decode(self.facts)
        return self._decoded


# Models learned to be served on Responses alone (the channel refused Chat
# Completions for them), by (channel id, upstream name): this process's.
_learned_responses_only: set[tuple[int, str]] = set()


def responses_only(channel: Destination, model: str) -> bool:
    return model in channel.responses_only or (channel.id, model) in _learned_responses_only


def learn_responses_only(channel: Destination, model: str) -> None:
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
