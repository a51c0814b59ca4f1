"""A process's open-request capacity, and each tenant's share of it.

The capacity is ``HOPBASE_MAX_OPEN_REQUESTS``, or else derived from
``RLIMIT_NOFILE`` and ``HOPBASE_UPSTREAM_MAX_CONNECTIONS``; the front door
(``serving.admission``) refuses what is beyond it before any key is read.

Fair share (G8): no tenant holds more than its share of it, so one
tenant's burst is refused its excess rather than filling the process and
refusing everyone at the door.

A tenant's share is the capacity divided among the tenants with requests
open here (itself included), and a tenant alone may hold all but a tenth
of it: the room kept back lets another tenant's request in past the door,
after which the first tenant's share halves and its excess is refused (429
``rate_limit``, with ``retry-after``) while the newcomer is served. Counted
per process, like the capacity itself; the key is known here, so refusals
are logged as ``rejected``.
"""

from __future__ import annotations

import functools
import resource
from collections import Counter
from collections.abc import Callable

from django.conf import settings

from core.errors import ErrorKind, GatewayError

# File descriptors kept back from requests: the database and Redis
# connections, the listening socket, logs, and the sockets of requests being
# refused.
FD_HEADROOM = 64
FD_HEADROOM_SHARE = 0.05


def derived_limit(open_files: int, upstream_connections: int) -> int:
    """Two sockets a request, after a headroom, and no more than the
    upstream pool holds (beyond it, requests would queue for a connection)."""
    if open_files == resource.RLIM_INFINITY:
        return upstream_connections
    spare = open_files - FD_HEADROOM - int(open_files * FD_HEADROOM_SHARE)
    return max(1, min(spare // 2, upstream_connections))


@functools.cache
def max_open_requests() -> int:
    if settings.HOPBASE_MAX_OPEN_REQUESTS:
        return settings.HOPBASE_MAX_OPEN_REQUESTS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return derived_limit(soft, settings.HOPBASE_UPSTREAM_MAX_CONNECTIONS)


OVER_SHARE = "This tenant has its share of HopBase's capacity in use. Please retry shortly."
KEPT_BACK = 10  # a lone tenant leaves 1 / KEPT_BACK of the capacity for others


class FairShare:
    """This process's open requests by tenant (one event loop's: no lock)."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self._capacity = capacity
        self._open: Counter[int] = Counter()

    def share(self, tenant_id: int) -> int:
        capacity = self._capacity()
        active = len(self._open) + (tenant_id not in self._open)
        if active == 1:
            return max(1, capacity - capacity // KEPT_BACK)
        return max(1, -(-capacity // active))

    def admit(self, tenant_id: int) -> None:
        """Count one more open request of the tenant's, or raise its refusal."""
        if self._open[tenant_id] >= self.share(tenant_id):
            if not self._open[tenant_id]:
                del self._open[tenant_id]  # Counter's lookup made no entry; nothing to undo
            raise GatewayError(ErrorKind.RATE_LIMIT, OVER_SHARE, retry_after=1)
        self._open[tenant_id] += 1

    def release(self, tenant_id: int) -> None:
        self._open[tenant_id] -= 1
        if self._open[tenant_id] <= 0:
            del self._open[tenant_id]
