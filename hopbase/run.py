"""One request's life in the relay: what it holds, what it has learned, how
a committed stream is passed on, and its one record (rules M, S1, B1).

Everything a request holds (its key slot, its channel's slot, the attempt
itself) is entered into ``Run.resources`` the moment it is taken, and the
stack is closed exactly once, by ``finish()``: no path can forget a release.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from billing.finished import Finished
from channels_pool.selection import ChannelInfo
from channels_pool.upstream import Attempt, Signal
from core.errors import (
    INTERRUPTED_MESSAGE,
    STALLED_MESSAGE,
    UpstreamFailure,
)
from core.sse import Event
from core.usage import Usage
from core.vocabulary import RequestStatus
from hopbase.auth import Caller
from hopbase.ending import Committed, Ending
from hopbase.protocols.base import Api, Mark, RequestFacts, StreamWatcher
from hopbase.releases import Releases
from hopbase.reply import Reply, error_reply

if TYPE_CHECKING:
    from hopbase.relay import Relay
    from hopbase.spend import Hold

# How often a stream in flight journals its progress (billing.spool).
JOURNAL_EVERY = 2.0
Status = RequestStatus


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class Run:
    """One request. ``finish()`` lets go of everything and records it, once."""

    def __init__(
        self, relay: Relay, request_id: str, api: Api, caller: Caller, facts: RequestFacts, headers: dict[str, str]
    ) -> None:
        self.relay = relay
        self.request_id = request_id
        self.api = api
        self.caller = caller
        self.facts = facts
        self.headers = headers
        self.created_at = datetime.now(UTC)
        self.started = time.monotonic()
        self.resources = Releases()
        self.attempts = 0
        self.hold: Hold | None = None  # its budgets' reservation and TPM count (hopbase.spend)
        self.channel: ChannelInfo | None = None
        self.upstream_model = ""  # the model name the channel was sent (an alias's upstream name)
        self.watcher: StreamWatcher | None = None
        self.committed = False  # the request belongs to self.channel now (M1)
        # Set with the first content token: from then on the request is
        # billed for its output, and a failure is an interruption, not a
        # failure before the first token (which costs nothing).
        self.ttft_ms: int | None = None
        self.upstream_status: int | None = None
        self.error_kind = ""
        self.ending = Ending(Status.CANCELLED)
        self.status: RequestStatus | None = None  # set once, by finish()
        self.attempt: Attempt | None = None  # the committed one
        self.client_too_slow = False
        self.streaming = False  # a stream reply went out (counted open until finish)

    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def content_arrived(self, channel_id: int) -> None:
        """The channel delivered its first content token (or its terminal)."""
        if self.ttft_ms is None:
            self.ttft_ms = self.elapsed_ms()
            self.relay.board.succeeded(channel_id, self.ttft_ms)

    def cut_short(self, status: RequestStatus) -> RequestStatus:
        """How a stream that ended early is logged: one committed by the hold
        cap that never produced content failed before its first token, and
        costs nothing (B5)."""
        return status if self.ttft_ms is not None else Status.FAILED

    # -- after the commit (M1–M6, S1) ------------------------------------

    async def stream(self, committed: Committed) -> AsyncIterator[bytes]:
        """The client's bytes from a committed attempt up to its end, with
        keep-alives in the client's silences. An early end yields the
        caller's error event; ``self.ending`` says how it ended. The request
        is finished when this ends, however it ends."""
        loop = asyncio.get_running_loop()
        attempt, watcher = committed.attempt, committed.watcher
        stall, keepalive = self.relay.timings.stall, self.relay.timings.keepalive
        self.relay.recorder.track(self.request_id, self._in_flight)
        self.attempt = attempt
        try:
            if committed.ended:
                yield self._end(self._completed(attempt), committed.first_bytes + watcher.end_of_stream())
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
            while True:
                if out and not attempt.ready():
                    yield b"".join(out)
                    out.clear()
                    last_to_client = now
                if self.client_too_slow:
                    self.error_kind = "slow_client"
                    ending = Ending(self.cut_short(Status.INTERRUPTED), message=INTERRUPTED_MESSAGE)
                    yield self._end(ending, pending=out)
                    return
                stall_at = last_from_channel + stall
                wake_at = min(stall_at, last_to_client + keepalive)
                drain_at = self.relay.drain.deadline()
                if drain_at is not None:
                    wake_at = min(wake_at, drain_at)
                item = await attempt.next(wake_at - loop.time())
                now = loop.time()
                match item:
                    case Signal.TIMEOUT:
                        ending = self._timed_out(now, drain_at, stall_at)
                        if ending is not None:
                            yield self._end(ending, pending=out)
                            return
                        if now >= last_to_client + keepalive:
                            yield self.api.keepalive
                            last_to_client = now
                    case Signal.PROGRESS | Signal.OPENED:
                        last_from_channel = now
                    case Signal.END | UpstreamFailure():
                        yield self._end(self._ended_early(item, attempt), pending=out)
                        return
                    case _:
                        last_from_channel = now
                        # This event and the others the same read carried,
                        # in one go (the clocks above need no second look).
                        event: Event | None = item
                        while event is not None:
                            mark = watcher.mark(event)
                            ending = self._ends_at(mark, committed)
                            if ending is not None:
                                last = None
                                if ending.status is Status.COMPLETED:
                                    last = watcher.client_bytes(event) + watcher.end_of_stream()
                                yield self._end(ending, last, pending=out)
                                return
                            if not mark & Mark.DROP:
                                out.append(watcher.client_bytes(event))
                            event = attempt.buffered_event()
                        if now >= next_journal:
                            self.relay.recorder.progress(self._in_flight())
                            next_journal = now + JOURNAL_EVERY
        finally:
            self.finish(self.ending.status)

    async def collect(self, committed: Committed) -> Reply:
        """F4: a non-streaming request, assembled from the channel's stream.
        Its events are marked as they are read, in the attempt's own task
        (``Attempt.consume``): this one wakes for the answer's end, a
        failure, its clocks (stall, drain) and the journal, not for every
        upstream read."""
        self.relay.recorder.track(self.request_id, self._in_flight)
        self.attempt = committed.attempt
        try:
            self.ending = await self._assembled(committed)
        finally:
            self.finish(self.ending.status)
        if self.ending.status is not Status.COMPLETED:
            return error_reply(self.api, self.ending.error())
        return Reply(200, "application/json", body=committed.watcher.assembled_body())

    async def _assembled(self, committed: Committed) -> Ending:
        loop = asyncio.get_running_loop()
        attempt, watcher = committed.attempt, committed.watcher
        if committed.ended:
            watcher.end_of_stream()
            return self._completed(attempt)
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
                found = self._ends_at(mark, committed)
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
        stall = self.relay.timings.stall
        next_journal = loop.time() + JOURNAL_EVERY
        journaled_read = attempt.read_at
        while ending is None:
            if fault is not None:
                raise fault
            stall_at = attempt.read_at + stall
            wake_at = min(stall_at, next_journal)
            drain_at = self.relay.drain.deadline()
            if drain_at is not None:
                wake_at = min(wake_at, drain_at)
            item = await attempt.next(wake_at - loop.time())
            match item:
                case Signal.TIMEOUT:
                    now = loop.time()
                    timed_out = self._timed_out(now, drain_at, attempt.read_at + stall)
                    if timed_out is not None:
                        return timed_out
                    if now >= next_journal:
                        if attempt.read_at > journaled_read:  # something new to journal
                            self.relay.recorder.progress(self._in_flight())
                            journaled_read = attempt.read_at
                        next_journal = now + JOURNAL_EVERY
                case Signal.END | UpstreamFailure():
                    return self._ended_early(item, attempt)
        return ending

    def _ends_at(self, mark: int, committed: Committed) -> Ending | None:
        """How an event marked ``mark`` ends a committed request: completed,
        or interrupted by the provider's error; None while it goes on."""
        if mark & Mark.ERROR:
            self.error_kind = "error_event"
            busy = committed.watcher.busy_error
            return Ending(self.cut_short(Status.INTERRUPTED), busy, retry_after=1 if busy else None)
        if mark & (Mark.CONTENT | Mark.TERMINAL):
            # Committed by the hold cap (F7): the channel has now delivered.
            self.content_arrived(committed.attempt.channel.id)
        if mark & Mark.TERMINAL:
            return self._completed(committed.attempt)
        return None

    def _timed_out(self, now: float, drain_at: float | None, stall_at: float) -> Ending | None:
        """The drain's deadline or the stall timeout (M2) reached, if either is."""
        if drain_at is not None and now >= drain_at:
            self.error_kind = "drain"
            return Ending(self.cut_short(Status.INTERRUPTED), message=INTERRUPTED_MESSAGE, drained=True)
        if now >= stall_at:
            self.error_kind = "stall"
            return Ending(self.cut_short(Status.STALLED), message=STALLED_MESSAGE)
        return None

    def _end(self, ending: Ending, last: bytes | None = None, pending: Sequence[bytes] = ()) -> bytes:
        """End the request as ``ending`` says and record it, then hand back
        the last bytes for the client (what is still ``pending``, then by
        default the error event): the record is on disk before they go out
        (D2)."""
        self.ending = ending
        if last is None:
            last = ending.stream_error(self.watcher)
        self.finish(ending.status)
        return b"".join(pending) + last if pending else last

    def stream_opened(self) -> None:
        self.streaming = True
        self.relay.meter.stream_opened()

    def too_slow(self) -> None:
        """The client has fallen too far behind what was sent to it: end the
        stream (with the interruption event) rather than buffer without end."""
        self.client_too_slow = True
        if self.attempt is not None:
            self.attempt.wake()

    def _completed(self, attempt: Attempt) -> Ending:
        attempt.completed = True
        return Ending(Status.COMPLETED)

    def _ended_early(self, item: Signal | UpstreamFailure, attempt: Attempt) -> Ending:
        """A committed channel failed or hung up before its terminal event."""
        failure = item if isinstance(item, UpstreamFailure) else UpstreamFailure("cut")
        self.error_kind = failure.kind
        self.upstream_status = attempt.status
        message = None if failure.busy else INTERRUPTED_MESSAGE
        return Ending(self.cut_short(Status.INTERRUPTED), failure.busy, message, failure.retry_after)

    # -- the end -----------------------------------------------------------

    def finish(self, status: RequestStatus) -> None:
        """Let go of everything held and record the request (once)."""
        if self.status is not None:
            return
        self.status = status
        # Whatever fails on the way out, the request is still recorded.
        try:
            self.resources.close()
            if self.streaming:
                self.relay.meter.stream_closed()
            self._report(status)
        finally:
            record = self._record(status)
            self.relay.recorder.record(record)
            self.relay.spend.ended(self.hold, record)

    def _report(self, status: RequestStatus) -> None:
        relay, channel, watcher = self.relay, self.channel, self.watcher
        if self.committed and channel is not None and status in (Status.STALLED, Status.INTERRUPTED, Status.FAILED):
            # A channel committed to (M1) that then let the request down; a
            # failure before that was counted by the hold, and a request the
            # channel rightly refused (a 400) is no failure of the channel's.
            relay.board.failed(channel.id, self.error_kind)
        if watcher is not None and watcher.state_id and channel is not None:
            # Whatever the ending: state a stream began (a response id, sent
            # in its first events) is this tenant's, and on this channel.
            relay.affinity.remember(watcher.state_id, self.caller.tenant_id, channel.id)

    def _in_flight(self) -> Finished:
        """What is known of the stream so far, as a record its process's
        death would leave (billing.spool)."""
        return self._record(Status.INTERRUPTED)

    def _record(self, status: RequestStatus) -> Finished:
        watcher = self.watcher
        return self.caller.finished(
            self.request_id,
            self.api.name,
            status,
            created_at=self.created_at,
            model=self.facts.model,
            upstream_model=self.upstream_model,
            provider_request_id=self.attempt.provider_request_id() if self.attempt is not None else "",
            stream=self.facts.stream,
            channel_id=self.channel.id if self.channel else None,
            channel_name=self.channel.name if self.channel else "",
            error_kind=self.error_kind,
            attempts=self.attempts,
            usage=watcher.usage.copy() if watcher is not None else Usage(),
            # A request no channel accepted (never a 200) had no prompt
            # processed: nothing to estimate input from.
            prompt_chars=self.facts.prompt_chars if self.upstream_status == 200 else 0,
            sent_chars=watcher.sent_chars if watcher is not None and status is not Status.FAILED else 0,
            ttft_ms=self.ttft_ms,
            duration_ms=self.elapsed_ms(),
            upstream_status=self.upstream_status,
        )
