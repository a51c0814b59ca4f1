"""Byte-preserving incremental Server-Sent Events splitting (-> relay).

Upstream chunks cut events anywhere: inside a line, inside a multi-byte
character, between ``\\r`` and ``\\n``. ``EventSplitter`` hands back each
complete event as the exact bytes that carried it, blank-line terminator
included, so the relay can pass them on unchanged and insert keep-alive lines
only between whole events.
"""

from __future__ import annotations

import re

import orjson

# SSE lines end at CRLF, LF or CR, and nowhere else (str.splitlines() would
# also split at U+2028 and friends, which JSON strings may hold as they are).
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
# Looked for as a byte value: ``b"\r" in data`` first tries the needle as an
# int, and on Python 3.11 raises and clears a TypeError (with its message
# formatted) before it searches, six times as long for every event.
_CR = 0x0D
_UNSET = object()


class Event:
    """One complete SSE event: its raw bytes, and its fields parsed on demand.

    Every relayed event is looked at, so the fields are read from the bytes
    once, without decoding the whole event, and the JSON is parsed from the
    data's bytes (a replacement character for invalid UTF-8 only when the
    bytes cannot be parsed as they are)."""

    __slots__ = ("raw", "_name", "_data", "_json", "__dict__")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._data: bytes | None = None
        self._json: object = _UNSET

    @classmethod
    def named(cls, name: str, data: bytes, parsed: object = _UNSET) -> Event:
        """An event of our own making from a frame that is not SSE (a cloud's
        binary event stream), as a channel's SSE would carry it; ``parsed``
        is its data's JSON where the maker has it already."""
        event = cls(b"event: " + name.encode() + b"\ndata: " + data + b"\n\n")
        event._name, event._data, event._json = name, data, parsed
        return event

    def _parse(self) -> bytes:
        raw = self.raw
        if raw.startswith(b"data: ") and raw.find(b"\n") == len(raw) - 2 and raw[-1] == 0x0A and _CR not in raw:
            # Most events: one "data: ..." line and a blank one.
            self._name = None
            self._data = data_line = raw[6:-2]
            return data_line
        name: str | None = None
        data: list[bytes] = []
        for line in raw.split(b"\n") if _CR not in raw else _LINE_BREAK.split(raw):
            if not line or line[0] == 0x3A:  # empty, or a ":" comment
                continue
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace")
        self._name = name
        self._data = joined = data[0] if len(data) == 1 else b"\n".join(data)
        return joined

    @property
    def name(self) -> str | None:
        if self._data is None:
            self._parse()
        return self._name

    @property
    def data_bytes(self) -> bytes:
        """The data lines' bytes, joined by ``\\n`` (no decoding)."""
        data = self._data
        return self._parse() if data is None else data

    @property
    def data(self) -> str:
        return self.data_bytes.decode("utf-8", "replace")

    @property
    def json(self) -> object:
        """The data parsed as JSON, or None when it is not JSON."""
        parsed = self._json
        if parsed is not _UNSET:
            return parsed
        data = self._data
        if data is None:
            data = self._parse()
        # OpenAI's end marker looks like an array; failed parses cost far
        # more than this comparison.
        if data[:1] not in (b"{", b"[") or data == b"[DONE]":
            parsed = None
        else:
            try:
                parsed = orjson.loads(data)
            except orjson.JSONDecodeError:
                parsed = _lenient_json(data)
        self._json = parsed
        return parsed

    def __repr__(self) -> str:
        return f"Event({self.raw!r})"


def _lenient_json(data: bytes) -> object:
    """JSON that orjson refused: parsed again with invalid UTF-8 read as
    replacement characters, or None when it is not JSON at all."""
    if data.isascii():
        return None  # no invalid UTF-8 to blame: not JSON
    try:
        return orjson.loads(data.decode("utf-8", "replace"))
    except orjson.JSONDecodeError:
        return None


