"""An attempt on one channel (channels_pool/upstream.py): read in a task of
its own, bounded in what it holds, and woken or ended on the relay's word."""

from __future__ import annotations

import asyncio
import gc

import httpx
import pytest

from channels_pool import upstream as upstream_module
from channels_pool.upstream import Attempt, Signal
from core.errors import UpstreamFailure, failure_from_status
from core.sse import Event
from providers.kind import UpstreamRequest
from tests.support.relay_fakes import Hang, Upstream


def attempt_on(upstream: Upstream, name: str) -> Attempt:
    channel = upstream[name].info
    http = httpx.AsyncClient(transport=httpx.MockTransport(upstream.handle))
    return Attempt(http, channel, UpstreamRequest(f"{channel.base_url}/chat/completions", {}, b"{}"),
                   lambda status, body, retry: failure_from_status(status, retry_after=retry))


def test_reading_pauses_while_the_relay_is_behind_and_resumes_when_it_catches_up(monkeypatch):
    monkeypatch.setattr(upstream_module, "MAX_UNREAD", 1000)
    upstream = Upstream()
    event = b"data: " + b"x" * 94 + b"\n\n"  # 100 bytes
    upstream.channel("a", [event] * 50)

    async def scenario():
        attempt = attempt_on(upstream, "a")
        assert await attempt.next(1) is Signal.OPENED
        for _ in range(100):  # let the pump run as far as it may
            await asyncio.sleep(0)
        held = attempt._unread
        events = 0
        while (item := await attempt.next(1)) is not Signal.END:
            assert isinstance(item, Event)
            events += 1
        return held, events

    held, events = asyncio.run(scenario())
    assert 1000 < held <= 1100  # it stopped one chunk past the bound
    assert events == 50


def test_an_event_that_never_ends_cuts_the_channel_off(monkeypatch):
    monkeypatch.setattr(upstream_module, "MAX_EVENT", 1000)
    upstream = Upstream()
    upstream.channel("a", [b"data: " + b"x" * 600] * 10)  # no blank line, ever

    async def scenario():
        attempt = attempt_on(upstream, "a")
        items = []
        while not isinstance(item := await attempt.next(1), UpstreamFailure):
            items.append(item)
            assert len(items) < 20
        await asyncio.sleep(0)
        return item

    failure = asyncio.run(scenario())
    assert failure.kind == "cut"
    assert upstream["a"].closed == 1


def test_a_consumer_takes_every_event_in_order_and_next_gives_only_the_one_it_keeps():
    upstream = Upstream()
    events = [f"data: {i}\n\n".encode() for i in range(30)]
    # Two events in the read that holds the kept one: the second follows it.
    upstream.channel("a", [*events[:20], 0.01, *events[20:28], events[28] + events[29]])

    async def scenario():
        attempt = attempt_on(upstream, "a")
        assert await attempt.next(1) is Signal.OPENED
        first = await attempt.next(1)
        for _ in range(20):  # the pump reads on, into the queue
            await asyncio.sleep(0)
        taken = []

        def take(event):
            taken.append(event.raw)
            return event.raw == events[28]

        attempt.consume(take)
        items = []
        while (item := await attempt.next(1)) is not Signal.END:
            items.append(item)
        return first, taken, items

    first, taken, items = asyncio.run(scenario())
    assert first.raw == events[0]
    assert taken == events[1:29]
    assert [item.raw for item in items] == events[28:]


def test_a_consumed_answer_that_never_ends_its_event_cuts_the_channel_off(monkeypatch):
    monkeypatch.setattr(upstream_module, "MAX_EVENT", 1000)
    upstream = Upstream()
    upstream.channel("a", [b"data: 1\n\n", 0.01, *[b"data: " + b"x" * 600] * 10])

    async def scenario():
        attempt = attempt_on(upstream, "a")
        assert await attempt.next(1) is Signal.OPENED
        attempt.consume(lambda event: False)
        item = await attempt.next(1)
        await asyncio.sleep(0)
        return item

    failure = asyncio.run(scenario())
    assert isinstance(failure, UpstreamFailure) and failure.kind == "cut"
    assert upstream["a"].closed == 1


def test_wake_ends_a_wait_early():
    upstream = Upstream()
    upstream.channel("a", [Hang()])

    async def scenario():
        attempt = attempt_on(upstream, "a")
        assert await attempt.next(1) is Signal.OPENED
        asyncio.get_running_loop().call_later(0.01, attempt.wake)
        return await asyncio.wait_for(attempt.next(30), 5)

    assert asyncio.run(scenario()) is Signal.TIMEOUT


@pytest.mark.parametrize("completed,closed", [(False, 1), (True, 0)])
def test_end_hangs_up_unless_the_attempt_completed(completed, closed):
    upstream = Upstream()
    upstream.channel("a", [b"data: {}\n\n", Hang()])

    async def scenario():
        attempt = attempt_on(upstream, "a")
        assert await attempt.next(1) is Signal.OPENED
        attempt.completed = completed
        attempt.end()
        await asyncio.sleep(0.01)
        return upstream["a"].closed  # a completed one is read to its end, within a grace period

    assert asyncio.run(scenario()) == closed


def test_a_shorter_wait_is_honoured_after_a_longer_one_and_timers_are_not_made_per_wait():
    upstream = Upstream()
    upstream.channel("a", [b"data: 1\n\n", b"data: 2\n\n", Hang()])

    async def scenario():
        attempt = attempt_on(upstream, "a")
        assert await attempt.next(30) is Signal.OPENED
        assert isinstance(await attempt.next(30), Event)
        timer = attempt._timer
        assert isinstance(await attempt.next(29), Event)
        assert attempt._timer is timer  # the one due earlier is kept
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await attempt.next(0.05) is Signal.TIMEOUT  # re-armed sooner
        waited = loop.time() - started
        attempt.end()
        return waited, attempt._timer

    waited, timer = asyncio.run(scenario())
    assert waited < 5
    assert timer is None  # ending the attempt lets its timer go


def test_an_answer_read_to_its_end_leaves_nothing_for_the_cyclic_collector():
    # Freed as soon as it is done with, not in the collector's next pass:
    # every answer's objects would otherwise pile up until then.
    upstream = Upstream()
    upstream.channel("a", [b"data: {}\n\n"])

    async def scenario():
        attempt = attempt_on(upstream, "a")
        while await attempt.next(1) is not Signal.END:
            pass
        await attempt._task

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        asyncio.run(scenario())
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, httpx.Response | httpx.Request)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == []
