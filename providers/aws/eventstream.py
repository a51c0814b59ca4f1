"""AWS's binary event stream (``application/vnd.amazon.eventstream``) read
incrementally into the events the relay already handles.

botocore's ``EventStreamBuffer`` checks each frame's CRCs and parses its
headers; a frame may arrive across any number of reads. Each message becomes
an SSE-shaped ``Event`` in the grammar the channel speaks:

- Converse: ``event: <:event-type>`` with the payload as AWS sent it; an
  exception frame is ``event: exception`` with ``{"exceptionType", "message"}``.
- Anthropic on Bedrock (invoke-with-response-stream): each ``chunk`` carries
  one Anthropic event base64-encoded, and becomes that event exactly as
  Anthropic's own API sends it (``event: <type>`` and its JSON); an exception
  frame becomes Anthropic's ``error`` event (``overloaded_error`` when AWS
  says it is throttling or unavailable, ``api_error`` otherwise).

A frame whose checksum or lengths are wrong cannot be read past: the stream
is cut there (``BrokenStream``), never a crash. Frames read ahead of it are
whole and checked, and their events are handed on first; the cut then comes
with the next read, or the stream's end.
"""

from __future__ import annotations

import base64
import binascii

import orjson
from botocore.eventstream import EventStreamBuffer, ParserError

from core.sse import Event
from providers.kind import BrokenStream

# AWS's exception types that mean "busy", in the casing its frames use (C3).
BUSY_EXCEPTIONS = frozenset(("throttlingException", "serviceUnavailableException"))


class FrameSplitter:
    """Feeds bytes to botocore's buffer; ``event`` makes each message an Event."""

    def __init__(self) -> None:
        self._buffer = EventStreamBuffer()
        self._pending = 0
        self._broken = ""  # why the stream cannot be read on, once a frame could not be

    @property
    def pending_size(self) -> int:
        return self._pending

    def feed(self, chunk: bytes) -> list[Event]:
        if self._broken:
            raise BrokenStream(self._broken)
        self._buffer.add_data(chunk)
        self._pending += len(chunk)
        events: list[Event] = []
        try:
            for message in self._buffer:
                self._pending -= message.prelude.total_length
                headers = message.headers
                kind = headers.get(":message-type")
                if kind == "event":
                    event = self.event(headers.get(":event-type", ""), message.payload)
                elif kind == "exception":
                    event = self.exception(headers.get(":exception-type", ""), _message_of(message.payload))
                else:  # ":message-type error", with its code and text in headers
                    event = self.exception(str(headers.get(":error-code", "")), str(headers.get(":error-message", "")))
                if event is not None:
                    events.append(event)
        except ParserError as error:
            self._broken = f"unreadable event-stream frame: {type(error).__name__}"
            if not events:
                raise BrokenStream(self._broken) from None
        return events

    def finish(self) -> list[Event]:
        if self._broken:
            raise BrokenStream(self._broken)
        if self._pending:
            raise BrokenStream(f"the event stream ended inside a frame ({self._pending} bytes)")
        return []

    def event(self, name: str, payload: bytes) -> Event | None:
        raise NotImplementedError

    def exception(self, kind: str, message: str) -> Event:
        raise NotImplementedError


class ConverseFrames(FrameSplitter):
    def event(self, name: str, payload: bytes) -> Event | None:
        return Event.named(name, payload)

    def exception(self, kind: str, message: str) -> Event:
        return Event.named("exception", orjson.dumps({"exceptionType": kind, "message": message}))


class AnthropicFrames(FrameSplitter):
    def event(self, name: str, payload: bytes) -> Event | None:
        if name != "chunk":
            return None  # no other event type carries the answer
        try:
            data = base64.b64decode(orjson.loads(payload)["bytes"], validate=True)
            parsed = orjson.loads(data)
            kind = parsed["type"]
        except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error):
            raise BrokenStream("a chunk frame that carries no Anthropic event") from None
        return Event.named(str(kind), data, parsed)

    def exception(self, kind: str, message: str) -> Event:
        error_type = "overloaded_error" if kind in BUSY_EXCEPTIONS else "api_error"
        error = {"type": "error", "error": {"type": error_type, "message": message or kind}}
        return Event.named("error", orjson.dumps(error), error)


def _message_of(payload: bytes) -> str:
    try:
        found = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return ""
    message = found.get("message") or found.get("Message") if isinstance(found, dict) else None
    return message if isinstance(message, str) else ""
