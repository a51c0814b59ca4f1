"""What every wire format shares: the answer to render, its events, the base renderer.

A ``Script`` is one answer, protocol-neutral: its thinking and text tokens,
whether it ends in a tool call, and its usage. A ``Renderer`` subclass per
protocol (``openai``, ``anthropic``, ``gemini`` beside this module) turns it
into ``Event`` bytes. The vocabularies here are what every answer is made of.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city":"Paris","unit":"celsius"}'
# Three fragments, like a model streams them; joined they are TOOL_ARGUMENTS.
TOOL_FRAGMENTS = ('{"city":', '"Paris",', '"unit":"celsius"}')

# Multi-byte words on purpose: relays that split or re-encode UTF-8 badly,
# or estimate tokens from characters, give themselves away.
TEXT_WORDS = (
    "héllo", "world", "日本語", "🚀", "naïve", "quick", "Привет", "café",
    "données", "über", "स्वागत", "fox", "Ελλάδα", "brown", "🙂", "tschüß",
)
THINKING_WORDS = ("hmm", "considérons", "思考", "🤔", "step", "réfléchir", "then", "Überlegung")

PREAMBLE = "preamble"
TOKEN = "token"
FRAME = "frame"

OVERLOADED = "overloaded"
SERVER = "server"


def deltas(count: int, vocabulary: tuple[str, ...]) -> tuple[str, ...]:
    """Token i of an answer, each carrying the space that separates it from the previous one."""
    return tuple((" " if i else "") + vocabulary[i % len(vocabulary)] for i in range(count))


@dataclass(frozen=True)
class Script:
    """Everything one answer contains; protocol-neutral."""

    model: str
    thinking: tuple[str, ...]
    text: tuple[str, ...]
    tool: bool
    input_tokens: int
    stem: str  # the id every protocol-specific id is built from
    created: int
    cached: int = 0
    cache_write: int = 0
    crlf: bool = False
    include_usage: bool = False  # Chat: stream_options.include_usage
    sse: bool = True  # Gemini: ?alt=sse, else the JSON array form
    request: Mapping[str, Any] | None = None
    # The output count the usage reports instead of the true one: a
    # misbehaving provider's (negative, or far too large).
    reported_output: int | None = None

    @property
    def output_tokens(self) -> int:
        if self.reported_output is not None:
            return self.reported_output
        return len(self.thinking) + len(self.text)

    @property
    def full_text(self) -> str:
        return "".join(self.text)

    @property
    def full_thinking(self) -> str:
        return "".join(self.thinking)

    @property
    def has_text_block(self) -> bool:
        # A bare tool call has no text part; an answer with neither still has an empty one.
        return bool(self.text) or not self.tool


@dataclass(frozen=True)
class Event:
    data: bytes
    kind: str  # PREAMBLE, TOKEN (one text or thinking token) or FRAME


def dump(payload: object) -> str:
    # Providers send raw UTF-8, not \u escapes; compact separators like OpenAI.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def simulated_message(status: int | None, kind: str | None = None) -> str:
    what = f"status {status}" if status else f"{kind} error"
    return f"simulated upstream failure ({what}), requested by a [sim] directive"


class Renderer:
    protocol = ""
    # The request grammar this renderer answers: its own protocol, except on
    # clouds (``azure-chat`` answers ``chat``, ``bedrock-converse`` ``converse``).
    grammar = ""
    request_id_header = "x-request-id"
    stream_content_type = "text/event-stream"
    json_content_type = "application/json"

    def __init__(self, script: Script) -> None:
        self.script = script
        self.nl = "\r\n" if script.crlf else "\n"

    def sse(self, payload: object, event: str | None = None) -> bytes:
        head = f"event: {event}{self.nl}" if event else ""
        return f"{head}data: {dump(payload)}{self.nl}{self.nl}".encode()

    def events(self) -> list[Event]:
        raise NotImplementedError

    def body(self) -> dict[str, Any]:
        raise NotImplementedError

    def stream_error(self, kind: str, events_written: int) -> bytes:
        raise NotImplementedError

    def error_status(self, kind: str) -> int:
        """The HTTP status a non-streaming request gets for a failure of this kind."""
        return 429 if kind == OVERLOADED else 500

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def error_headers(self, status: int, reason: str | None = None) -> dict[str, str]:
        """Headers an error answer carries besides its body (Bedrock names its error type in one)."""
        return {}

    def headers(self, stream: bool) -> dict[str, str]:
        """Headers a successful answer carries besides the usual ones."""
        return {}
