"""The channels' periodic work in a gateway process: writing channel health,
and the owners of provider state (channels_pool.provider_state).

The breakers live in process memory (``channels_pool.health.board``: the hot
path never waits for the database). Every HEALTH_INTERVAL seconds a thread
of its own (``core.periodic``, started by ``serving.background``) writes what
changed to ChannelHealth, so operators see it in the admin. Snapshots a
failed write could not store are kept, newest per channel, and written at
the next tick; a clean exit writes once more.
"""

from __future__ import annotations

import threading

from channels_pool.health import HealthBoard, HealthSnapshot, board, persist
from channels_pool.provider_state import WRITE_INTERVAL, StateOwners, owners
from core.periodic import Periodic

HEALTH_INTERVAL = 1.0


class HealthWriter:
    def __init__(self, source: HealthBoard = board) -> None:
        self._source = source
        self._unsaved: dict[int, HealthSnapshot] = {}
        self._lock = threading.Lock()

    def __call__(self) -> int:
        """Write what changed since the last write; returns how many channels."""
        with self._lock:
            for snap in self._source.changes():
                self._unsaved[snap.channel_id] = snap
            if not self._unsaved:
                return 0
            snapshots = list(self._unsaved.values())
            persist(snapshots)  # raises: kept for the next tick
            self._unsaved.clear()
            return len(snapshots)


def health_writer(source: HealthBoard = board) -> Periodic:
    """The health-writing job (not started)."""
    return Periodic("channel-health", HealthWriter(source), HEALTH_INTERVAL, run_on_stop=True)


def provider_state_writer(source: StateOwners = owners) -> Periodic:
    """The job writing who owns each Responses id and Gemini cache (not started)."""
    return Periodic("provider-state", source.write, WRITE_INTERVAL, run_on_stop=True)
