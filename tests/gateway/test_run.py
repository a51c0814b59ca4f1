"""A request's life after the commit (M1–M6, S1, B1), and what it holds:
a ``Relay`` over scripted channels (tests/support/relay_fakes.py), timers of tens of
milliseconds, no processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace

import orjson
import pytest

from channels_pool.upstream import Attempt
from core.errors import INTERRUPTED_MESSAGE, PROVIDER_ERROR_MESSAGE, STALLED_MESSAGE
from core.vocabulary import RequestStatus
from gateway.relay import delivery
from gateway.relay.drain import Drain
from providers.apis import CHAT, GEMINI_CACHES
from providers.openai.chat import ChatWatcher
from tests.support.relay_fakes import (
    DONE,
    FAST,
    PREAMBLE,
    Answer,
    Cut,
    Hang,
    Upstream,
    build,
    caller,
    chat_chunk,
    chat_usage,
    sse,
)

KEEPALIVE = CHAT.keepalive


async def serve(bench, api=CHAT, body=None, route=None, key_concurrency=None):
    body = body if body is not None else {"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    facts = api.parse(body, orjson.dumps(body), route or {})
    return await bench.relay.serve("req_test", api, caller(key_concurrency), facts, {})


def read_all_of(bench, **kwargs) -> list[bytes]:
    async def scenario():
        reply = await serve(bench, **kwargs)
        return [chunk async for chunk in reply.chunks]

    return asyncio.run(scenario())


async def cancelled_when(ready, bench, **kwargs) -> None:
    """Serve a request and cancel it (its client gone) once ``ready()``."""
    task = asyncio.create_task(serve(bench, **kwargs))
    while not ready():
        await asyncio.sleep(0.001)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def error_event(chunk: bytes) -> dict:
    assert chunk.startswith(b"data: {") and chunk.endswith(b"\n\n"), chunk
    return json.loads(chunk[len(b"data: ") :])["error"]


# -- keep-alive (S1) ---------------------------------------------------------------


def test_keepalives_fill_silences_only_between_whole_events():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), 0.2, chat_chunk(" there"), chat_chunk(finish="stop"), DONE])
    bench = build(upstream, [upstream["a"].info], replace(FAST, stall=1.0))
    chunks = read_all_of(bench)
    positions = [i for i, chunk in enumerate(chunks) if chunk == KEEPALIVE]
    assert positions, "a 0.2 s silence is longer than the 0.05 s keep-alive interval"
    assert all(0 < i < len(chunks) - 1 for i in positions)
    assert b"".join(c for c in chunks if c != KEEPALIVE) == PREAMBLE + chat_chunk("Hi") + chat_chunk(" there") + chat_chunk(finish="stop") + DONE
    assert chunks[-1].endswith(DONE)  # events one read carried go out together


def test_a_non_streaming_answer_gets_no_keepalives():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), 0.2, chat_chunk(finish="stop"), DONE])
    bench = build(upstream, [upstream["a"].info], replace(FAST, stall=1.0))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    reply = asyncio.run(serve(bench, body=body))
    assert json.loads(reply.body)["choices"][0]["message"]["content"] == "Hi"


# -- ends after the first token (M2–M6) ------------------------------------------------


def test_a_channel_silent_past_the_stall_timeout_ends_the_stream_with_an_error_event():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Hang()])
    bench = build(upstream, [upstream["a"].info])
    chunks = read_all_of(bench)
    assert error_event(chunks[-1])["message"] == STALLED_MESSAGE
    assert DONE not in b"".join(chunks)
    log = bench.recorder.only
    assert (log.status, log.error_kind) == (RequestStatus.STALLED, "stall")
    assert upstream["a"].closed == 1
    assert bench.board._breakers[upstream["a"].info.id].last_error_kind == "stall"


def test_a_providers_error_event_mid_stream_becomes_the_callers_own_error_event():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), sse({"error": {"message": "secret detail", "type": "server_error"}})])
    bench = build(upstream, [upstream["a"].info])
    chunks = read_all_of(bench)
    error = error_event(chunks[-1])
    assert error["message"] == PROVIDER_ERROR_MESSAGE
    assert b"secret detail" not in b"".join(chunks)
    assert bench.recorder.only.status is RequestStatus.INTERRUPTED


def test_a_connection_cut_mid_stream_is_an_interruption():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Cut])
    bench = build(upstream, [upstream["a"].info])
    chunks = read_all_of(bench)
    assert error_event(chunks[-1])["message"] == INTERRUPTED_MESSAGE
    log = bench.recorder.only
    assert (log.status, log.error_kind, log.sent_chars) == (RequestStatus.INTERRUPTED, "cut", 2)


def test_a_non_streaming_request_cut_mid_way_gets_the_table_e_error():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Cut])
    bench = build(upstream, [upstream["a"].info])
    reply = asyncio.run(serve(bench, body={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}))
    assert reply.status == 500  # table E: OpenAI's server_error
    assert json.loads(reply.body)["error"]["message"] == INTERRUPTED_MESSAGE


def non_streaming() -> dict:
    return {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


def test_a_non_streaming_answer_silent_past_the_stall_timeout_gets_the_table_e_error():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), 0.05, chat_chunk(" there"), Hang()])
    bench = build(upstream, [upstream["a"].info])
    reply = asyncio.run(serve(bench, body=non_streaming()))
    assert reply.status == 500
    assert json.loads(reply.body)["error"]["message"] == STALLED_MESSAGE
    log = bench.recorder.only
    assert (log.status, log.error_kind, log.sent_chars) == (RequestStatus.STALLED, "stall", len("Hi there"))
    assert upstream["a"].closed == 1


def test_a_non_streaming_answer_the_channel_keeps_feeding_is_not_stalled():
    # Each read comes well within the stall timeout, the whole answer well past it.
    upstream = Upstream()
    words = [f" w{i}" for i in range(12)]
    script = [PREAMBLE]
    for word in words:
        script += [chat_chunk(word), 0.03]
    upstream.channel("a", [*script, chat_chunk(finish="stop"), chat_usage(5, len(words)), DONE])
    bench = build(upstream, [upstream["a"].info])
    reply = asyncio.run(serve(bench, body=non_streaming()))
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["choices"][0]["message"]["content"] == "".join(words)
    assert bench.recorder.only.status is RequestStatus.COMPLETED


def test_a_providers_error_event_mid_answer_gets_the_table_e_error_and_none_of_its_detail():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), sse({"error": {"message": "secret detail", "type": "server_error"}})])
    bench = build(upstream, [upstream["a"].info])
    reply = asyncio.run(serve(bench, body=non_streaming()))
    assert reply.status == 500
    assert b"secret detail" not in reply.body
    log = bench.recorder.only
    assert (log.status, log.error_kind) == (RequestStatus.INTERRUPTED, "error_event")
    assert upstream["a"].closed == 1


def test_an_answer_assembled_whole_wakes_the_relay_for_its_end_not_for_every_read(monkeypatch):
    upstream = Upstream()
    words = [f" w{i}" for i in range(40)]
    script = [PREAMBLE, chat_chunk("Hi")]
    for word in words:
        script += [0.001, chat_chunk(word)]  # each in a read of its own
    upstream.channel("a", [*script, chat_chunk(finish="stop"), chat_usage(5, 41), DONE])
    bench = build(upstream, [upstream["a"].info], replace(FAST, stall=10.0))  # no clock wakes it
    returned = []
    next_item = Attempt.next

    async def counted(self, timeout):
        item = await next_item(self, timeout)
        returned.append(item)
        return item

    monkeypatch.setattr(Attempt, "next", counted)
    reply = asyncio.run(serve(bench, body=non_streaming()))
    assert json.loads(reply.body)["choices"][0]["message"]["content"] == "Hi" + "".join(words)
    assert json.loads(reply.body)["usage"]["completion_tokens"] == 41
    # The hold's OPENED, preamble and first token, then the answer's end.
    assert len(returned) <= 5, returned


def test_a_fault_of_the_gateways_own_in_an_answer_assembled_whole_is_raised_and_not_blamed_on_the_channel(monkeypatch):
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), 0.01, chat_chunk("boom"), chat_chunk(finish="stop"), DONE])
    bench = build(upstream, [upstream["a"].info], replace(FAST, stall=10.0))
    mark = ChatWatcher.mark

    def faulty(self, event):
        if b"boom" in event.raw:  # read by the attempt's task, after the commit
            raise RuntimeError("a bug of the gateway's")
        return mark(self, event)

    monkeypatch.setattr(ChatWatcher, "mark", faulty)
    with pytest.raises(RuntimeError, match="a bug of the gateway's"):
        asyncio.run(serve(bench, body=non_streaming()))
    assert upstream["a"].closed == 1
    assert bench.board._breakers[upstream["a"].info.id].failures == 0
    assert len(bench.recorder.items) == 1


def test_an_answer_assembled_whole_is_journalled_as_it_comes_not_while_its_channel_is_silent(monkeypatch):
    monkeypatch.setattr(delivery, "JOURNAL_EVERY", 0.02)
    upstream = Upstream()
    reads = [chat_chunk(f" w{i}") for i in range(10)]
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), *(step for read in reads for step in (0.01, read)), Hang()])
    bench = build(upstream, [upstream["a"].info], replace(FAST, stall=0.4))
    reply = asyncio.run(serve(bench, body=non_streaming()))
    assert json.loads(reply.body)["error"]["message"] == STALLED_MESSAGE
    progress = bench.recorder.journal[1:]  # after the snapshot taken when tracking began
    assert 1 <= len(progress) <= len(reads) + 1  # 0.4 s of silence journalled every 0.02 s would be 20 more
    assert progress[-1].sent_chars == len("Hi" + "".join(f" w{i}" for i in range(10)))


def test_a_client_that_leaves_a_non_streaming_answer_hangs_up_on_the_channel_and_frees_its_slots():
    upstream = Upstream()
    channel = upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Hang()], max_concurrency=1)
    bench = build(upstream, [channel], replace(FAST, stall=10.0))

    # Cancelled once committed, while the answer is being assembled.
    asyncio.run(cancelled_when(lambda: bench.recorder.tracked, bench, body=non_streaming(), key_concurrency=1))
    assert upstream["a"].closed == 1
    assert bench.slots_held() == {}
    assert bench.recorder.only.status is RequestStatus.CANCELLED


# -- cancellation (B1) and what a request holds -----------------------------------------


def test_a_client_that_leaves_mid_stream_hangs_up_on_the_channel_and_frees_its_slots():
    upstream = Upstream()
    endless = Hang()
    channel = upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), endless], max_concurrency=1)
    bench = build(upstream, [channel])

    async def scenario():
        reply = await serve(bench, key_concurrency=1)
        first = await anext(reply.chunks)
        assert bench.slots_held() == {"key:1": 1, f"channel:{channel.id}": 1}
        await reply.chunks.aclose()
        return first

    assert asyncio.run(scenario()) == PREAMBLE + chat_chunk("Hi")
    assert upstream["a"].closed == 1
    assert bench.slots_held() == {}
    log = bench.recorder.only
    assert (log.status, log.sent_chars) == (RequestStatus.CANCELLED, 2)


def test_a_stream_dropped_before_it_is_read_is_recorded_and_lets_go():
    upstream = Upstream()
    channel = upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Hang()], max_concurrency=1)
    bench = build(upstream, [channel])

    async def scenario():
        reply = await serve(bench)
        reply.abandon()
        reply.abandon()  # the response may be closed twice: one record still
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert bench.recorder.only.status is RequestStatus.CANCELLED
    assert bench.slots_held() == {}


def test_a_request_cancelled_during_the_hold_lets_go_of_everything():
    upstream = Upstream()
    channel = upstream.channel("a", [PREAMBLE, Hang()], max_concurrency=1)
    bench = build(upstream, [channel])

    asyncio.run(cancelled_when(lambda: upstream["a"].requests, bench, key_concurrency=1))
    assert bench.recorder.only.status is RequestStatus.CANCELLED
    assert bench.slots_held() == {}


# -- one relay for every request: Gemini cache creation (P9) ----------------------------


def cache_request():
    body = {"model": "models/gemini-test", "contents": [{"role": "user", "parts": [{"text": "remember this"}]}]}
    return {"api": GEMINI_CACHES, "body": body, "route": {"version": "v1beta"}}


def test_a_gemini_cache_is_created_through_the_relay_and_pins_its_channel():
    upstream = Upstream()
    created = b'{"name": "cachedContents/abc", "usageMetadata": {"totalTokenCount": 42}}'
    channel = upstream.channel("a", Answer(200, created), protocol="gemini")
    bench = build(upstream, [channel])
    reply = asyncio.run(serve(bench, **cache_request()))
    assert (reply.status, reply.body) == (200, created)
    assert upstream["a"].requests[0].url.path == "/v1/v1beta/cachedContents"
    log = bench.recorder.only
    assert (log.status, log.model, log.usage.cache_write_tokens) == (RequestStatus.COMPLETED, "gemini-test", 42)
    assert bench.relay.affinity.held["cachedContents/abc"] == (7, channel.id)


def test_a_channel_answering_a_cache_creation_with_no_cache_fails_over():
    upstream = Upstream()
    broken = upstream.channel("broken", Answer(200, b"<html>oops</html>"), protocol="gemini")
    good = upstream.channel("good", Answer(200, b'{"name": "cachedContents/ok"}'), protocol="gemini")
    bench = build(upstream, [broken, good])
    reply = asyncio.run(serve(bench, **cache_request()))
    assert reply.status == 200
    log = bench.recorder.only
    assert (log.channel_id, log.attempts) == (good.id, 2)
    assert bench.board._breakers[broken.id].last_error_kind == "error_event"


# -- a graceful drain (D1) ------------------------------------------------------------


class DrainAt:
    """A drain the test begins: a deadline and the signal that wakes waits."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.events: list[asyncio.Event] = []

    def signal(self) -> asyncio.Event:
        self.events.append(asyncio.Event())
        return self.events[-1]

    def begin(self, in_seconds: float) -> None:
        self.at = asyncio.get_running_loop().time() + in_seconds
        for event in self.events:
            event.set()

    def drain(self) -> Drain:
        return Drain(lambda: self.at, self.signal)


