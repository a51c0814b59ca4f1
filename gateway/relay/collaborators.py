"""What one request's ``Run`` and its delivery use of the relay that made
it: its clocks, and where it reports (the recorder, the channels' health
board, affinity, spend, the meter) — an interface, so that a request's
life depends on the relay's parts, not on the relay (gateway.relay.relay
makes runs; a run never makes a relay)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from django.conf import settings

from billing.finished import Finished
from channels_pool.affinity import Affinity
from channels_pool.health import HealthBoard
from channels_pool.selection import ChannelInfo
from gateway.relay.drain import Drain

if TYPE_CHECKING:
    from gateway.governance.spend import Spend, Unmetered


class Recorder(Protocol):
    def record(self, item: Finished) -> None: ...
    def track(self, request_id: str, snapshot: Callable[[], Finished]) -> None: ...
    def progress(self, item: Finished) -> None: ...


class Meter:
    """What the relay reports as it goes (gateway.metrics counts it); this
    one notes nothing."""

    def attempt(self, channel: ChannelInfo, outcome: str) -> None:
        pass

    def stream_opened(self) -> None:
        pass

    def stream_closed(self) -> None:
        pass


@dataclass(frozen=True)
class Timings:
    """The relay's clocks, in seconds (rules S1, F3, F7, F8, M2)."""

    keepalive: float
    first_token: float
    first_token_per_10k: float
    hold_max: float
    stall: float
    capacity_wait: float

    @classmethod
    def from_settings(cls) -> Timings:
        return cls(
            keepalive=settings.HOPBASE_KEEPALIVE_INTERVAL,
            first_token=settings.HOPBASE_FIRST_TOKEN_TIMEOUT,
            first_token_per_10k=settings.HOPBASE_FIRST_TOKEN_PER_10K,
            hold_max=settings.HOPBASE_HOLD_MAX,
            stall=settings.HOPBASE_STALL_TIMEOUT,
            capacity_wait=settings.HOPBASE_CAPACITY_WAIT,
        )


class Collaborators(Protocol):
    """The relay's parts a run reports to and reads (gateway.relay.relay.Relay has them all)."""

    board: HealthBoard
    affinity: Affinity
    recorder: Recorder
    timings: Timings
    drain: Drain
    meter: Meter
    spend: Spend | Unmetered
