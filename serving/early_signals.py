"""A stop signal that reaches a ``manage.py serve`` worker while it is
still starting (importing the application takes a second or two) is kept
and obeyed once it serves, rather than ending it on the spot.

Ended on the spot, the worker would take with it the connections the
kernel had already queued on its socket (its share of the port's
``SO_REUSEPORT`` group): they would be reset unanswered. Kept, the worker
starts, drains at once (it has nothing open) and answers what was queued
with table E's 503 until its peers have drained too (serving.worker_group),
as a worker that was serving does.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_pending: int | None = None


def _keep(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = _pending or signum


def hold() -> None:
    """Keep stop signals from now until the server installs its own handlers."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _keep)


def pending() -> int | None:
    """The stop signal that arrived while starting, if one did."""
    return _pending
