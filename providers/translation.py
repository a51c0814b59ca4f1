"""What each protocol's translator implements (one module pair per protocol:
``<protocol>_request`` decodes and encodes requests, ``<protocol>_stream``
reads a channel's events and writes the client's).

    client body --decode--> Conversation --encode--> channel body
    channel events --Reader--> Pieces --Writer--> client events / body
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.errors import ErrorKind
from core.sse import Event
from core.usage import Usage
from providers.base import Api, RequestFacts, StreamWatcher
from providers.neutral import Piece


@dataclass(frozen=True)
class Leg:
    """One attempt's way to its channel: the Api that addresses the channel
    (and reads its failures), the facts it is sent, and the watcher of its
    answer (made fresh per attempt)."""

    api: Api
    facts: RequestFacts
    new_watcher: Callable[[], StreamWatcher]


class Reader:
    """One channel attempt's events (of one wire protocol) as pieces. The
    channel protocol's own ``StreamWatcher`` marks the same events and reads
    their usage and errors; a reader only says what content they carry."""

    def read(self, event: Event) -> list[Piece]:
        raise NotImplementedError


class Writer:
    """The client's side of one translated answer: its stream events, in the
    exact grammar its SDK parses, or its whole non-streaming body.

    ``facts`` are the client's request facts; ``model`` is the public model
    name the answer must carry; ``request_id`` is HopBase's id for it (ids
    the client sees are made from it, in its API's format)."""

    content_type = "text/event-stream"

    def __init__(self, facts: RequestFacts, model: str, request_id: str) -> None:
        self.facts = facts
        self.model = model
        self.request_id = request_id
        # What only ``body`` needs is kept only for an answer taken whole:
        # a stream's text is written and let go (as the watchers do).
        self.assembles = not facts.stream

    def write(self, pieces: list[Piece]) -> bytes:
        """Stream bytes for these pieces (the client's preamble comes with
        the first bytes that carry content). Also keeps what ``body`` needs."""
        raise NotImplementedError

    def finish(self, usage: Usage) -> bytes:
        """The stream's closing events after the last piece: the final usage,
        the stop reason, the terminal event (and ``[DONE]`` or the like)."""
        raise NotImplementedError

    def error(self, kind: ErrorKind, message: str) -> bytes:
        """The client's in-stream error event (table E); no terminal event follows."""
        raise NotImplementedError

    def body(self, usage: Usage) -> bytes:
        """The whole non-streaming JSON body for everything written."""
        raise NotImplementedError
