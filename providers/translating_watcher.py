"""A translated attempt's watcher: the channel protocol's own watcher marks
each event and reads its usage and errors exactly; the channel protocol's
``Reader`` says what content the event carries; the client API's ``Writer``
turns that into the client's bytes. To the relay it is one more
``StreamWatcher``."""

from __future__ import annotations

from core.errors import ErrorKind
from core.sse import Event
from core.usage import Usage
from providers.base import Mark, StreamWatcher
from providers.neutral import Piece
from providers.translation import Reader, Writer

NO_PIECES: list[Piece] = []


class TranslatingWatcher(StreamWatcher):
    def __init__(self, channel: StreamWatcher, reader: Reader, writer: Writer) -> None:
        # No super().__init__: usage, characters and errors are the channel
        # watcher's own, read through the properties below.
        self.facts = writer.facts
        self.content_type = writer.content_type
        self.state_id = None  # state a channel holds is not the client API's to name
        self.channel = channel
        self.reader = reader
        self.writer = writer
        self._pieces = NO_PIECES

    @property
    def usage(self) -> Usage:  # type: ignore[override]
        return self.channel.usage

    @property
    def sent_chars(self) -> int:  # type: ignore[override]
        return self.channel.sent_chars

    @property
    def busy_error(self) -> bool:  # type: ignore[override]
        return self.channel.busy_error

    def mark(self, event: Event) -> int:
        mark = self.channel.mark(event)
        if mark & Mark.ERROR:
            return mark
        self._pieces = self.reader.read(event)
        # The channel's own usage chunk is read above; to the client it is
        # nothing (the writer renders usage in its own format).
        return mark & ~Mark.DROP

    def client_bytes(self, event: Event) -> bytes:
        pieces, self._pieces = self._pieces, NO_PIECES
        return self.writer.write(pieces) if pieces else b""

    def end_of_stream(self) -> bytes:
        return self.writer.finish(self.usage)

    def stream_error(self, kind: ErrorKind, message: str) -> bytes:
        return self.writer.error(kind, message)

    def assembled_body(self) -> bytes:
        return self.writer.body(self.usage)