SLOW_CLOCKS = replace(FAST, keepalive=30, stall=30, hold_max=30)


def test_a_stream_still_open_at_the_drain_deadline_ends_with_the_interruption_event():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Hang()])
    drain = DrainAt()
    bench = build(upstream, [upstream["a"].info], SLOW_CLOCKS, drain.drain())

    async def scenario():
        reply = await serve(bench)
        first = await anext(reply.chunks)
        drain.begin(in_seconds=0.05)  # the wait already under way is woken
        rest = [chunk async for chunk in reply.chunks]
        return [first, *rest]

    chunks = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert error_event(chunks[-1])["message"] == INTERRUPTED_MESSAGE
    assert DONE not in b"".join(chunks)
    log = bench.recorder.only
    assert (log.status, log.error_kind) == (RequestStatus.INTERRUPTED, "drain")
    assert upstream["a"].closed == 1


def test_a_held_answer_at_the_drain_deadline_gets_503():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Hang()])
    drain = DrainAt()
    bench = build(upstream, [upstream["a"].info], SLOW_CLOCKS, drain.drain())

    async def scenario():
        task = asyncio.create_task(serve(bench, body={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}))
        while not upstream["a"].requests:
            await asyncio.sleep(0.001)
        drain.begin(in_seconds=0.05)
        return await task

    reply = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert (reply.status, reply.headers["retry-after"]) == (503, "1")
    assert bench.recorder.only.status is RequestStatus.INTERRUPTED


