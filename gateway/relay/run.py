"""One request's life in the relay: what it holds, what it has learned, and
its one record (rules M, S1, B1). Its committed answer is passed on, streamed
or assembled whole, by ``gateway.relay.delivery`` (``stream`` and ``collect``
take a run); what it reports to is its relay's parts
(gateway.relay.collaborators).

Everything a request holds (its key slot, its channel's slot, the attempt
itself) is entered into ``Run.resources`` the moment it is taken, and the
stack is closed exactly once, by ``finish()``: no path can forget a release.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from billing.finished import Finished
from channels_pool.selection import ChannelInfo
from channels_pool.upstream import Attempt
from core.usage import Usage
from core.vocabulary import RequestStatus
from gateway.auth import Caller
from gateway.relay.collaborators import Collaborators
from gateway.relay.ending import Ending
from gateway.relay.releases import Releases
from providers.base import Api, RequestFacts, StreamWatcher

if TYPE_CHECKING:
    from gateway.governance.spend import Hold
    from providers.embedding_legs import EmbeddingLegs
    from providers.legs import Legs

Status = RequestStatus


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class Run:
    """One request. ``finish()`` lets go of everything and records it, once."""

    def __init__(
        self, relay: Collaborators, request_id: str, api: Api, caller: Caller, facts: RequestFacts, headers: dict[str, str]
    ) -> None:
        self.relay = relay
        self.request_id = request_id
        self.api = api
        self.caller = caller
        self.legs: Legs | EmbeddingLegs | None = None  # how it reaches each channel, once chosen
        self.facts = facts
        self.headers = headers
        self.created_at = datetime.now(UTC)
        self.started = time.monotonic()
        self.resources = Releases()
        self.attempts = 0
        self.hold: Hold | None = None  # its budgets' reservation and TPM count (gateway.governance.spend)
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

    # -- after the commit (M1–M6, S1): passed on by gateway.relay.delivery ------

    def stream_opened(self) -> None:
        self.streaming = True
        self.relay.meter.stream_opened()

    def too_slow(self) -> None:
        """The client has fallen too far behind what was sent to it: end the
        stream (with the interruption event) rather than buffer without end."""
        self.client_too_slow = True
        if self.attempt is not None:
            self.attempt.wake()

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

    def in_flight(self) -> Finished:
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
