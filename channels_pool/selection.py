"""Channel choice: the ordered candidates for one request.

Enabled channels of the request's protocol that serve the model, higher
priority first, weighted random order within a priority. The channel table
is read at most once per HOPBASE_CONFIG_TTL per process (core.snapshots);
while the database is unreachable the last table known is used, for up to
HOPBASE_STALE_MAX_AGE seconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from channels_pool.models import Channel
from core.snapshots import Snapshot


@dataclass(frozen=True)
class ChannelInfo:
    id: int
    name: str
    protocol: str
    base_url: str
    secret: str = field(repr=False)  # never in a log line or a debug page
    models: frozenset[str]
    priority: int
    weight: int
    max_concurrency: int | None


def _load() -> list[ChannelInfo]:
    return [
        ChannelInfo(
            id=c.pk,
            name=c.name,
            protocol=c.protocol,
            base_url=c.base_url,
            secret=c.secret,
            models=frozenset(c.served_models or ()),
            priority=c.priority,
            weight=c.weight,
            max_concurrency=c.max_concurrency,
        )
        for c in Channel.objects.enabled()
    ]


def weighted_order(channels: list[ChannelInfo], rng: random.Random) -> list[ChannelInfo]:
    """Priority groups in descending order, each shuffled by weight
    (Efraimidis–Spirakis: sort by u ** (1 / weight))."""
    return sorted(channels, key=lambda c: (-c.priority, -(rng.random() ** (1.0 / c.weight))))


class ChannelDirectory:
    def __init__(self) -> None:
        self._snapshot: Snapshot[list[ChannelInfo]] = Snapshot(_load)
        self._rng = random.Random()

    async def all(self) -> list[ChannelInfo]:
        return await self._snapshot.get()

    async def candidates(self, protocol: str, model: str, pinned_id: int | None = None) -> list[ChannelInfo]:
        channels = [c for c in await self.all() if c.protocol == protocol and model in c.models]
        if pinned_id is not None:
            # Affinity (P9): only the account holding the state can answer.
            return [c for c in channels if c.id == pinned_id]
        return weighted_order(channels, self._rng)

    async def models(self, protocol: str | None = None) -> list[str]:
        names = {m for c in await self.all() if protocol is None or c.protocol == protocol for m in c.models}
        return sorted(names)

    def clear(self) -> None:
        self._snapshot.clear()


directory = ChannelDirectory()
