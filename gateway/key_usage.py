"""When each API key was last used (ApiKey.last_used_at), written in the
background.

``note(key_id, when)`` is what a request calls once its key is known: it
only keeps the latest time per key in memory, under a lock held for a dict
look-up, so it costs nothing on the event loop. Every KEY_USAGE_INTERVAL
seconds a thread of its own (``core.periodic``, started by
``serving.background``) writes what was noted, in one transaction, keys in
id order (so several gateway processes cannot deadlock on each other's
keys), and only ever moves a key's time forward. What a failed write could
not store is kept for the next tick; a clean exit writes once more.
"""

from __future__ import annotations

import threading
from datetime import datetime

from django.db import transaction

from core.periodic import Periodic
from tenants.models import ApiKey

KEY_USAGE_INTERVAL = 5.0


class KeyUsage:
    def __init__(self) -> None:
        self._latest: dict[int, datetime] = {}
        self._lock = threading.Lock()

    def note(self, key_id: int, when: datetime) -> None:
        with self._lock:
            known = self._latest.get(key_id)
            if known is None or when > known:
                self._latest[key_id] = when

    def pending(self) -> dict[int, datetime]:
        with self._lock:
            return dict(self._latest)

    def write(self) -> int:
        """Write what was noted since the last write; returns how many keys."""
        with self._lock:
            latest, self._latest = self._latest, {}
        if not latest:
            return 0
        try:
            with transaction.atomic():
                for key_id, when in sorted(latest.items()):
                    ApiKey.objects.filter(pk=key_id).exclude(last_used_at__gte=when).update(last_used_at=when)
        except BaseException:
            for key_id, when in latest.items():
                self.note(key_id, when)
            raise
        return len(latest)


usage = KeyUsage()
note = usage.note


def key_usage_writer(source: KeyUsage = usage) -> Periodic:
    """The job writing last_used_at (not started)."""
    return Periodic("api-key-last-used", source.write, KEY_USAGE_INTERVAL, run_on_stop=True)
