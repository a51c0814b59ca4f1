"""A whole answer asked for in parts: a request the channel takes only in
smaller pieces (a batch of embeddings larger than its limit) is sent as
several, a few at a time, and stands or falls as one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from core.errors import UpstreamFailure

# How many parts of one request are in flight at once.
PART_CONCURRENCY = 8
Part = TypeVar("Part")


async def read_in_parts(
    parts: Sequence[Part], read: Callable[[Part], Awaitable[bytes | UpstreamFailure]]
) -> list[bytes] | UpstreamFailure:
    """Each part's body in the parts' order; or the failure of the first part
    (in that order) that failed, the others then given up."""
    gate = asyncio.Semaphore(PART_CONCURRENCY)

    async def one(part: Part) -> bytes | UpstreamFailure:
        async with gate:
            return await read(part)

    reads = [asyncio.ensure_future(one(part)) for part in parts]
    try:
        bodies = []
        for done in reads:
            body = await done
            if isinstance(body, UpstreamFailure):
                return body
            bodies.append(body)
        return bodies
    finally:
        for pending in reads:
            pending.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