class EventSplitter:
    """Feed raw bytes; get back complete events.

    An event ends at an empty line; a line ends at ``\\r\\n``, ``\\n`` or
    ``\\r``. A ``\\r`` at the very end of the data seen so far may be the first
    half of ``\\r\\n``, so the event is not released until the next byte says.

    Linear in the bytes fed, however large an event grows (a provider may
    send an image of several MB as one event, in many reads): an unfinished
    event is kept in a ``bytearray`` that each read is appended to, and the
    bytes already known to hold no line break are not searched again.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        # Offset where the line being scanned starts (lines before it, back to
        # the start of the buffer, belong to the unfinished event).
        self._line_start = 0
        # Bytes at the start of the buffer already searched for line breaks.
        self._scanned = 0
        # No \r in the buffer (known without searching it again).
        self._plain = True

    def feed(self, chunk: bytes) -> list[Event]:
        held = self._buffer
        if not held and 0 < chunk.find(b"\n\n") == len(chunk) - 2 and chunk[0] != 0x0A and _CR not in chunk:
            # One whole event, nothing before it (a provider writing its
            # tokens as they come): what every read of a paced stream is.
            return [Event(chunk)]
        if self._plain and _CR not in chunk:
            return self._feed_lf(chunk)
        if held:
            held += chunk
            buffer: bytes | bytearray = held
        else:
            buffer = chunk  # the common case: nothing pending, no copy
        events: list[Event] = []
        event_start = 0
        pos = self._line_start
        length = len(buffer)
        # The next \n and \r at or after pos, each looked for again only
        # once passed: a chunk of many events (and usually no \r at all) is
        # scanned once, not once per line.
        look = max(pos, self._scanned)
        nl = buffer.find(b"\n", look)
        cr = buffer.find(b"\r", look)
        scanned = length
        while pos < length:
            if nl != -1 and nl < pos:
                nl = buffer.find(b"\n", pos)
            if cr != -1 and cr < pos:
                cr = buffer.find(b"\r", pos)
            if nl == -1 and cr == -1:
                break
            if cr == -1 or (nl != -1 and nl < cr):
                end, after = nl, nl + 1
            elif cr + 1 < length:
                end, after = cr, cr + 2 if buffer[cr + 1] == 0x0A else cr + 1
            else:
                scanned = cr  # a lone trailing \r: wait for the next byte
                break
            if end == pos:  # an empty line closes the event (or stands alone)
                raw = buffer[event_start:after]
                events.append(Event(raw if buffer is chunk else bytes(raw)))
                event_start = after
            pos = after
        if buffer is held:
            del held[:event_start]
        elif event_start < length:
            held += memoryview(chunk)[event_start:]
        self._line_start = pos - event_start
        self._scanned = scanned - event_start
        self._plain = not held
        return events

    def _feed_lf(self, chunk: bytes) -> list[Event]:
        """``feed`` where every line ends at ``\\n`` (what providers send): an
        event ends at the first ``\\n\\n`` after its start, or is a blank
        line of its own; one search per event, and the events of a read are
        slices of it, not copies out of the buffer."""
        held = self._buffer
        events: list[Event] = []
        start = 0
        if held:
            # The pending event's blank line may straddle the two reads.
            if held[-1] == 0x0A and chunk[:1] == b"\n":
                start = 1
            else:
                found = chunk.find(b"\n\n")
                if found == -1:
                    self._hold(chunk, 0)
                    return events
                start = found + 2
            held += memoryview(chunk)[:start]
            events.append(Event(bytes(held)))
            held.clear()
        length = len(chunk)
        while start < length:
            if chunk[start] == 0x0A:
                end = start + 1
            else:
                found = chunk.find(b"\n\n", start)
                if found == -1:
                    break
                end = found + 2
            events.append(Event(chunk[start:end]))
            start = end
        self._hold(chunk, start)
        return events

    def _hold(self, chunk: bytes, start: int) -> None:
        """Keep ``chunk[start:]``, the start of an event, for the next read,
        its lines all searched (for the general ``feed`` to go on from)."""
        held = self._buffer
        before = len(held)
        if start < len(chunk):
            held += memoryview(chunk)[start:]
        last_break = chunk.rfind(b"\n", start)
        if last_break != -1:
            self._line_start = before + last_break + 1 - start
        elif not before:
            self._line_start = 0
        self._scanned = len(held)
        self._plain = True

    def finish(self) -> list[Event]:
        """At the end of the stream: whatever is left, as a last event."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._line_start = self._scanned = 0
        self._plain = True
        return [Event(rest)] if rest else []

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished event (what is left when the stream ends)."""
        return bytes(self._buffer)

    @property
    def pending_size(self) -> int:
        """How many bytes ``pending`` holds (without copying them)."""
        return len(self._buffer)
