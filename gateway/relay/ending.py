"""How a request's committed answer ends (rules M, D1): the attempt it
committed to, and the ending it came to, in its caller's terms."""

from __future__ import annotations

from dataclasses import dataclass

from channels_pool.upstream import Attempt
from core.errors import PROVIDER_ERROR_MESSAGE, ErrorKind, GatewayError
from core.vocabulary import RequestStatus
from providers.base import StreamWatcher

# What a request ended by a drain is told: another process will serve it.
DRAIN_RETRY_AFTER = 1


@dataclass
class Committed:
    """The attempt the request belongs to now (M1), and what the hold kept."""

    attempt: Attempt
    watcher: StreamWatcher
    first_bytes: bytes
    ended: bool  # the terminal event is already among the first bytes


@dataclass(frozen=True)
class Ending:
    """How a committed request ended. ``message`` None: the error kind's own."""

    status: RequestStatus
    busy: bool = False
    message: str | None = None
    retry_after: int | None = None
    drained: bool = False  # ended by a graceful drain (D1)

    def stream_error(self, watcher: StreamWatcher) -> bytes:
        kind = ErrorKind.STREAM_BUSY if self.busy else ErrorKind.STREAM_FAILED
        return watcher.stream_error(kind, self.message or PROVIDER_ERROR_MESSAGE)

    def error(self) -> GatewayError:
        if self.drained:
            return GatewayError(ErrorKind.UNAVAILABLE, self.message, retry_after=DRAIN_RETRY_AFTER)
        if self.busy:
            return GatewayError(ErrorKind.ALL_BUSY, self.message, retry_after=self.retry_after or 1)
        return GatewayError(ErrorKind.ALL_FAILED, self.message)
