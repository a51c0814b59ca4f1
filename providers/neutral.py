"""The neutral form every translation goes through (rules T1–T4).

A request in any client API is *decoded* into a ``Conversation``; a
``Conversation`` is *encoded* into the request body of a channel's protocol.
A channel's stream events are *read* into ``Piece``s; ``Piece``s are
*written* as the client's own event grammar (or assembled into its
non-streaming body). Usage never travels as pieces: the channel protocol's
own ``StreamWatcher`` reads it exactly (``core.usage.Usage``) and the writer
is handed that at the end.

Thinking state a provider hands out (an Anthropic ``signature``, a Responses
``encrypted_content``, a Gemini ``thoughtSignature``) is opaque and only
valid for the protocol that made it: a ``Thinking`` part keeps its ``origin``
so an encoder carries it back to that protocol and drops it for another.
When it travels through a client API of another protocol it is sealed
(``seal``/``unseal``) so that the next turn can tell where it came from.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from core.vocabulary import WireGrammar

# -- request -------------------------------------------------------------


@dataclass
class Text:
    text: str


@dataclass
class Image:
    """An image by URL, or inline as base64 ``data`` with its ``media_type``."""

    url: str | None = None
    media_type: str | None = None
    data: str | None = None


@dataclass
class Thinking:
    """Reasoning a model did on an earlier turn (or is doing, in a stream).

    ``signature`` is the provider's opaque state, meaningful only to
    ``origin``; ``redacted`` thinking carries only that state."""

    text: str = ""
    signature: str | None = None
    origin: WireGrammar | None = None
    redacted: bool = False


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text, as the model produced it


@dataclass
class ToolResult:
    call_id: str
    content: list[Text | Image]
    is_error: bool = False
    name: str | None = None  # the tool's name, where the caller's protocol says it


Part = Text | Image | Thinking | ToolCall | ToolResult


@dataclass
class Message:
    role: str  # "user" or "assistant"
    parts: list[Part]


@dataclass
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass
class ToolChoice:
    mode: str  # "auto", "none", "required" (some tool) or "tool" (the one named)
    name: str | None = None


@dataclass
class OutputFormat:
    """JSON output: any object (``schema`` None) or one matching ``schema``."""

    schema: dict[str, Any] | None = None
    name: str = "response"
    strict: bool = False


class Effort(enum.StrEnum):
    MINIMAL = "minimal"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


# Thinking budgets that stand for each effort, and back (nearest equivalent).
EFFORT_BUDGETS = {Effort.MINIMAL: 1024, Effort.LOW: 2048, Effort.MEDIUM: 8192, Effort.HIGH: 24576}


def effort_for_budget(budget: int) -> Effort:
    for effort in (Effort.MINIMAL, Effort.LOW, Effort.MEDIUM):
        if budget <= EFFORT_BUDGETS[effort]:
            return effort
    return Effort.HIGH


@dataclass
class Reasoning:
    """Thinking asked for: an effort, a token budget, or both (each encoder
    uses what its protocol takes, deriving the other). ``enabled`` False:
    thinking explicitly off."""

    enabled: bool = True
    effort: Effort | None = None
    budget_tokens: int | None = None
    summary: bool = True  # show the thinking (summaries) to the client

    def budget(self) -> int:
        if self.budget_tokens is not None:
            return self.budget_tokens
        return EFFORT_BUDGETS[self.effort or Effort.MEDIUM]

    def level(self) -> Effort:
        if self.effort is not None:
            return self.effort
        return effort_for_budget(self.budget_tokens) if self.budget_tokens is not None else Effort.MEDIUM


@dataclass
class Conversation:
    """One request, whatever API it came in on."""

    model: str  # the public model name the client asked for
    messages: list[Message]
    system: list[str] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    output: OutputFormat | None = None
    reasoning: Reasoning | None = None
    stream: bool = False
    user: str | None = None
    # Caller fields that no other protocol can honour and that would change
    # the answer if dropped (e.g. ``n`` above 1, a provider's built-in tool):
    # every translated channel refuses the request, naming the first.
    untranslatable: list[str] = field(default_factory=list)


def alternating_turns(messages: list[Message], block: Callable[[Part], dict[str, Any] | None],
                      tool_result: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Messages as a protocol of content blocks wants them (Anthropic's,
    Converse's): each part its ``block`` (None: dropped), turns of one role
    merged so roles alternate, and in a user turn the tool results first
    (they answer the turn before)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        blocks = [b for b in (block(p) for p in message.parts) if b is not None]
        if not blocks:
            continue
        if out and out[-1]["role"] == message.role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": message.role, "content": blocks})
    for turn in out:
        if turn["role"] == "user":
            turn["content"].sort(key=lambda b: not tool_result(b))
    return out


class CannotServe(Exception):
    """This channel's protocol cannot express ``field`` of the request
    (another candidate may; if none can, the caller gets a 400 naming it)."""

    def __init__(self, field_name: str, reason: str = "") -> None:
        super().__init__(field_name)
        self.field = field_name
        self.reason = reason or f"`{field_name}` cannot be served by any channel for this model."


# -- response --------------------------------------------------------------


class StopReason(enum.StrEnum):
    END = "end"  # end_turn / stop / STOP
    LENGTH = "length"  # max_tokens / length / MAX_TOKENS
    TOOL_USE = "tool_use"  # tool_use / tool_calls / (Gemini: STOP with a functionCall)
    STOP_SEQUENCE = "stop_sequence"
    CONTENT_FILTER = "content_filter"  # refusal / content_filter / SAFETY…


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingSignature:
    """The opaque state closing the current thinking (origin: the reader's protocol)."""

    signature: str
    origin: WireGrammar


@dataclass(frozen=True, slots=True)
class RedactedThinking:
    data: str
    origin: WireGrammar


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int  # 0, 1, … in order of appearance in this answer
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolArguments:
    index: int
    fragment: str  # a piece of the arguments' JSON text


@dataclass(frozen=True, slots=True)
class Stop:
    reason: StopReason
    stop_sequence: str | None = None


Piece = TextDelta | ThinkingDelta | ThinkingSignature | RedactedThinking | ToolCallStart | ToolArguments | Stop


# -- thinking state across protocols -----------------------------------------

SEAL_PREFIX = "hb1."


def seal(origin: WireGrammar, signature: str) -> str:
    """A provider's thinking state, marked with its origin, for a client API
    of another protocol to hand back on its next turn."""
    payload = orjson.dumps({"o": origin.value, "s": signature})
    return SEAL_PREFIX + base64.urlsafe_b64encode(payload).decode().rstrip("=")


def unseal(value: str) -> tuple[WireGrammar, str] | None:
    """The origin and state inside ``seal``'s output; None for anything else
    (which is then the client API's own protocol's state)."""
    if not value.startswith(SEAL_PREFIX):
        return None
    raw = value[len(SEAL_PREFIX):]
    try:
        payload = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        return WireGrammar(payload["o"]), str(payload["s"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
