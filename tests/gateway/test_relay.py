"""The relay's rules, unit by unit: a ``Relay`` over channels scripted through
``httpx.MockTransport`` and in-memory collaborators, with timers of tens of
milliseconds. No processes; ``tests/processes/test_relay_gateway.py`` checks the same
rules through a real Daphne gateway and the simulator.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import orjson

from core.errors import STALLED_MESSAGE
from core.vocabulary import RequestStatus
from providers.apis import CHAT, MESSAGES
from tests.support.relay_fakes import (
    DONE,
    FAST,
    PREAMBLE,
    Answer,
    Hang,
    Upstream,
    anthropic_answer,
    build,
    caller,
    chat_answer,
    chat_chunk,
    sse,
)

KEEPALIVE = CHAT.keepalive


def chat_body(stream: bool = True, model: str = "gpt-test") -> dict:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


async def serve(bench, api=CHAT, body=None, route=None, key_concurrency=None):
    body = body if body is not None else chat_body()
    facts = api.parse(body, orjson.dumps(body), route or {})
    return await bench.relay.serve("req_test", api, caller(key_concurrency), facts, {})


async def read_all(reply) -> list[bytes]:
    return [chunk async for chunk in reply.chunks]


def run(coroutine):
    return asyncio.run(coroutine)


def expected_chat_bytes(*words: str) -> bytes:
    """What the client of a Chat stream gets: the channel's bytes, less the
    usage chunk HopBase asked for itself."""
    return PREAMBLE + b"".join(chat_chunk(w) for w in words) + chat_chunk(finish="stop") + DONE


# -- the hold (F1, F5) -----------------------------------------------------------


def test_the_preamble_is_held_back_and_goes_out_with_the_first_content_token():
    upstream = Upstream()
    bench = build(upstream, [upstream.channel("a", chat_answer("Hello", " world"))])

    async def scenario():
        reply = await serve(bench)
        return reply, await read_all(reply)

    reply, chunks = run(scenario())
    assert reply.status == 200 and reply.content_type == "text/event-stream"
    assert chunks[0] == PREAMBLE + chat_chunk("Hello")
    assert b"".join(chunks) == expected_chat_bytes("Hello", " world")
    log = bench.recorder.only
    assert (log.status, log.attempts, log.channel_id) == (RequestStatus.COMPLETED, 1, upstream["a"].info.id)
    assert (log.usage.input_tokens, log.usage.output_tokens) == (5, 2)
    assert log.ttft_ms is not None
    assert bench.slots_held() == {}


def test_a_non_streaming_request_is_assembled_from_the_channels_stream():
    upstream = Upstream()
    bench = build(upstream, [upstream.channel("a", chat_answer("Hello", " world"))])
    reply = run(serve(bench, body=chat_body(stream=False)))
    body = json.loads(reply.body)
    assert reply.status == 200
    assert body["choices"][0]["message"]["content"] == "Hello world"
    assert body["usage"]["completion_tokens"] == 2
    assert json.loads(upstream["a"].requests[0].content)["stream"] is True
    assert bench.recorder.only.status is RequestStatus.COMPLETED


# -- failover before the first token (F2, F6) ---------------------------------------


def test_a_channel_failing_before_its_first_token_is_replaced_without_a_trace():
    upstream = Upstream()
    bad = upstream.channel("bad", Answer(500, b'{"error": {"message": "boom"}}'))
    good = upstream.channel("good", chat_answer("Hi"))
    bench = build(upstream, [bad, good])

    async def scenario():
        return await read_all(await serve(bench))

    assert b"".join(run(scenario())) == expected_chat_bytes("Hi")
    log = bench.recorder.only
    assert (log.status, log.attempts, log.channel_id) == (RequestStatus.COMPLETED, 2, good.id)
    assert bench.board._breakers[bad.id].failures == 1


def test_an_error_event_right_after_the_preamble_fails_over():
    upstream = Upstream()
    overloaded = sse({"error": {"message": "Overloaded", "type": "server_error", "code": "overloaded"}})
    bad = upstream.channel("bad", [PREAMBLE, overloaded])
    good = upstream.channel("good", chat_answer("Hi"))
    bench = build(upstream, [bad, good])
    chunks = run(read_all_of(bench))
    assert b"".join(chunks) == expected_chat_bytes("Hi")
    assert b"Overloaded" not in b"".join(chunks)
    assert upstream["bad"].closed == 1


async def read_all_of(bench, **kwargs) -> list[bytes]:
    return await read_all(await serve(bench, **kwargs))


def test_a_request_the_channel_refuses_as_invalid_is_not_retried():
    upstream = Upstream()
    strict = upstream.channel("strict", Answer(400, b'{"error": {"message": "bad field"}}'))
    never = upstream.channel("never", chat_answer("Hi"))
    bench = build(upstream, [strict, never])
    reply = run(serve(bench))
    assert reply.status == 400
    assert json.loads(reply.body)["error"]["type"] == "invalid_request_error"
    assert b"bad field" not in reply.body
    assert upstream["never"].requests == []
    assert bench.recorder.only.status is RequestStatus.FAILED
    assert strict.id not in bench.board._breakers


def test_every_channel_busy_is_a_429_with_the_shortest_retry_after():
    upstream = Upstream()
    one = upstream.channel("one", Answer(529))
    two = upstream.channel("two", Answer(429, headers={"retry-after": "7"}))
    bench = build(upstream, [one, two])
    reply = run(serve(bench))
    assert reply.status == 429
    assert reply.headers["retry-after"] == "7"
    log = bench.recorder.only
    assert (log.status, log.attempts, log.channel_id) == (RequestStatus.FAILED, 2, two.id)  # the last channel tried
    assert bench.slots_held() == {}


def test_a_full_channel_is_skipped_for_the_next_one():
    upstream = Upstream()
    full = upstream.channel("full", chat_answer("no"), max_concurrency=1)
    free = upstream.channel("free", chat_answer("Hi"))
    bench = build(upstream, [full, free])

    async def scenario():
        assert await bench.relay.limits.take_channel(full.id, 1)
        return await read_all(await serve(bench))

    assert b"".join(run(scenario())) == expected_chat_bytes("Hi")
    assert upstream["full"].requests == []
    assert bench.recorder.only.channel_id == free.id


# -- slow start (F3) and the hold cap (F7) ------------------------------------------


def test_slow_start_moves_a_claude_request_without_thinking_to_the_next_channel():
    upstream = Upstream()
    slow = upstream.channel("slow", anthropic_answer("late", pause_before_content=Hang()), protocol="anthropic")
    fast = upstream.channel("fast", anthropic_answer("Hi"), protocol="anthropic")
    bench = build(upstream, [slow, fast])
    body = {"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    chunks = run(read_all_of(bench, api=MESSAGES, body=body))
    assert b'"text": "Hi"' in b"".join(chunks)
    log = bench.recorder.only
    assert (log.channel_id, log.attempts) == (fast.id, 2)
    assert bench.board._breakers[slow.id].last_error_kind == "slow_start"
    assert upstream["slow"].closed == 1


def test_slow_start_judges_each_channel_by_the_model_name_it_is_sent():
    upstream = Upstream()
    # A Chat client's model, served by an Anthropic channel as a Claude model (T4, F3).
    slow = upstream.channel("slow", anthropic_answer("late", pause_before_content=Hang()), protocol="anthropic",
                            upstream_model="claude-upstream")
    fast = upstream.channel("fast", chat_answer("Hi"))
    bench = build(upstream, [slow, fast])
    chunks = run(read_all_of(bench, body=chat_body(model="any")))
    assert b'"content":"Hi"' in b"".join(chunks).replace(b" ", b"")
    sent = json.loads(upstream["slow"].requests[0].content)
    assert (upstream["slow"].requests[0].url.path, sent["model"]) == ("/v1/v1/messages", "claude-upstream")
    assert (bench.recorder.only.attempts, bench.recorder.only.model) == (2, "any")
    assert bench.board._breakers[slow.id].last_error_kind == "slow_start"


def test_slow_start_does_not_apply_with_thinking_or_to_other_models():
    body = {"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    facts = MESSAGES.parse(body, b"", {})
    assert not MESSAGES.slow_start_applies("claude-test", facts)
    assert not MESSAGES.slow_start_applies("other-model", replace(facts, thinking=False))
    assert MESSAGES.slow_start_applies("claude-test", replace(facts, thinking=False))


def test_the_last_channel_left_is_waited_for():
    upstream = Upstream()
    slow = upstream.channel("slow", anthropic_answer("late", pause_before_content=0.15), protocol="anthropic")
    bench = build(upstream, [slow])
    body = {"model": "claude-test", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    chunks = run(read_all_of(bench, api=MESSAGES, body=body))
    assert b'"text": "late"' in b"".join(chunks)
    assert bench.recorder.only.status is RequestStatus.COMPLETED


def test_the_hold_cap_commits_to_a_channel_that_has_answered():
    upstream = Upstream()
    thinker = upstream.channel("thinker", [PREAMBLE, 0.15, chat_chunk("Hi"), chat_chunk(finish="stop"), DONE])
    bench = build(upstream, [thinker], replace(FAST, hold_max=0.05, keepalive=10))
    chunks = run(read_all_of(bench))
    assert chunks[0] == PREAMBLE  # status and preamble went out at the cap, before any content
    assert b"".join(chunks) == expected_chat_bytes("Hi")
    assert bench.recorder.only.status is RequestStatus.COMPLETED


def test_a_stream_committed_by_the_hold_cap_that_never_delivers_is_a_free_failure():
    upstream = Upstream()
    upstream.channel("mute", [PREAMBLE, Hang()])
    bench = build(upstream, list(ch.info for ch in upstream.channels.values()), replace(FAST, hold_max=0.05))
    chunks = run(read_all_of(bench))
    assert STALLED_MESSAGE.encode() in chunks[-1]
    assert bench.recorder.only.status is RequestStatus.FAILED