def test_a_request_still_in_the_hold_at_the_drain_deadline_gets_503_and_no_channel_is_blamed():
    upstream = Upstream()
    channel = upstream.channel("a", [PREAMBLE, Hang()])
    drain = DrainAt()
    bench = build(upstream, [channel], SLOW_CLOCKS, drain.drain())

    async def scenario():
        task = asyncio.create_task(serve(bench))
        while not upstream["a"].requests:
            await asyncio.sleep(0.001)
        drain.begin(in_seconds=0.05)
        return await task

    reply = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert reply.status == 503
    assert json.loads(reply.body)["error"]["type"] == "server_error"
    log = bench.recorder.only
    assert (log.status, log.error_kind) == (RequestStatus.FAILED, "drain")
    assert channel.id not in bench.board._breakers
    assert bench.slots_held() == {}


def test_a_client_too_far_behind_gets_the_interruption_event_and_the_stream_ends():
    upstream = Upstream()
    upstream.channel("a", [PREAMBLE, chat_chunk("Hi"), Hang()])
    bench = build(upstream, [upstream["a"].info], SLOW_CLOCKS)

    async def scenario():
        reply = await serve(bench)
        first = await anext(reply.chunks)
        reply.too_slow()  # what the server says when the client's unsent bytes pass the bound
        return [first, *[chunk async for chunk in reply.chunks]]

    chunks = asyncio.run(asyncio.wait_for(scenario(), 5))
    assert error_event(chunks[-1])["message"] == INTERRUPTED_MESSAGE
    log = bench.recorder.only
    assert (log.status, log.error_kind) == (RequestStatus.INTERRUPTED, "slow_client")
    assert upstream["a"].closed == 1
