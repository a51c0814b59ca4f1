"""Channel health: a circuit breaker per channel, fed by every attempt.

    closed     the channel is tried in its turn
    open       after HOPBASE_BREAKER_FAILURES failures in a row it is skipped
               for a cool-down, which doubles (up to HOPBASE_BREAKER_MAX_COOLDOWN)
               each time it fails again
    half-open  when the cool-down has passed, one request may try it: success
               closes the breaker, failure opens it again

A skipped channel is still tried as a last resort when no healthy candidate
is left. The state lives in process memory (the hot path never waits for the
database); ``persist(board.changes())`` writes it to ChannelHealth every
second or so from a thread of its own (channels_pool.jobs) so operators see
it in the admin.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from django.conf import settings
from django.utils import timezone

RECENT = 50
class HasId(Protocol):
    @property
    def id(self) -> int: ...


Candidate = TypeVar("Candidate", bound=HasId)


@dataclass
class Breaker:
    state: str = "closed"
    consecutive_failures: int = 0
    cooldown: float = 0.0
    open_until: float = 0.0
    trial_running: bool = False
    successes: int = 0
    failures: int = 0
    last_error_kind: str = ""
    last_error: str = ""
    changed_at: datetime = field(default_factory=timezone.now)
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=RECENT))
    ttfts: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT))
    dirty: bool = True

    def _move(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.changed_at = timezone.now()


@dataclass(frozen=True)
class HealthSnapshot:
    channel_id: int
    state: str
    successes: int
    failures: int
    consecutive_failures: int
    last_error_kind: str
    last_error: str
    recent_success_pct: int | None
    median_ttft_ms: int | None
    open_until: datetime | None
    changed_at: datetime


class HealthBoard:
    def __init__(self) -> None:
        self._breakers: dict[int, Breaker] = {}
        # The event loop updates breakers; the health-writing thread reads them.
        self._lock = threading.Lock()

    def _breaker(self, channel_id: int) -> Breaker:
        breaker = self._breakers.get(channel_id)
        if breaker is None:
            breaker = self._breakers[channel_id] = Breaker()
        return breaker

    def arrange(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Healthy channels in their order, then the skipped ones as a last resort."""
        now = time.monotonic()
        healthy: list[Candidate] = []
        skipped: list[Candidate] = []
        with self._lock:
            for candidate in candidates:
                (healthy if self._admits(candidate.id, now) else skipped).append(candidate)
        return healthy + skipped

    def _admits(self, channel_id: int, now: float) -> bool:
        breaker = self._breakers.get(channel_id)
        if breaker is None or breaker.state == "closed":
            return True
        if breaker.state == "open" and now >= breaker.open_until:
            breaker._move("half_open")
            breaker.dirty = True
        return breaker.state == "half_open" and not breaker.trial_running

    def started(self, channel_id: int) -> None:
        with self._lock:
            breaker = self._breakers.get(channel_id)
            if breaker is not None and breaker.state == "half_open":
                breaker.trial_running = True

    def ended(self, channel_id: int) -> None:
        """An attempt is over. One that ended without a verdict (the client
        left, the request was at fault) must not keep a trial slot taken."""
        with self._lock:
            breaker = self._breakers.get(channel_id)
            if breaker is not None:
                breaker.trial_running = False

    def succeeded(self, channel_id: int, ttft_ms: int | None) -> None:
        with self._lock:
            breaker = self._breaker(channel_id)
            breaker.successes += 1
            breaker.recent.append(True)
            if ttft_ms is not None:
                breaker.ttfts.append(ttft_ms)
            breaker.consecutive_failures = 0
            breaker.cooldown = 0.0
            breaker.trial_running = False
            breaker._move("closed")
            breaker.dirty = True

    def failed(self, channel_id: int, kind: str, detail: str = "") -> None:
        """``detail`` is the provider's own account of it, for operators."""
        with self._lock:
            breaker = self._breaker(channel_id)
            breaker.failures += 1
            breaker.recent.append(False)
            breaker.last_error_kind = kind
            breaker.last_error = detail
            breaker.consecutive_failures += 1
            breaker.trial_running = False
            if breaker.state == "half_open" or breaker.consecutive_failures >= settings.HOPBASE_BREAKER_FAILURES:
                first = settings.HOPBASE_BREAKER_COOLDOWN
                breaker.cooldown = min(breaker.cooldown * 2 or first, settings.HOPBASE_BREAKER_MAX_COOLDOWN)
                breaker.open_until = time.monotonic() + breaker.cooldown
                breaker._move("open")
            breaker.dirty = True

    def changes(self) -> list[HealthSnapshot]:
        """What changed since the last call, for persisting."""
        now, wall = time.monotonic(), timezone.now()
        with self._lock:
            changed = [(channel_id, b) for channel_id, b in self._breakers.items() if b.dirty]
            for _, breaker in changed:
                breaker.dirty = False
            return [snapshot(channel_id, breaker, now, wall) for channel_id, breaker in changed]


def snapshot(channel_id: int, breaker: Breaker, now: float, wall: datetime) -> HealthSnapshot:
    recent = list(breaker.recent)
    return HealthSnapshot(
        channel_id=channel_id,
        state=breaker.state,
        successes=breaker.successes,
        failures=breaker.failures,
        consecutive_failures=breaker.consecutive_failures,
        last_error_kind=breaker.last_error_kind,
        last_error=breaker.last_error,
        recent_success_pct=round(100 * sum(recent) / len(recent)) if recent else None,
        median_ttft_ms=int(statistics.median(breaker.ttfts)) if breaker.ttfts else None,
        open_until=wall + timedelta(seconds=breaker.open_until - now) if breaker.state == "open" else None,
        changed_at=breaker.changed_at,
    )


def persist(snapshots: list[HealthSnapshot]) -> None:
    """Write health to the database (this process's view: counts are this
    process's since it started; the last writer wins)."""
    from channels_pool.models import Channel, ChannelHealth

    known = set(Channel.objects.filter(pk__in=[s.channel_id for s in snapshots]).values_list("pk", flat=True))
    for snap in snapshots:
        if snap.channel_id not in known:
            continue
        ChannelHealth.objects.update_or_create(
            channel_id=snap.channel_id,
            defaults={
                "state": snap.state,
                "successes": snap.successes,
                "failures": snap.failures,
                "consecutive_failures": snap.consecutive_failures,
                "last_error_kind": snap.last_error_kind,
                "last_error": snap.last_error[:300],
                "recent_success_pct": snap.recent_success_pct,
                "median_ttft_ms": snap.median_ttft_ms,
                "open_until": snap.open_until,
                "changed_at": snap.changed_at,
            },
        )


board = HealthBoard()
