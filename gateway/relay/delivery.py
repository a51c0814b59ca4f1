"""A committed answer passed on to its client (rules M1–M6, S1, F4):
streamed, with keep-alives in the client's silences, or assembled whole,
its events marked as the attempt reads them. Either runs to the answer's
end: its terminal event, the provider's error, the channel hanging up, the
stall timeout, a drain's deadline (``gateway.relay.drain``) or a client too slow
to keep up; how it ended is an ``Ending`` (``gateway.relay.ending``), and the
request (``gateway.relay.run``) is finished and recorded when it ends, however it
ends. The relay calls these with the run it committed (gateway.relay.relay).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from channels_pool.upstream import Attempt, Signal
from core.errors import INTERRUPTED_MESSAGE, STALLED_MESSAGE, UpstreamFailure
from core.sse import Event
from core.vocabulary import RequestStatus as Status
from gateway.relay.ending import Committed, Ending
from gateway.reply import Reply, error_reply
from providers.base import Mark

if TYPE_CHECKING:
    from gateway.relay.run import Run

# How often a stream in flight journals its progress (billing.spool).
JOURNAL_EVERY = 2.0
# ``_ends_at`` has work only for an event marked with one of these, or for
# content while the first is still awaited (F7). Both loops below test
# ``mark & ENDING or (mark & Mark.CONTENT and run.ttft_ms is None)`` inline
# before calling it: the test runs for every event, the call would too.
ENDING = Mark.ERROR | Mark.TERMINAL


async def stream(run: Run, committed: Committed) -> AsyncIterator[bytes]:
    """The client's bytes from a committed attempt up to its end, with
    keep-alives in the client's silences. An early end yields the
    caller's error event; ``run.ending`` says how it ended. The request
    is finished when this ends, however it ends."""
    loop = asyncio.get_running_loop()
    attempt, watcher = committed.attempt, committed.watcher
    stall, keepalive = run.relay.timings.stall, run.relay.timings.keepalive
    run.relay.recorder.track(run.request_id, run.in_flight)
    run.attempt = attempt
    try:
        if committed.ended:
            yield _end(run, _completed(attempt), committed.first_bytes + watcher.end_of_stream())
            return
        if committed.first_bytes:
            yield committed.first_bytes
        last_to_client = last_from_channel = now = loop.time()
        next_journal = last_from_channel + JOURNAL_EVERY
        # The client's bytes for events already read, sent together once
        # nothing more is waiting: one send per upstream read, not per
        # event (the bytes are the same; keep-alives still fall only
        # between whole events).
        out: list[bytes] = []
        # Looked up once: the loop below runs for every event.
        ready, next_item, buffered_event = attempt.ready, attempt.next, attempt.buffered_event
        mark_of, client_bytes = watcher.mark, watcher.client_bytes
        drain_deadline = run.relay.drain.deadline
        while True:
            if out and not ready():
                yield b"".join(out)
                out.clear()
                last_to_client = now
            if run.client_too_slow:
                run.error_kind = "slow_client"
                ending = Ending(run.cut_short(Status.INTERRUPTED), message=INTERRUPTED_MESSAGE)
                yield _end(run, ending, pending=out)
                return
            stall_at = last_from_channel + stall
            wake_at = last_to_client + keepalive
            if stall_at < wake_at:
                wake_at = stall_at
            drain_at = drain_deadline()
            if drain_at is not None and drain_at < wake_at:
                wake_at = drain_at
            item = await next_item(wake_at - loop.time())
            now = loop.time()
            if isinstance(item, Event):
                last_from_channel = now
                # This event and the others the same read carried, in one
                # go (the clocks above need no second look).
                event: Event | None = item
                while event is not None:
                    mark = mark_of(event)
                    if mark & ENDING or (mark & Mark.CONTENT and run.ttft_ms is None):
                        ending = _ends_at(run, mark, committed)
                        if ending is not None:
                            last = None
                            if ending.status is Status.COMPLETED:
                                last = client_bytes(event) + watcher.end_of_stream()
                            yield _end(run, ending, last, pending=out)
                            return
                    if not mark & Mark.DROP:
                        out.append(client_bytes(event))
                    event = buffered_event()
                if now >= next_journal:
                    run.relay.recorder.progress(run.in_flight())
                    next_journal = now + JOURNAL_EVERY
                continue
            match item:
                case Signal.TIMEOUT:
                    ending = _timed_out(run, now, drain_at, stall_at)
                    if ending is not None:
                        yield _end(run, ending, pending=out)
                        return
                    if now >= last_to_client + keepalive:
                        yield run.api.keepalive
                        last_to_client = now
                case Signal.PROGRESS | Signal.OPENED:
                    last_from_channel = now
                case Signal.END | UpstreamFailure():
                    yield _end(run, _ended_early(run, item, attempt), pending=out)
                    return
    finally:
        run.finish(run.ending.status)


async def collect(run: Run, committed: Committed) -> Reply:
    """F4: a non-streaming request, assembled from the channel's stream.
    Its events are marked as they are read, in the attempt's own task
    (``Attempt.consume``): this one wakes for the answer's end, a
    failure, its clocks (stall, drain) and the journal, not for every
    upstream read."""
    run.relay.recorder.track(run.request_id, run.in_flight)
    run.attempt = committed.attempt
    try:
        run.ending = await _assembled(run, committed)
    finally:
        run.finish(run.ending.status)
    if run.ending.status is not Status.COMPLETED:
        return error_reply(run.api, run.ending.error())
    return Reply(200, "application/json", body=committed.watcher.assembled_body())


async def _assembled(run: Run, committed: Committed) -> Ending:
    loop = asyncio.get_running_loop()
    attempt, watcher = committed.attempt, committed.watcher
    if committed.ended:
        watcher.end_of_stream()
        return _completed(attempt)
    ending: Ending | None = None
    # A fault of the gateway's own while the attempt's task reads: raised
    # here, as it would be in a stream, never taken for the channel's.
    fault: Exception | None = None

    def take(event: Event) -> bool:
        # What a stream would send, made and let go of: a translated
        # answer is assembled by the client API's writer as it writes.
        nonlocal ending, fault
        try:
            mark = watcher.mark(event)
            found = None
            if mark & ENDING or (mark & Mark.CONTENT and run.ttft_ms is None):
                found = _ends_at(run, mark, committed)
            if found is None:
                if not mark & Mark.DROP:
                    watcher.client_bytes(event)
                return False
            if found.status is Status.COMPLETED:
                watcher.client_bytes(event)
                watcher.end_of_stream()
        except Exception as error:
            fault = error
            return True
        ending = found
        return True

    attempt.consume(take)
    stall = run.relay.timings.stall
    next_journal = loop.time() + JOURNAL_EVERY
    journaled_read = attempt.read_at
    while ending is None:
        if fault is not None:
            raise fault
        stall_at = attempt.read_at + stall
        wake_at = min(stall_at, next_journal)
        drain_at = run.relay.drain.deadline()
        if drain_at is not None:
            wake_at = min(wake_at, drain_at)
        item = await attempt.next(wake_at - loop.time())
        match item:
            case Signal.TIMEOUT:
                now = loop.time()
                timed_out = _timed_out(run, now, drain_at, attempt.read_at + stall)
                if timed_out is not None:
                    return timed_out
                if now >= next_journal:
                    if attempt.read_at > journaled_read:  # something new to journal
                        run.relay.recorder.progress(run.in_flight())
                        journaled_read = attempt.read_at
                    next_journal = now + JOURNAL_EVERY
            case Signal.END | UpstreamFailure():
                return _ended_early(run, item, attempt)
    return ending


def _ends_at(run: Run, mark: int, committed: Committed) -> Ending | None:
    """How an event marked ``mark`` ends a committed request: completed,
    or interrupted by the provider's error; None while it goes on."""
    if mark & Mark.ERROR:
        run.error_kind = "error_event"
        busy = committed.watcher.busy_error
        return Ending(run.cut_short(Status.INTERRUPTED), busy, retry_after=1 if busy else None)
    if mark & (Mark.CONTENT | Mark.TERMINAL):
        # Committed by the hold cap (F7): the channel has now delivered.
        run.content_arrived(committed.attempt.channel.id)
    if mark & Mark.TERMINAL:
        return _completed(committed.attempt)
    return None


