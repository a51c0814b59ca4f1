"""What a request to the upstream simulator asks for: its directives and its prompt.

Directives make one request (or one channel) misbehave on purpose. They are
merged from three places, later ones overriding earlier ones:

1. the API key, when it reads ``sim:k=v,k=v`` (one misbehaving *channel*),
   or the cloud credential standing for it (a Bedrock session token or API
   key, a Vertex service account's client_email: ``cloud_auth``);
2. ``[sim k=v k=v]`` anywhere in the prompt text (any protocol, any text part);
3. the ``x-sim: k=v k=v`` request header.

Keys: tokens, thinking, tool, pace, first_delay, status, reason, retry_after,
error_after_preamble, error_after, error_kind, stall_after, cut_after, split,
crlf, pause_mid_event, pause_at, gate_at, tag, id, created, cached, cache_write,
report_output (the output count the usage reports, any integer, negative too),
responses_only (Chat Completions refused as OpenAI refuses it for the gpt-5-codex class),
and for the clouds (``simulator.clouds``): content_filter,
filter_finish (Azure), exception_after, exception, bad_crc_after (Bedrock).
Unknown keys and malformed values are ignored, so a request always gets an answer.

``exception_after=N`` and ``bad_crc_after=N`` are Bedrock's spellings of
``error_after=N``: the failure at token N is then the exception message
``exception`` names (``throttlingException``, ``serviceUnavailableException``,
``modelStreamErrorException``, ``internalServerException``,
``validationException``), or a frame with a broken CRC. On other protocols
they are plain ``error_after``.

``gate_at=N`` (with a ``tag``) makes a stream wait before its content token N
(0: the first) until ``POST /_sim/release?tag=…`` arrives (or the caller
hangs up): a test can hold the second token until its client has received
the first, and so show that nothing between them buffers, by the order of
events rather than by timing.

A request for several answers (Chat's ``n``, Gemini's ``candidateCount``)
gets one answer as long as all of them together, and is billed so.

The prompt text is also what input tokens are counted from: one
whitespace-separated word is one token, on purpose unlike the gateway's
four-characters-per-token estimate, so tests can tell reported usage from
estimated usage.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simulator import wire
from simulator.http import Request
from simulator.wire import OVERLOADED, SERVER
from simulator.wire.converse import converse_texts

_TEXT_DIRECTIVE = re.compile(r"\[sim\b([^\]]*)\]")


def parse_pairs(raw: str) -> dict[str, str]:
    """``k=v`` pairs separated by spaces or commas; anything else is ignored."""
    pairs: dict[str, str] = {}
    for piece in re.split(r"[\s,]+", raw):
        key, eq, value = piece.partition("=")
        if eq and key:
            pairs[key.lower()] = value
    return pairs


def api_key_of(headers: dict[str, str], query: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return (headers.get("x-api-key") or headers.get("api-key") or headers.get("x-goog-api-key") or query.get("key")
            or auth or None)


def gather_directives(api_key: str | None, texts: list[str], header: str | None) -> dict[str, str]:
    merged: dict[str, str] = {}
    if api_key and api_key.startswith("sim:"):
        merged.update(parse_pairs(api_key[4:]))
    for text in texts:
        for match in _TEXT_DIRECTIVE.finditer(text):
            merged.update(parse_pairs(match.group(1)))
    if header:
        merged.update(parse_pairs(header))
    return merged


def _number(raw: dict[str, str], key: str, kind: Callable[[str], Any], default: Any = None) -> Any:
    # A malformed value is ignored like an unknown key: the request still gets an answer.
    try:
        value = kind(raw[key])
    except (KeyError, ValueError):
        return default
    return max(value, 0) if value == value else default  # NaN -> default


def _signed(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _flag(raw: dict[str, str], key: str) -> bool | None:
    value = raw.get(key, "").lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


def _seed(value: str | None) -> int | str | None:
    # An integer seed splits exactly as random.Random(int) would, for a test that wants to predict it.
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def _kind(value: str | None) -> str | None:
    if value is None:
        return None
    return OVERLOADED if value.lower() == OVERLOADED else SERVER


@dataclass(frozen=True)
class Directives:
    tokens: int = 12
    thinking: int = 0
    tool: bool = False
    pace: float = 0.0
    first_delay: float = 0.0
    status: int | None = None
    reason: str | None = None
    retry_after: str | None = None
    error_after_preamble: str | None = None
    error_after: int | None = None
    error_kind: str = SERVER
    stall_after: int | None = None
    cut_after: int | None = None
    split: int | str | None = None
    crlf: bool | None = None
    pause_mid_event: float = 0.0
    # Which content token's event the pause falls in (0: the first). A gateway
    # holds back the stream until the first token, so keep-alives can only
    # be seen in a pause after it.
    pause_at: int = 0
    gate_at: int | None = None  # needs a tag: the release names it
    tag: str | None = None
    id: str | None = None
    created: int | None = None
    cached: int = 0
    cache_write: int = 0
    report_output: int | None = None
    responses_only: bool = False
    content_filter: bool = False  # Azure: refuse the prompt (400 content_filter)
    filter_finish: bool = False  # Azure: end with finish_reason content_filter
    exception: str | None = None  # Bedrock: the exception type of the failure at token N
    bad_crc: bool = False  # Bedrock: that failure is a frame with a wrong CRC

    @classmethod
    def from_raw(cls, raw: dict[str, str]) -> Directives:
        status = _number(raw, "status", int)
        error_after = _number(raw, "error_after", int)
        bad_crc_after = _number(raw, "bad_crc_after", int)
        for alias in (_number(raw, "exception_after", int), bad_crc_after):
            error_after = alias if error_after is None else error_after
        return cls(
            tokens=_number(raw, "tokens", int, 12),
            thinking=_number(raw, "thinking", int, 0),
            tool=bool(_flag(raw, "tool")),
            pace=_number(raw, "pace", float, 0.0),
            first_delay=_number(raw, "first_delay", float, 0.0),
            status=status if status and 100 <= status <= 599 and status != 200 else None,
            reason=raw.get("reason") or None,
            retry_after=raw.get("retry_after") or None,
            error_after_preamble=_kind(raw.get("error_after_preamble")),
            error_after=error_after,
            error_kind=_kind(raw.get("error_kind")) or SERVER,
            stall_after=_number(raw, "stall_after", int),
            cut_after=_number(raw, "cut_after", int),
            split=_seed(raw.get("split")),
            crlf=_flag(raw, "crlf"),
            pause_mid_event=_number(raw, "pause_mid_event", float, 0.0),
            pause_at=_number(raw, "pause_at", int, 0),
            gate_at=_number(raw, "gate_at", int) if raw.get("tag") else None,
            tag=raw.get("tag") or None,
            id=raw.get("id") or None,
            created=_number(raw, "created", int),
            cached=_number(raw, "cached", int, 0),
            cache_write=_number(raw, "cache_write", int, 0),
            report_output=_signed(raw.get("report_output")),
            responses_only=bool(_flag(raw, "responses_only")),
            content_filter=bool(_flag(raw, "content_filter")),
            filter_finish=bool(_flag(raw, "filter_finish")),
            exception=raw.get("exception") or None,
            bad_crc=bad_crc_after is not None,
        )

    def generation_time(self, tokens: int) -> float:
        """How long producing the first ``tokens`` tokens takes when streamed."""
        return 0.0 if tokens == 0 else self.first_delay + self.pace * (tokens - 1)


def count_words(texts: list[str]) -> int:
    # The simulator's tokenizer: one whitespace-separated word is one token.
    return sum(len(text.split()) for text in texts)


def _part_texts(value: object) -> list[str]:
    """Text of a string, or of the text parts in a list of content parts."""
    if isinstance(value, str):
        return [value]
    texts: list[str] = []
    if isinstance(value, list):
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
                elif part.get("type") == "tool_result":
                    texts += _part_texts(part.get("content"))
    return texts


def prompt_texts(protocol: str, body: object) -> list[str]:
    """Every piece of prompt text in a request: where directives are looked for and words are counted."""
    if not isinstance(body, dict):
        return []
    protocol = wire.grammar(protocol)  # a cloud's requests are written in a vendor's grammar
    if protocol == "converse":
        return converse_texts(body)
    texts: list[str] = []
    if protocol == "anthropic":
        texts += _part_texts(body.get("system"))
    if protocol in ("chat", "anthropic"):
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                texts += _part_texts(message.get("content"))
    elif protocol == "responses":
        texts += _part_texts(body.get("instructions"))
        items = body.get("input")
        if isinstance(items, str):
            texts.append(items)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                texts += _part_texts(item.get("content"))
    elif protocol == "gemini":
        system = body.get("systemInstruction", body.get("system_instruction"))
        contents = body.get("contents")
        for content in [system, *(contents if isinstance(contents, list) else [contents])]:
            if isinstance(content, dict):
                texts += _part_texts(content.get("parts"))
            elif isinstance(content, str):
                texts.append(content)
    return texts


def answers_asked(body: dict[str, Any]) -> int:
    """Chat's ``n``, Gemini's ``candidateCount``: the simulator writes every
    answer's tokens as one answer, so its usage is what a provider bills."""
    config = body.get("generationConfig")
    count = body.get("n", config.get("candidateCount") if isinstance(config, dict) else None)
    return count if isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= 128 else 1


def build_script(protocol: str, model: str | None, body: dict[str, Any], texts: list[str], d: Directives,
                 request: Request) -> wire.Script:
    """The answer a request gets, from its directives and its prompt."""
    stream_options = body.get("stream_options")
    return wire.Script(
        model=model or "sim-model",
        thinking=wire.deltas(d.thinking, wire.THINKING_WORDS),
        text=wire.deltas(d.tokens * answers_asked(body), wire.TEXT_WORDS),
        tool=d.tool,
        input_tokens=count_words(texts),
        stem=d.id or secrets.token_hex(12),
        created=d.created if d.created is not None else int(time.time()),
        cached=d.cached,
        cache_write=d.cache_write,
        reported_output=d.report_output,
        crlf=d.crlf if d.crlf is not None else wire.grammar(protocol) == "gemini",  # Google sends CRLF
        include_usage=isinstance(stream_options, dict) and stream_options.get("include_usage") is True,
        sse=request.query.get("alt") == "sse",
        request=body,
    )
