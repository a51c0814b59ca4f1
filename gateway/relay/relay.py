"""The shared relay: attempts over candidate channels, the hold until the first
content token, failover before it, then the committed stream (rules F, B1).

    request facts + caller
      -> key limits, affinity, candidates (channel choice)
      -> hold: attempt channel after channel until one yields a content
         token (or its terminal event, or the hold cap passes)
      -> commit: status, headers, the held preamble and that token go out
         together; then events pass through unchanged (gateway.relay.delivery)
      -> one Finished record to the recorder, whatever happened

Nothing here knows which API it is relaying: the protocol module marks
events and renders errors. A ``Relay`` is built from its collaborators (an
HTTP client, the health board, limits, affinity, the recorder, the channel
directory, timings), so tests can hand it fakes; ``gateway.assembly`` builds
the real one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace

import httpx
import orjson

from channels_pool.affinity import Affinity, ForeignState
from channels_pool.health import HealthBoard
from channels_pool.selection import ChannelDirectory, ChannelInfo
from channels_pool.upstream import Attempt, Signal
from core import loggers
from core.errors import (
    CONTENT_FILTERED_MESSAGE,
    RESPONSES_ONLY,
    UPSTREAM_REJECTED_MESSAGE,
    ErrorKind,
    GatewayError,
    UpstreamFailure,
)
from core.surcharges import beta_surcharges, without
from core.vocabulary import RequestStatus
from gateway.auth import Caller
from gateway.governance.capacity import FairShare
from gateway.governance.limits import POLL_SECONDS, Limits
from gateway.governance.spend import Spend, Unmetered
from gateway.relay import delivery
from gateway.relay.collaborators import Meter, Recorder, Timings
from gateway.relay.drain import Drain
from gateway.relay.ending import DRAIN_RETRY_AFTER, Committed
from gateway.relay.releases import Releases
from gateway.relay.run import Run
from gateway.reply import STREAM_HEADERS, Reply, error_reply
from providers.base import Api, Mark, RequestFacts, dumps
from providers.embedding_legs import EmbeddingLegs
from providers.legs import TOO_DEEP, Legs, learn_responses_only, legs_for
from providers.neutral import CannotServe
from providers.translation import Leg

log = logging.getLogger(loggers.RELAY)
# The hold was cut short by a graceful drain's deadline (D1): no channel's fault.
DRAINED = UpstreamFailure("drain", channel_fault=False)


@dataclass
class Relay:
    http: httpx.AsyncClient
    board: HealthBoard
    limits: Limits
    affinity: Affinity
    recorder: Recorder
    directory: ChannelDirectory
    timings: Timings
    drain: Drain = field(default_factory=Drain.never)
    meter: Meter = field(default_factory=Meter)
    spend: Spend | Unmetered = field(default_factory=Unmetered)
    fair: FairShare | None = None  # None: no share to keep (a relay built for tests)

    async def serve(
        self, request_id: str, api: Api, caller: Caller, facts: RequestFacts, headers: dict[str, str]
    ) -> Reply:
        """Serve one authenticated, parsed request."""
        run = Run(self, request_id, api, caller, facts, headers)
        try:
            if self.fair is not None:
                self.fair.admit(caller.tenant_id)
                run.resources.callback(self.fair.release, caller.tenant_id)
            if await self.limits.admit_key(caller.key_id, caller.rpm, caller.concurrency):
                run.resources.callback(self.limits.release_key, caller.key_id)
            if asked := api.surcharges(facts, headers) + beta_surcharges(headers):
                caller, dropped = await self.spend.surcharged(caller, facts.model, asked)
                run.caller = caller
                if dropped:  # an unpriced search the request only offers: answered unsearched (B10)
                    body = without(facts.body, dropped)
                    run.facts = facts = replace(facts, body=body, raw_body=dumps(body))
            run.hold = await self.spend.admit(caller, api, facts, request_id)
            pinned = await self._pinned(api, caller, facts)
            run.legs = legs = legs_for(api, facts, request_id)
            found = await self.directory.candidates(legs.wires(), facts.model, pinned, native=api.wire,
                                                    grammar_of=legs.grammar)
            candidates = self.board.arrange(found)
            if not candidates:
                run.error_kind = ErrorKind.MODEL_NOT_FOUND.value
                run.finish(RequestStatus.REJECTED)
                return error_reply(api, GatewayError(ErrorKind.MODEL_NOT_FOUND))
            committed = await self.hold(run, self._routes(legs, candidates))
        except GatewayError as error:
            run.error_kind = run.error_kind or error.kind.value
            run.finish(RequestStatus.FAILED if run.attempts else RequestStatus.REJECTED)
            return error_reply(api, error)
        except orjson.JSONEncodeError:
            # A body nested past what JSON writers take (255 levels), met where it is written anew.
            run.error_kind = ErrorKind.MALFORMED.value
            run.finish(RequestStatus.REJECTED)
            return error_reply(api, GatewayError(ErrorKind.MALFORMED, TOO_DEEP))
        except Exception:
            log.exception("request %s failed inside the relay", request_id)
            run.error_kind = "internal"
            run.finish(RequestStatus.FAILED)
            return error_reply(api, GatewayError(ErrorKind.ALL_FAILED))
        except BaseException:
            run.finish(RequestStatus.CANCELLED)
            raise
        upstream_headers = committed.attempt.passed_back_headers()
        if not facts.stream:
            reply = await delivery.collect(run, committed)
            reply.headers.update(upstream_headers)
            return reply
        run.stream_opened()
        return Reply(
            200,
            committed.watcher.content_type,
            chunks=delivery.stream(run, committed),
            headers={**STREAM_HEADERS, **upstream_headers},
            # The response is being closed: a stream that ran has already
            # finished; one dropped before it was ever read finishes now.
            abandon=lambda: run.finish(RequestStatus.CANCELLED),
            too_slow=run.too_slow,
        )

    async def _pinned(self, api: Api, caller: Caller, facts: RequestFacts) -> int | None:
        """The channel holding the state the request names (P9), if HopBase
        knows it. Another tenant's state is refused as not found, before any
        channel is called: its owner's conversation must not be served."""
        if not facts.affinity_key:
            return None
        try:
            return await self.affinity.channel_for(facts.affinity_key, caller.tenant_id)
        except ForeignState:
            raise self._state_not_found(api) from None

    @staticmethod
    def _state_not_found(api: Api) -> GatewayError:
        field = api.state_field or "state"
        message = f"The `{field}` given was not found."
        return GatewayError(ErrorKind.STATE_NOT_FOUND, message, param=api.state_field or None)

    @staticmethod
    def _routes(legs: Legs | EmbeddingLegs, candidates: list[ChannelInfo]) -> list[tuple[ChannelInfo, Leg]]:
        """Each candidate with its leg; those whose protocol cannot express
        the request are ruled out (T3), and if that is all of them the
        request is refused naming the field."""
        routes = []
        refusal: CannotServe | None = None
        for channel in candidates:
            try:
                routes.append((channel, legs.to(channel)))
            except CannotServe as error:
                refusal = refusal or error
        if not routes and refusal is not None:
            raise GatewayError(ErrorKind.MALFORMED, refusal.reason, param=refusal.field)
        return routes

    # -- the hold (F1–F8) ------------------------------------------------

    async def hold(self, run: Run, routes: list[tuple[ChannelInfo, Leg]]) -> Committed:
        """Try channels in order until one yields its first content token."""
        loop = asyncio.get_running_loop()
        hold_until = loop.time() + self.timings.hold_max
        failures: list[UpstreamFailure] = []
        refusal: CannotServe | None = None  # a learnt Responses-only model the request cannot be written for
        for index, (channel, leg) in enumerate(routes):
            is_last = index == len(routes) - 1
            with Releases() as held:
                if not await self._take_capacity(channel, may_wait=is_last, held=held):
                    failures.append(UpstreamFailure("capacity", busy=True))
                    self.meter.attempt(channel, "capacity")
                    continue
                attempt = self._start_attempt(run, channel, leg, held)
                slow_start = self._slow_start_limit(run, leg, is_last)
                give_up_at = hold_until if slow_start is None else min(hold_until, loop.time() + slow_start)
                outcome = await self._first_token(run, attempt, give_up_at, hold_until)
                self.meter.attempt(channel, "ok" if isinstance(outcome, Committed) else outcome.kind)
                if isinstance(outcome, Committed):
                    run.committed = True
                    run.resources.take_over(held)
                    return outcome
            if outcome is DRAINED:
                run.error_kind = DRAINED.kind
                raise GatewayError(ErrorKind.UNAVAILABLE, retry_after=DRAIN_RETRY_AFTER)
            if run.facts.affinity_key and (outcome.status == 404 or outcome.about_state):
                # The provider does not know the state the client named: the
                # request's fault, whichever channel answers it, and never
                # counted against the channel (a tenant could trip breakers).
                raise self._state_not_found(run.api)
            if outcome.kind == RESPONSES_ONLY and run.legs is not None:
                # The model refuses Chat Completions: learnt, and asked again on this channel in Responses.
                learn_responses_only(channel, leg.facts.model)
                try:
                    routes.insert(index + 1, (channel, run.legs.to(channel)))
                except CannotServe as error:  # what Responses cannot say (stop sequences): other candidates may
                    refusal = refusal or error
                continue
            if not outcome.channel_fault:
                raise GatewayError(*self._request_fault(outcome))
            failures.append(outcome)
            self.board.failed(channel.id, outcome.kind, outcome.detail)
        if refusal is not None and not failures:
            raise GatewayError(ErrorKind.MALFORMED, refusal.reason, param=refusal.field)
        run.error_kind = failures[-1].kind if failures else "no_channel"
        raise self._all_failed(failures)

    def _start_attempt(self, run: Run, channel: ChannelInfo, leg: Leg, held: Releases) -> Attempt:
        kind, grammar = channel.kind, leg.api.upstream_failure
        requests = [kind.request(channel, call) for call in leg.api.upstream_calls(leg.facts, run.headers)]
        self.board.started(channel.id)
        held.callback(self.board.ended, channel.id)
        attempt = Attempt(
            self.http, channel, requests,
            lambda status, body, retry_after: kind.failure(channel, status, body, retry_after, grammar),
            whole_body=not leg.api.upstream_streams,
        )
        held.callback(attempt.end)
        self.drain.watch(attempt)
        held.callback(self.drain.unwatch, attempt)
        run.attempts += 1
        run.channel, run.watcher, run.upstream_model = channel, leg.new_watcher(), leg.facts.model
        return attempt

    async def _first_token(
        self, run: Run, attempt: Attempt, give_up_at: float, hold_until: float
    ) -> Committed | UpstreamFailure:
        """Read one attempt until its first content token (committed), the
        hold cap (committed anyway, F7), or a failure."""
        loop = asyncio.get_running_loop()
        watcher = run.watcher
        assert watcher is not None
        held: list[bytes] = []
        awaiting_headers = False
        while True:
            drain_at = self.drain.deadline()
            wake_at = give_up_at if drain_at is None else min(give_up_at, drain_at)
            item = await attempt.next(wake_at - loop.time())
            run.upstream_status = attempt.status
            match item:
                case Signal.TIMEOUT:
                    if drain_at is not None and loop.time() >= drain_at:
                        return DRAINED
                    if loop.time() < give_up_at:
                        continue  # woken early (the drain began): look again
                    if awaiting_headers:
                        return UpstreamFailure("timeout")
                    if loop.time() < hold_until:
                        return UpstreamFailure("slow_start", attempt.status)
                    if attempt.status is None:
                        # F7 commits to a channel that has answered; one that
                        # has not even sent its status can still fail over.
                        awaiting_headers = True
                        give_up_at = loop.time() + self.timings.stall
                        continue
                    return Committed(attempt, watcher, b"".join(held), ended=False)
                case Signal.OPENED:
                    if loop.time() >= hold_until:
                        return Committed(attempt, watcher, b"".join(held), ended=False)
                case Signal.PROGRESS:
                    pass
                case UpstreamFailure():
                    return item
                case Signal.END:
                    return UpstreamFailure("cut", attempt.status)
                case _:
                    mark = watcher.mark(item)
                    if mark & Mark.ERROR:
                        return UpstreamFailure("error_event", attempt.status, busy=watcher.busy_error)
                    if mark & Mark.DROP:
                        continue
                    held.append(watcher.client_bytes(item))
                    if mark & (Mark.CONTENT | Mark.TERMINAL):
                        run.content_arrived(attempt.channel.id)
                        return Committed(attempt, watcher, b"".join(held), ended=bool(mark & Mark.TERMINAL))

    async def _take_capacity(self, channel: ChannelInfo, may_wait: bool, held: Releases) -> bool:
        """A slot under the channel's max concurrency. A full channel is
        skipped, but the last one left is waited for (F8)."""
        deadline = time.monotonic() + (self.timings.capacity_wait if may_wait else 0)
        while not await self.limits.take_channel(channel.id, channel.max_concurrency):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_SECONDS)
        held.callback(self.limits.release_channel, channel.id, channel.max_concurrency)
        return True

    def _slow_start_limit(self, run: Run, leg: Leg, is_last: bool) -> float | None:
        """F3: a model that must start within a limit (by the name the
        channel is sent), unless this is the last channel left."""
        if is_last or not leg.api.slow_start_applies(leg.facts.model, leg.facts):
            return None
        per_10k = self.timings.first_token_per_10k * run.facts.prompt_tokens_estimate / 10_000
        return self.timings.first_token + per_10k

    @staticmethod
    def _request_fault(failure: UpstreamFailure) -> tuple[ErrorKind, str]:
        if failure.kind == ErrorKind.CONTENT_FILTER.value:
            return ErrorKind.CONTENT_FILTER, CONTENT_FILTERED_MESSAGE
        if failure.status == 413:
            return ErrorKind.TOO_LARGE, "The request is too large for the model provider."
        return ErrorKind.MALFORMED, UPSTREAM_REJECTED_MESSAGE

    @staticmethod
    def _all_failed(failures: list[UpstreamFailure]) -> GatewayError:
        if failures and all(f.busy for f in failures):
            hints = [f.retry_after for f in failures if f.retry_after is not None]
            return GatewayError(ErrorKind.ALL_BUSY, retry_after=min(hints) if hints else 1)
        return GatewayError(ErrorKind.ALL_FAILED)