def _timed_out(run: Run, now: float, drain_at: float | None, stall_at: float) -> Ending | None:
    """The drain's deadline or the stall timeout (M2) reached, if either is."""
    if drain_at is not None and now >= drain_at:
        run.error_kind = "drain"
        return Ending(run.cut_short(Status.INTERRUPTED), message=INTERRUPTED_MESSAGE, drained=True)
    if now >= stall_at:
        run.error_kind = "stall"
        return Ending(run.cut_short(Status.STALLED), message=STALLED_MESSAGE)
    return None


def _end(run: Run, ending: Ending, last: bytes | None = None, pending: Sequence[bytes] = ()) -> bytes:
    """End the request as ``ending`` says and record it, then hand back
    the last bytes for the client (what is still ``pending``, then by
    default the error event): the record is on disk before they go out
    (D2)."""
    run.ending = ending
    if last is None:
        last = ending.stream_error(run.watcher)
    run.finish(ending.status)
    return b"".join(pending) + last if pending else last


def _completed(attempt: Attempt) -> Ending:
    attempt.completed = True
    return Ending(Status.COMPLETED)


def _ended_early(run: Run, item: Signal | UpstreamFailure, attempt: Attempt) -> Ending:
    """A committed channel failed or hung up before its terminal event."""
    failure = item if isinstance(item, UpstreamFailure) else UpstreamFailure("cut")
    run.error_kind = failure.kind
    run.upstream_status = attempt.status
    message = None if failure.busy else INTERRUPTED_MESSAGE
    return Ending(run.cut_short(Status.INTERRUPTED), failure.busy, message, failure.retry_after)
