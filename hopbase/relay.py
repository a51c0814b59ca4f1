"""The shared relay: attempts over candidate channels, the hold until the first
content token, failover before it, then pass-through with keep-alive, stall
watch and cancellation (rules F, M, S, B1).

    request facts + caller
      -> candidates (channel choice)
      -> hold: attempt channel after channel until one yields a content
         token (or its terminal event, or the hold cap passes)
      -> commit: status, headers, the held preamble and that token go out
         together; then events pass through unchanged until the terminal
      -> one Finished record to the recorder, whatever happened

Nothing here knows which protocol it is relaying: the protocol module marks
events and renders errors.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from billing.recorder import Finished, recorder
from channels_pool import affinity
from channels_pool.health import board
from channels_pool.selection import ChannelInfo, directory
from channels_pool.upstream import END, OPENED, PROGRESS, TIMEOUT, Attempt
from core.errors import (
    FINAL,
    INTERRUPTED_MESSAGE,
    PROVIDER_ERROR_MESSAGE,
    STALLED_MESSAGE,
    UPSTREAM_REJECTED_MESSAGE,
    ErrorKind,
    GatewayError,
    UpstreamFailure,
)
from core.sse import Event
from core.usage import Usage
from hopbase.auth import Caller
from hopbase.limits import POLL_SECONDS, limits
from hopbase.protocols.base import Api, Mark, RequestFacts, StreamWatcher

STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
log = logging.getLogger("hopbase.relay")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


@dataclass
class Reply:
    """What the view sends: a whole body, or a stream of chunks."""

    status: int
    content_type: str
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # For a stream: what to do if it is dropped without ever being read.
    abandon: Callable[[], None] | None = None


def error_reply(protocol: Api, error: GatewayError) -> Reply:
    """One of HopBase's own errors, in the protocol's format (table E)."""
    status, body = protocol.error_body(error)
    headers = {}
    if error.retry_after is not None:
        headers["retry-after"] = str(error.retry_after)
    if error.kind in FINAL:
        headers["x-should-retry"] = "false"
    return Reply(status, "application/json", body=body, headers=headers)


@dataclass
class Committed:
    attempt: Attempt
    watcher: StreamWatcher
    first_bytes: bytes
    ended: bool  # the terminal event is already among the first bytes


class Run:
    """One request's life. ``finish()`` records it exactly once."""

    def __init__(self, request_id: str, protocol: Api, caller: Caller, facts: RequestFacts, headers: dict[str, str]):
        self.request_id = request_id
        self.protocol = protocol
        self.caller = caller
        self.facts = facts
        self.headers = headers
        self.created_at = timezone.now()
        self.started = time.monotonic()
        self.attempts = 0
        self.channel: ChannelInfo | None = None
        self.watcher: StreamWatcher | None = None
        self.ttft_ms: int | None = None
        self.upstream_status: int | None = None
        self.error_kind = ""
        self.finished = False
        self.holds_key_slot = False
        # The first content token has been seen: from then on the request is
        # billed for its output, and a failure is an interruption, not a
        # failure before the first token (which costs nothing).
        self.content_seen = False
        self.committed = False  # the request belongs to self.channel now (M1)

    # -- the hold (F1–F7) ------------------------------------------------

    async def hold(self, candidates: list[ChannelInfo]) -> Committed:
        """Try channels in order until one yields its first content token."""
        loop = asyncio.get_running_loop()
        hold_until = loop.time() + settings.HOPBASE_HOLD_MAX
        failures: list[UpstreamFailure] = []
        for index, channel in enumerate(candidates):
            is_last = index == len(candidates) - 1
            if not await self._take_capacity(channel, may_wait=is_last):
                failures.append(UpstreamFailure("capacity", busy=True))
                continue
            request = self.protocol.upstream_request(channel, self.facts, self.headers)
            board.started(channel.id)
            attempt = Attempt(channel, request.url, request.headers, request.content, self.protocol)
            self.attempts += 1
            self.channel, self.watcher = channel, self.protocol.new_watcher(self.facts)
            slow_start = self._slow_start_limit(is_last)
            give_up_at = hold_until if slow_start is None else min(hold_until, loop.time() + slow_start)
            try:
                outcome = await self._first_token(attempt, self.watcher, give_up_at, hold_until)
            except BaseException:
                self.end_attempt(attempt)
                raise
            if isinstance(outcome, Committed):
                self.committed = True
                return outcome
            self.end_attempt(attempt)
            if not outcome.channel_fault:
                raise GatewayError(*self._request_fault(outcome))
            failures.append(outcome)
            board.failed(channel.id, outcome.kind)
        self.channel = None
        self.error_kind = failures[-1].kind if failures else "no_channel"
        raise self._all_failed(failures)

    async def _first_token(
        self, attempt: Attempt, watcher: StreamWatcher, give_up_at: float, hold_until: float
    ) -> Committed | UpstreamFailure:
        """Read one attempt until its first content token (committed), the
        hold cap (committed anyway, F7), or a failure."""
        loop = asyncio.get_running_loop()
        held: list[bytes] = []
        awaiting_headers = False
        while True:
            item = await attempt.next(give_up_at - loop.time())
            self.upstream_status = attempt.status
            if item is TIMEOUT:
                if awaiting_headers:
                    return UpstreamFailure("timeout")
                if loop.time() < hold_until:
                    return UpstreamFailure("slow_start", attempt.status)
                if attempt.status is None:
                    # F7 commits to a channel that has answered; one that has
                    # not even sent its status can still fail over.
                    awaiting_headers = True
                    give_up_at = loop.time() + settings.HOPBASE_STALL_TIMEOUT
                    continue
                return Committed(attempt, watcher, b"".join(held), ended=False)
            if item is OPENED:
                if loop.time() >= hold_until:
                    return Committed(attempt, watcher, b"".join(held), ended=False)
                continue
            if item is PROGRESS:
                continue
            if isinstance(item, UpstreamFailure):
                return item
            if item is END:
                return UpstreamFailure("cut", attempt.status)
            mark = watcher.mark(item)
            if mark & Mark.ERROR:
                return UpstreamFailure("error_event", attempt.status, busy=watcher.busy_error)
            if mark & Mark.DROP:
                continue
            held.append(watcher.client_bytes(item))
            if mark & (Mark.CONTENT | Mark.TERMINAL):
                self.ttft_ms = self._elapsed_ms()
                self.content_seen = True
                board.succeeded(attempt.channel.id, self.ttft_ms)
                return Committed(attempt, watcher, b"".join(held), ended=bool(mark & Mark.TERMINAL))

    async def _take_capacity(self, channel: ChannelInfo, may_wait: bool) -> bool:
        """A slot under the channel's max concurrency. A full channel is
        skipped, but the last one left is waited for (F8)."""
        deadline = time.monotonic() + (settings.HOPBASE_CAPACITY_WAIT if may_wait else 0)
        while not await limits.take_channel(channel.id, channel.max_concurrency):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_SECONDS)
        return True

    def end_attempt(self, attempt: Attempt, completed: bool = False) -> None:
        if attempt.ended:
            return
        attempt.ended = True
        if completed:
            attempt.release()
        else:
            attempt.close()
        board.ended(attempt.channel.id)
        limits.release_channel(attempt.channel.id, attempt.channel.max_concurrency)

    def _slow_start_limit(self, is_last: bool) -> float | None:
        """F3: Claude without extended thinking must start within a limit,
        unless this is the last channel left."""
        if is_last or self.facts.thinking or not self.facts.model.startswith("claude"):
            return None
        per_10k = settings.HOPBASE_FIRST_TOKEN_PER_10K * self.facts.prompt_tokens_estimate / 10_000
        return settings.HOPBASE_FIRST_TOKEN_TIMEOUT + per_10k

    @staticmethod
    def _request_fault(failure: UpstreamFailure) -> tuple[ErrorKind, str]:
        if failure.status == 413:
            return ErrorKind.TOO_LARGE, "The request is too large for the model provider."
        return ErrorKind.MALFORMED, UPSTREAM_REJECTED_MESSAGE

    @staticmethod
    def _all_failed(failures: list[UpstreamFailure]) -> GatewayError:
        if failures and all(f.busy for f in failures):
            hints = [f.retry_after for f in failures if f.retry_after is not None]
            return GatewayError(ErrorKind.ALL_BUSY, retry_after=min(hints) if hints else 1)
        return GatewayError(ErrorKind.ALL_FAILED)

    # -- after the commit (M1–M6, S1) ------------------------------------

    async def stream(self, committed: Committed) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        attempt, watcher = committed.attempt, committed.watcher
        status = "cancelled"
        keepalive = self.protocol.keepalive
        try:
            if committed.first_bytes:
                yield committed.first_bytes
            if committed.ended:
                status = "completed"
                tail = watcher.end_of_stream()
                if tail:
                    yield tail
                return
            now = loop.time()
            last_to_client = last_from_channel = now
            while True:
                keepalive_at = last_to_client + settings.HOPBASE_KEEPALIVE_INTERVAL
                stall_at = last_from_channel + settings.HOPBASE_STALL_TIMEOUT
                item = await attempt.next(min(keepalive_at, stall_at) - loop.time())
                now = loop.time()
                if item is TIMEOUT:
                    if now >= stall_at:
                        status, self.error_kind = self._cut_short("stalled"), "stall"
                        yield watcher.stream_error(ErrorKind.STREAM_FAILED, STALLED_MESSAGE)
                        return
                    yield keepalive
                    last_to_client = now
                    continue
                last_from_channel = now
                if item is PROGRESS or item is OPENED:
                    continue
                if isinstance(item, UpstreamFailure) or item is END:
                    status, failure = self._ended_early(item, attempt)
                    if failure.busy:
                        yield watcher.stream_error(ErrorKind.STREAM_BUSY, PROVIDER_ERROR_MESSAGE)
                    else:
                        yield watcher.stream_error(ErrorKind.STREAM_FAILED, INTERRUPTED_MESSAGE)
                    return
                chunk, outcome = self._pass(item, watcher)
                if chunk:
                    yield chunk
                    last_to_client = now
                if outcome:
                    status = outcome
                    if outcome == "completed":
                        tail = watcher.end_of_stream()
                        if tail:
                            yield tail
                    return
        finally:
            self.end_attempt(attempt, completed=status == "completed")
            self.finish(status)

    def _ended_early(self, item: object, attempt: Attempt) -> tuple[str, UpstreamFailure]:
        """A committed channel failed or hung up before its terminal event."""
        failure = item if isinstance(item, UpstreamFailure) else UpstreamFailure("cut")
        self.error_kind = failure.kind
        self.upstream_status = attempt.status
        return self._cut_short("interrupted"), failure

    def _cut_short(self, status: str) -> str:
        """How a stream that ended early is logged: a stream committed by
        the hold cap that never produced content failed before its first
        token, and costs nothing (B5)."""
        return status if self.content_seen else "failed"

    def _pass(self, event: Event, watcher: StreamWatcher) -> tuple[bytes, str | None]:
        """The bytes the client gets for one committed event, and the outcome
        when the event ends the stream."""
        mark = watcher.mark(event)
        if mark & Mark.ERROR:
            self.error_kind = "error_event"
            kind = ErrorKind.STREAM_BUSY if watcher.busy_error else ErrorKind.STREAM_FAILED
            return watcher.stream_error(kind, PROVIDER_ERROR_MESSAGE), self._cut_short("interrupted")
        if mark & Mark.DROP:
            return b"", None
        if mark & (Mark.CONTENT | Mark.TERMINAL) and not self.content_seen:
            # Committed by the hold cap (F7): the channel has now delivered.
            self.content_seen = True
            if self.ttft_ms is None:
                self.ttft_ms = self._elapsed_ms()
            board.succeeded(self.channel.id if self.channel else 0, self.ttft_ms)
        return watcher.client_bytes(event), ("completed" if mark & Mark.TERMINAL else None)

    async def collect(self, committed: Committed) -> Reply:
        """F4: a non-streaming request, assembled from the channel's stream."""
        loop = asyncio.get_running_loop()
        attempt, watcher = committed.attempt, committed.watcher
        status = "cancelled"
        try:
            ended = committed.ended
            last_from_channel = loop.time()
            while not ended:
                stall_at = last_from_channel + settings.HOPBASE_STALL_TIMEOUT
                item = await attempt.next(stall_at - loop.time())
                if item is TIMEOUT:
                    status, self.error_kind = self._cut_short("stalled"), "stall"
                    return self.error_reply(GatewayError(ErrorKind.ALL_FAILED, STALLED_MESSAGE))
                last_from_channel = loop.time()
                if item is PROGRESS or item is OPENED:
                    continue
                if isinstance(item, UpstreamFailure) or item is END:
                    status, failure = self._ended_early(item, attempt)
                    if failure.busy:
                        return self.error_reply(GatewayError(ErrorKind.ALL_BUSY, retry_after=failure.retry_after or 1))
                    return self.error_reply(GatewayError(ErrorKind.ALL_FAILED, INTERRUPTED_MESSAGE))
                chunk, outcome = self._pass(item, watcher)
                if outcome in ("interrupted", "failed"):
                    status = outcome
                    kind = ErrorKind.ALL_BUSY if watcher.busy_error else ErrorKind.ALL_FAILED
                    return self.error_reply(GatewayError(kind, retry_after=1 if watcher.busy_error else None))
                ended = outcome == "completed"
            status = "completed"
            return Reply(200, "application/json", body=watcher.assembled_body())
        finally:
            self.end_attempt(attempt, completed=status == "completed")
            self.finish(status)

    # -- the end -----------------------------------------------------------

    def abandon(self, committed: Committed) -> None:
        """The response is being closed. A stream that ran has already let
        go of its channel and recorded itself; one dropped before it was
        ever read has not, and does so now (a no-op otherwise)."""
        self.end_attempt(committed.attempt)
        self.finish("cancelled")

    def error_reply(self, error: GatewayError) -> Reply:
        return error_reply(self.protocol, error)

    def _elapsed_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def finish(self, status: str) -> None:
        if self.finished:
            return
        self.finished = True
        if self.holds_key_slot:
            limits.release_key(self.caller.key_id)
        if self.committed and status in ("stalled", "interrupted", "failed") and self.channel is not None:
            # A channel committed to (M1) that then let the request down; a
            # failure before that was counted by the hold, and a request the
            # channel rightly refused (a 400) is no failure of the channel's.
            board.failed(self.channel.id, self.error_kind)
        watcher = self.watcher
        if status == "completed" and watcher is not None and watcher.state_id and self.channel is not None:
            affinity.remember(watcher.state_id, self.caller.tenant_id, self.channel.id)
        recorder.record(
            Finished(
                request_id=self.request_id,
                created_at=self.created_at,
                tenant_id=self.caller.tenant_id,
                api_key_id=self.caller.key_id,
                protocol=self.protocol.name,
                status=status,
                model=self.facts.model,
                stream=self.facts.stream,
                channel_id=self.channel.id if self.channel else None,
                error_kind=self.error_kind,
                attempts=self.attempts,
                usage=watcher.usage if watcher is not None else Usage(),
                # A request no channel accepted (never a 200) had no prompt
                # processed: nothing to estimate input from.
                prompt_chars=self.facts.prompt_chars if self.upstream_status == 200 else 0,
                sent_chars=watcher.sent_chars if watcher is not None and status != "failed" else 0,
                ttft_ms=self.ttft_ms,
                duration_ms=self._elapsed_ms(),
                upstream_status=self.upstream_status,
                price_multiplier=self.caller.price_multiplier,
            )
        )


