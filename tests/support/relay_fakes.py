"""Fakes for unit-testing the relay without processes: channels scripted
through ``httpx.MockTransport``, and in-memory collaborators.

A channel's script is a list of steps: ``bytes`` are sent as one read,
a ``float`` pauses that long (tests keep them to tens of milliseconds),
``Hang`` waits until the test (or nobody) releases it, ``Cut`` drops the
connection. ``Answer(status, body)`` answers with an HTTP error instead.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal

import httpx

from channels_pool.affinity import ForeignState
from channels_pool.health import HealthBoard
from channels_pool.selection import ChannelInfo
from gateway.auth import Caller
from gateway.governance.limits import Limits, LocalCounters
from gateway.relay.collaborators import Timings
from gateway.relay.drain import Drain
from gateway.relay.relay import Relay


@dataclass
class Answer:
    status: int
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=dict)


class Hang:
    """A pause that lasts until ``release()``."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def release(self) -> None:
        self.event.set()


class Cut(Exception):
    pass


class ScriptedBody(httpx.AsyncByteStream):
    def __init__(self, steps: list, channel: ScriptedChannel) -> None:
        self.steps = steps
        self.channel = channel

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for step in self.steps:
            if isinstance(step, bytes):
                yield step
            elif isinstance(step, float):
                await asyncio.sleep(step)
            elif isinstance(step, Hang):
                await step.event.wait()
            elif step is Cut:
                raise httpx.ReadError("connection cut")

    async def aclose(self) -> None:
        self.channel.closed += 1


@dataclass
class ScriptedChannel:
    info: ChannelInfo
    script: list | Answer
    requests: list[httpx.Request] = field(default_factory=list)
    closed: int = 0


class Upstream:
    """Every scripted channel behind one mock transport, told apart by host."""

    def __init__(self) -> None:
        self.channels: dict[str, ScriptedChannel] = {}

    def channel(
        self, name: str, script: list | Answer, *, max_concurrency: int | None = None, protocol: str = "openai",
        upstream_model: str = "any",
    ) -> ChannelInfo:
        info = ChannelInfo(
            id=len(self.channels) + 1, name=name, protocol=protocol, base_url=f"http://{name}.test/v1",
            secret=f"sk-{name}", models={"any": upstream_model}, priority=0, weight=1, max_concurrency=max_concurrency,
        )
        self.channels[name] = ScriptedChannel(info, script)
        return info

    async def handle(self, request: httpx.Request) -> httpx.Response:
        channel = self.channels[request.url.host.removesuffix(".test")]
        channel.requests.append(request)
        if isinstance(channel.script, Answer):
            answer = channel.script
            return httpx.Response(answer.status, headers=answer.headers, stream=ScriptedBody([answer.body], channel))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=ScriptedBody(channel.script, channel))

    def __getitem__(self, name: str) -> ScriptedChannel:
        return self.channels[name]


class Recorded:
    """The recorder: final records, and what was journalled in flight."""

    def __init__(self) -> None:
        self.items: list = []
        self.journal: list = []
        self.tracked: dict = {}

    def record(self, item) -> None:
        self.tracked.pop(item.request_id, None)
        self.items.append(item)

    def track(self, request_id, snapshot) -> None:
        self.tracked[request_id] = snapshot
        self.journal.append(snapshot())

    def progress(self, item) -> None:
        self.journal.append(item)

    @property
    def only(self):
        assert len(self.items) == 1, self.items
        return self.items[0]


class RememberedState:
    def __init__(self) -> None:
        self.held: dict[str, tuple[int, int]] = {}

    def remember(self, state_id: str, tenant_id: int, channel_id: int) -> None:
        self.held[state_id] = (tenant_id, channel_id)

    async def channel_for(self, state_id: str, tenant_id: int) -> int | None:
        owner = self.held.get(state_id)
        if owner is None:
            return None
        if owner[0] != tenant_id:
            raise ForeignState()
        return owner[1]


class FixedDirectory:
    def __init__(self, channels: list[ChannelInfo]) -> None:
        self.channels = channels

    async def candidates(self, wires, model: str, pinned_id: int | None = None, native: str = "",
                         grammar_of=None) -> list[ChannelInfo]:
        channels = [c for c in self.channels if (grammar_of(c, model) if grammar_of else c.protocol) in wires]
        if pinned_id is not None:
            return [c for c in channels if c.id == pinned_id]
        return channels


FAST = Timings(keepalive=0.05, first_token=0.1, first_token_per_10k=0, hold_max=0.3, stall=0.15, capacity_wait=0.1)


def caller(concurrency: int | None = None) -> Caller:
    return Caller(
        key_id=1, key_prefix="hb-test", tenant_id=7, tenant_name="acme", allowed_models=frozenset(),
        rpm=None, concurrency=concurrency, price_multiplier=Decimal("1"),
    )


@dataclass
class Bench:
    """A relay over scripted channels, and what it did."""

    upstream: Upstream
    relay: Relay
    recorder: Recorded
    counters: LocalCounters
    board: HealthBoard

    def slots_held(self) -> dict[str, int]:
        return {name: count for name, count in self.counters._open.items() if count}


def build(upstream: Upstream, channels: list[ChannelInfo], timings: Timings = FAST, drain: Drain | None = None) -> Bench:
    counters = LocalCounters()
    recorder = Recorded()
    board = HealthBoard()
    relay = Relay(
        http=httpx.AsyncClient(transport=httpx.MockTransport(upstream.handle)),
        board=board,
        limits=Limits(counters),
        affinity=RememberedState(),
        recorder=recorder,
        directory=FixedDirectory(channels),
        timings=timings,
        drain=drain or Drain.never(),
    )
    return Bench(upstream, relay, recorder, counters, board)


def sse(data: dict | str, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def chat_chunk(content: str | None = None, finish: str | None = None, role: str | None = None) -> bytes:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "any",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def chat_usage(prompt: int = 5, completion: int = 2) -> bytes:
    return sse({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "any", "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})


PREAMBLE = chat_chunk(role="assistant", content="")
DONE = b"data: [DONE]\n\n"


def chat_answer(*words: str) -> list:
    """A whole, well-formed Chat Completions stream."""
    return [PREAMBLE, *(chat_chunk(w) for w in words), chat_chunk(finish="stop"), chat_usage(5, len(words)), DONE]


def anthropic_answer(*words: str, pause_before_content: float | Hang | None = None) -> list:
    """A whole Anthropic Messages stream."""
    start = sse({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                 "model": "any", "content": [], "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}},
                "message_start")
    block = sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start")
    deltas = [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}},
                  "content_block_delta") for w in words]
    end = [
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": len(words)}},
            "message_delta"),
        sse({"type": "message_stop"}, "message_stop"),
    ]
    pause = [] if pause_before_content is None else [pause_before_content]
    return [start, block, *pause, *deltas, *end]
