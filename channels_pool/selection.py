"""Channel choice: the ordered candidates for one request.

Enabled channels of the protocols that can serve the request (its own, or
any other through translation) that serve the model, higher priority first;
within a priority, channels of the client's own protocol (byte-exact and
cheapest) before those that need a translation; weighted random order within a priority. The channel table
is read at most once per HOPBASE_CONFIG_TTL per process (core.snapshots);
while the database is unreachable the last table known is used, for up to
HOPBASE_STALE_MAX_AGE seconds.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from channels_pool.models import Channel
from core import loggers
from core.encryption import Unreadable
from core.snapshots import Snapshot
from providers.kind import ChannelKind
from providers.kinds import KINDS

log = logging.getLogger(loggers.CHANNELS)


@dataclass(frozen=True)
class ChannelInfo:
    id: int
    name: str
    protocol: str  # the channel's kind (providers.kinds)
    base_url: str
    secret: str = field(repr=False)  # never in a log line or a debug page
    models: Mapping[str, str] = field(hash=False)  # public name -> the name this channel is sent
    priority: int
    weight: int
    max_concurrency: int | None
    cross_protocol: bool = True  # may serve clients of other protocols, translated
    responses_only: frozenset[str] = frozenset()  # upstream names served on Responses alone
    region: str = ""
    project: str = ""
    location: str = ""
    api_version: str = ""

    def upstream_model(self, model: str) -> str:
        return self.models.get(model, model)

    @property
    def kind(self) -> ChannelKind:
        return KINDS[self.protocol]

    def grammar(self, model: str) -> str:
        """The grammar this channel speaks for the public ``model``."""
        return KINDS[self.protocol].grammar(self.models.get(model, model))


def _load() -> list[ChannelInfo]:
    channels = list(Channel.objects.enabled())
    for broken in [c for c in channels if isinstance(c.secret, Unreadable)]:
        # Skipped, never fatal: the other channels still serve every model.
        log.error("channel %s is skipped: its secret cannot be decrypted with the configured keys; "
                  "enter it again in the admin, or list the key it was encrypted with", broken.name)
    return [
        ChannelInfo(
            id=c.pk,
            name=c.name,
            protocol=c.protocol,
            base_url=c.base_url,
            secret=c.secret,
            models=c.model_map(),
            priority=c.priority,
            weight=c.weight,
            max_concurrency=c.max_concurrency,
            cross_protocol=c.cross_protocol,
            responses_only=frozenset(c.responses_only or ()),
            region=c.region,
            project=c.project,
            location=c.location,
            api_version=c.api_version,
        )
        for c in channels
        if not isinstance(c.secret, Unreadable)
    ]


def weighted_order(found: list[tuple[ChannelInfo, bool]], rng: random.Random) -> list[ChannelInfo]:
    """Channels (each with whether it speaks the client's own grammar) in
    priority groups in descending order, the client's grammar first within
    each, each shuffled by weight (Efraimidis–Spirakis: sort by u ** (1 / weight))."""
    ordered = sorted(found, key=lambda f: (-f[0].priority, not f[1], -(rng.random() ** (1.0 / f[0].weight))))
    return [channel for channel, _ in ordered]


class ChannelDirectory:
    def __init__(self) -> None:
        self._snapshot: Snapshot[list[ChannelInfo]] = Snapshot(_load)
        self._rng = random.Random()

    async def all(self) -> list[ChannelInfo]:
        return await self._snapshot.get()

    async def candidates(
        self, protocols: Collection[str], model: str, pinned_id: int | None = None, native: str = "",
        grammar_of: Callable[[ChannelInfo, str], str | None] = ChannelInfo.grammar,
    ) -> list[ChannelInfo]:
        """The channels serving ``model`` in one of ``protocols`` (each
        channel's grammar for the model as ``grammar_of`` tells it), in order."""
        found = [
            (c, grammar == native) for c in await self.all()
            if model in c.models and (grammar := grammar_of(c, model)) in protocols
            and (c.cross_protocol or grammar == native)
        ]
        if pinned_id is not None:
            # Affinity (P9): only the account holding the state can answer.
            return [c for c, _ in found if c.id == pinned_id]
        return weighted_order(found, self._rng)

    async def models(self) -> list[str]:
        """Every public model name some channel serves, whatever its protocol."""
        return sorted({m for c in await self.all() for m in c.models})

    async def embedding_models(self) -> frozenset[str]:
        """The public models served for embeddings: by a channel with an
        embeddings endpoint for it, named as one (an ``embed`` in either name;
        a kind such as OpenAI's offers its endpoint for every model)."""
        return frozenset(
            public for c in await self.all() for public, upstream in c.models.items()
            if "embed" in f"{public} {upstream}".lower() and c.kind.embedding_grammar(upstream) is not None
        )

    def clear(self) -> None:
        self._snapshot.clear()


directory = ChannelDirectory()