async def relay(request_id: str, protocol: Api, caller: Caller, facts: RequestFacts, headers: dict[str, str]) -> Reply:
    """Serve one authenticated, parsed request."""
    run = Run(request_id, protocol, caller, facts, headers)
    try:
        run.holds_key_slot = await limits.admit_key(caller.key_id, caller.rpm, caller.concurrency)
        pinned = await affinity.channel_for(facts.affinity_key, caller.tenant_id) if facts.affinity_key else None
        candidates = board.arrange(await directory.candidates(protocol.wire, facts.model, pinned))
        if not candidates:
            run.error_kind = "model_not_found"
            run.finish("rejected")
            return run.error_reply(GatewayError(ErrorKind.MODEL_NOT_FOUND))
        committed = await run.hold(candidates)
    except GatewayError as error:
        run.error_kind = run.error_kind or error.kind.value
        run.finish("failed" if run.attempts else "rejected")
        return run.error_reply(error)
    except Exception:
        log.exception("request %s failed inside the relay", request_id)
        run.error_kind = "internal"
        run.finish("failed")
        return run.error_reply(GatewayError(ErrorKind.ALL_FAILED))
    except BaseException:
        run.finish("cancelled")
        raise
    upstream_headers = committed.attempt.passed_back_headers()
    if not facts.stream:
        reply = await run.collect(committed)
        reply.headers.update(upstream_headers)
        return reply
    content_type = committed.watcher.content_type
    return Reply(
        200,
        content_type,
        chunks=run.stream(committed),
        headers={**STREAM_HEADERS, **upstream_headers},
        abandon=lambda: run.abandon(committed),
    )
