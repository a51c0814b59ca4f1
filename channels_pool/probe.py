"""Testing a channel from the admin (rule C6): one small request to it, sent
the way the relay sends every request (the channel's kind addresses and
authorizes it, an ``Attempt`` reads it over the gateway's own HTTP client),
and what came of it: the HTTP status, the latency and, for the operator
only, the provider's own words.

An answer is read to its end: a provider that answers 200 and then reports
an error inside the stream (an ``overloaded_error`` event, a Bedrock
exception frame), or stops before its grammar's end marker, has failed the
test as it would fail a client's request, and its own words are shown.

A probe is the operator's, not a tenant's: it writes no request log, no
charge, and nothing of the channel's health (a failing test must not trip a
breaker that real traffic would not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import orjson

from channels_pool.destinations import LocalDestination, check_destination
from channels_pool.http_client import new_client
from channels_pool.masking import masked
from channels_pool.models import Channel
from channels_pool.upstream import MAX_DETAIL, Attempt, Signal
from core.errors import UpstreamFailure, failure_from_status
from core.sse import Event
from providers.embedding_legs import SIDES
from providers.google.gemini import API_VERSION
from providers.kind import Call, ChannelKind, ConfigError, Operation
from providers.kinds import KINDS
from providers.registry import GRAMMARS

PROMPT = "Reply with OK."
MAX_TOKENS = 16  # enough for any model to answer at all (some refuse fewer), few enough to cost nothing
TIMEOUT = 30.0  # seconds for the whole answer
# What the operator is told for failures that carry no provider text.
NO_ANSWER = {"connect": "could not connect to the channel", "timeout": "the connection timed out",
             "cut": "the channel cut the answer short", "internal": "the answer could not be read"}
# The events that report a failure inside a stream: Anthropic's ``error``
# (Bedrock's exception frames arrive as one too) and Converse's ``exception``.
ERROR_EVENTS = frozenset(("error", "exception"))


@dataclass(frozen=True)
class ProbeResult:
    channel: str
    model: str  # the name the channel was sent
    status: int | None  # the channel's HTTP status; None when it never sent one
    latency_ms: int  # from the start (credentials included) to the answer's end or the failure
    ok: bool
    error: str = ""  # for the operator: what went wrong, the provider's text where it sent any

    def summary(self) -> str:
        answer = f"HTTP {self.status}" if self.status is not None else "no answer"
        # Not the name first: the admin capitalises a message's first letter,
        # and channel names are told apart by case.
        text = f"Channel {self.channel}: {answer} in {self.latency_ms} ms (model {self.model})"
        return text + (f": {self.error}" if self.error else ".")


def probe_channels(channels: Sequence[Channel]) -> list[ProbeResult]:
    """Test each channel at once, in order of ``channels``. Called from a
    sync view: on an event loop of its own, so it neither waits for nor
    slows the gateway's."""
    return asyncio.run(_probe_all(channels))


async def _probe_all(channels: Sequence[Channel]) -> list[ProbeResult]:
    http = new_client()
    try:
        return list(await asyncio.gather(*(probe(http, channel) for channel in channels)))
    finally:
        await http.aclose()


def probe_call(kind: ChannelKind, model: str) -> Call:
    """The smallest request of the grammar the channel speaks for ``model``, streamed as the relay streams."""
    return GRAMMARS[kind.grammar(model)].probe.call(model, PROMPT, MAX_TOKENS)


def embedding_call(kind: ChannelKind, model: str) -> Call | None:
    """The smallest embeddings request for ``model``, if the channel serves it for embeddings."""
    grammar = kind.embedding_grammar(model) if "embed" in model.lower() else None
    if grammar is None:
        return None
    body = SIDES[grammar].probe(model)
    return Call(Operation.EMBED, model, body, orjson.dumps(body), route={"version": API_VERSION})


async def probe(http: httpx.AsyncClient, channel: Channel) -> ProbeResult:
    # A kind of its own, not the relay's shared one: the credentials are
    # tried as they are now (no token the relay holds answers for them), and
    # nothing made on this loop is left in the relay's caches.
    kind = type(KINDS[channel.protocol])()
    model = next(iter(channel.model_map().values()), "")
    loop = asyncio.get_running_loop()
    started = loop.time()

    def result(status: int | None, error: str = "") -> ProbeResult:
        latency = round((loop.time() - started) * 1000)
        return ProbeResult(channel.name, model, status, latency, ok=status == 200 and not error,
                           error=masked(error, channel.secret)[:MAX_DETAIL])

    try:
        check_destination(channel.base_url)  # saved before it was checked, or before the setting changed
    except LocalDestination as error:
        return result(None, str(error))
    embedding = embedding_call(kind, model)
    try:
        request = kind.request(channel, embedding or probe_call(kind, model))
    except ConfigError as error:  # settings the kind cannot use (saved before they were checked)
        return result(None, error.message)
    attempt = Attempt(http, channel, request,
                      lambda status, body, retry_after: kind.failure(
                          channel, status, body, retry_after,
                          lambda s, b, r: failure_from_status(s, retry_after=r)),
                      whole_body=embedding is not None)
    grammar = kind.grammar(model)
    ended = False  # the grammar's end marker arrived (an embeddings answer is one whole body)
    deadline = started + TIMEOUT
    try:
        while True:
            item = await attempt.next(deadline - loop.time())
            if isinstance(item, Event):
                if (error := stream_error(item)) is not None:
                    return result(attempt.status, error)
                ended = ended or embedding is not None or GRAMMARS[grammar].probe.is_end(item)
            elif item is Signal.END:
                return result(attempt.status, "" if ended else "the answer ended before its end marker")
            elif isinstance(item, UpstreamFailure):
                return result(item.status, item.detail or NO_ANSWER.get(item.kind) or NOT_A_PROVIDER)
            elif item is Signal.TIMEOUT and loop.time() >= deadline:
                return result(attempt.status, f"no complete answer within {TIMEOUT:.0f} s")
    finally:
        attempt.end()


# A refusal whose body is not a provider's error (channels_pool.masking) is
# told by its status alone.
NOT_A_PROVIDER = "the answer was not a model provider's error (its body is not shown)"


def stream_error(event: Event) -> str | None:
    """The provider's words when ``event`` reports a failure inside a 200
    answer (every grammar's error event or chunk), else None."""
    data = event.json
    if event.name in ERROR_EVENTS or (isinstance(data, dict) and "error" in data):
        return event.data[:MAX_DETAIL] or event.name or "an error event"
    return None
