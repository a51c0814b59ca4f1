"""Byte-preserving incremental Server-Sent Events splitting (-> relay).

Upstream chunks cut events anywhere: inside a line, inside a multi-byte
character, between ``\\r`` and ``\\n``. ``EventSplitter`` hands back each
complete event as the exact bytes that carried it, blank-line terminator
included, so the relay can pass them on unchanged and insert keep-alive lines
only between whole events.
"""

from __future__ import annotations

from functools import cached_property

import orjson


class Event:
    """One complete SSE event: its raw bytes, and its fields parsed on demand."""

    __slots__ = ("raw", "__dict__")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    @cached_property
    def _fields(self) -> tuple[str | None, str]:
        name: str | None = None
        data: list[str] = []
        for line in self.raw.decode("utf-8", "replace").splitlines():
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value
        return name, "\n".join(data)

    @property
    def name(self) -> str | None:
        return self._fields[0]

    @property
    def data(self) -> str:
        return self._fields[1]

    @cached_property
    def json(self) -> object:
        """The data parsed as JSON, or None when it is not JSON."""
        data = self.data
        if not data or data[0] not in "{[":
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return None

    def __repr__(self) -> str:
        return f"Event({self.raw!r})"


class EventSplitter:
    """Feed raw bytes; get back complete events.

    An event ends at an empty line; a line ends at ``\\r\\n``, ``\\n`` or
    ``\\r``. A ``\\r`` at the very end of the data seen so far may be the first
    half of ``\\r\\n``, so the event is not released until the next byte says.
    """

    def __init__(self) -> None:
        self._buffer = b""
        # Offset where the line being scanned starts (lines before it, back to
        # the start of the buffer, belong to the unfinished event).
        self._line_start = 0

    def feed(self, chunk: bytes) -> list[Event]:
        buffer = self._buffer + chunk
        events: list[Event] = []
        event_start = 0
        pos = self._line_start
        length = len(buffer)
        while pos < length:
            nl = buffer.find(b"\n", pos)
            cr = buffer.find(b"\r", pos)
            if nl == -1 and cr == -1:
                break
            if cr == -1 or (nl != -1 and nl < cr):
                end, after = nl, nl + 1
            elif cr + 1 < length:
                end, after = cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
            else:
                break  # a lone trailing \r: wait for the next byte
            if end == pos:  # an empty line closes the event (or stands alone)
                events.append(Event(buffer[event_start:after]))
                event_start = after
            pos = after
        self._buffer = buffer[event_start:]
        self._line_start = pos - event_start
        return events

    def finish(self) -> list[Event]:
        """At the end of the stream: whatever is left, as a last event."""
        rest, self._buffer, self._line_start = self._buffer, b"", 0
        return [Event(rest)] if rest else []

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished event (what is left when the stream ends)."""
        return self._buffer
