"""Who owns each piece of provider state (P9): the tenant whose request
created a Responses id or a Gemini cache. A tenant that learns another
tenant's id must not be served the other tenant's conversation, so a request
naming it is refused (``channels_pool.affinity`` asks, the relay refuses).

Ownership is written durably to ``ProviderState`` (the routing cache of
``channels_pool.affinity`` may forget: it is bounded, and Redis entries
lapse). The hot path never waits for that write, and rarely for a read:

- ``remember`` notes an owner in this process at once and queues the row;
  a thread of its own (``core.periodic``, started by ``serving.background``)
  writes the queue in batches every WRITE_INTERVAL seconds. Past
  MAX_PENDING rows not yet written (a long database outage) new ones are
  dropped with a warning, and followed in this process only.
- ``owner`` answers from this process's memory: owners, once known, are kept
  (an owner never changes), least recently used first out past MAX_KNOWN.
  An id not known here is looked up in the database through
  ``core.snapshots.database_call`` (the hot path's pool and deadline), once:
  an id the database does not know either (one HopBase never issued) is
  asked again only after UNKNOWN_TTL seconds.
- While the database is unreachable an owner known here is still enforced
  (fail closed), and an id not known here is treated as never issued (fail
  open: the provider answers whether it knows it), as with every other
  hot-path read during an outage (D3).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from channels_pool.models import STATE_ID_MAX_LENGTH, Channel, ProviderState
from core import loggers
from core.errors import DatabaseUnavailable
from core.snapshots import database_call
from tenants.models import Tenant

log = logging.getLogger(loggers.PROVIDER_STATE)

MAX_KNOWN = 200_000
MAX_UNKNOWN = 20_000
UNKNOWN_TTL = 1.0  # seconds before an id the database did not know is asked again
MAX_PENDING = 100_000
WRITE_INTERVAL = 0.2
DROP_WARNING_EVERY = 10.0


@dataclass(frozen=True)
class Pending:
    tenant_id: int
    channel_id: int | None
    created_at: datetime


def load_owner(state_id: str) -> int | None:
    return ProviderState.objects.filter(state_id=state_id).values_list("tenant_id", flat=True).first()


def save_owners(rows: dict[str, Pending]) -> None:
    """Insert what is not there yet (an owner is written once; a second
    writer of the same id loses quietly). A channel or tenant deleted
    meanwhile is not referred to, so that one such row cannot hold up the
    others for ever."""
    channels = set(Channel.objects.filter(pk__in={p.channel_id for p in rows.values()}).values_list("pk", flat=True))
    tenants = set(Tenant.objects.filter(pk__in={p.tenant_id for p in rows.values()}).values_list("pk", flat=True))
    states = [
        ProviderState(
            state_id=state_id,
            tenant_id=p.tenant_id,
            channel_id=p.channel_id if p.channel_id in channels else None,
            created_at=p.created_at,
        )
        for state_id, p in rows.items()
        if p.tenant_id in tenants
    ]
    with transaction.atomic():
        ProviderState.objects.bulk_create(states, ignore_conflicts=True, batch_size=500)


class StateOwners:
    def __init__(
        self,
        load: Callable[[str], int | None] = load_owner,
        save: Callable[[dict[str, Pending]], None] = save_owners,
    ) -> None:
        self._load = load
        self._save = save
        self._known: OrderedDict[str, int] = OrderedDict()  # state id -> tenant id, least recently used first
        self._unknown: OrderedDict[str, float] = OrderedDict()  # state id -> when to ask again
        self._pending: dict[str, Pending] = {}
        self._lock = threading.Lock()  # the pending rows: the loop adds, the writer thread takes
        self.dropped = 0
        self._last_drop_warning = 0.0

    @staticmethod
    def storable(state_id: str) -> bool:
        return 0 < len(state_id) <= STATE_ID_MAX_LENGTH

    def remember(self, state_id: str, tenant_id: int, channel_id: int | None) -> None:
        """A request of ``tenant_id`` created ``state_id`` (on the event loop: no I/O)."""
        if not self.storable(state_id):
            return
        self._keep(state_id, tenant_id)
        self._unknown.pop(state_id, None)
        with self._lock:
            if state_id in self._pending or len(self._pending) < MAX_PENDING:
                self._pending[state_id] = Pending(tenant_id, channel_id, timezone.now())
                return
            self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_warning >= DROP_WARNING_EVERY:
            self._last_drop_warning = now
            log.warning(
                "provider state owners: %d not yet written; %d dropped so far (enforced in this process only)",
                MAX_PENDING, self.dropped,
            )

    async def owner(self, state_id: str) -> int | None:
        """The tenant that created ``state_id``, or None when HopBase never
        issued it (or cannot tell now: the database is unreachable)."""
        owner = self._known.get(state_id)
        if owner is not None:
            self._known.move_to_end(state_id)
            return owner
        if not self.storable(state_id):
            return None  # never stored: not one HopBase issued
        retry_at = self._unknown.get(state_id)
        if retry_at is not None and time.monotonic() < retry_at:
            return None
        try:
            owner = await database_call(self._load, state_id)
        except DatabaseUnavailable:
            return None  # fail open for ids not known here; D3
        if owner is None:
            self._unknown[state_id] = time.monotonic() + UNKNOWN_TTL
            self._unknown.move_to_end(state_id)
            while len(self._unknown) > MAX_UNKNOWN:
                self._unknown.popitem(last=False)
        else:
            self._keep(state_id, owner)
        return owner

    def _keep(self, state_id: str, tenant_id: int) -> None:
        self._known[state_id] = tenant_id
        self._known.move_to_end(state_id)
        while len(self._known) > MAX_KNOWN:
            self._known.popitem(last=False)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def write(self) -> int:
        """Write the rows noted since the last write (the writer thread);
        returns how many. What a failed write could not store is kept for
        the next one."""
        with self._lock:
            rows, self._pending = self._pending, {}
        if not rows:
            return 0
        try:
            self._save(rows)
        except BaseException:
            with self._lock:
                for state_id, row in rows.items():
                    self._pending.setdefault(state_id, row)
            raise
        return len(rows)

    def clear(self) -> None:
        """Forget what this process knows (tests); pending rows stay."""
        self._known.clear()
        self._unknown.clear()


owners = StateOwners()
