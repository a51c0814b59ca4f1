"""The gateway's background jobs, started once per process by the first API
request (``serving.handler.ApiHandler.__call__`` calls ``ensure_started()``):

- channel health written to the database (channels_pool.jobs, ~1 s);
- the owners of provider state written (channels_pool.jobs, ~0.2 s);
- API keys' last_used_at written (gateway.key_usage, ~5 s);
- dead gateway processes' spools replayed into request logs (billing.jobs,
  at start and every 10 s);
- the settlement sweep, only without REDIS_URL, where there is no Celery
  beat (billing.jobs, every HOPBASE_SWEEP_INTERVAL s);
- with REDIS_URL, the listener for key revocations, which marks a revoked
  key refused in this process's cache the moment it is announced
  (tenants.revocations; not periodic: subscribed for as long as it runs).

Each runs on a daemon thread of its own (core.periodic), apart from the
request-log writer (billing.recorder), so a database outage waited out by
one delays none of the others. Only a process that serves API requests
starts them: manage.py commands, Celery workers and the test process never
sweep or write behind anyone's back. A clean exit writes health, key
usage and provider state owners once more (atexit); the recorder flushes
its own queue.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from typing import Protocol

from billing.jobs import settlement_sweep, spool_replayer
from channels_pool.jobs import health_writer, provider_state_writer
from gateway.key_usage import key_usage_writer
from tenants.revocations import listener


class Job(Protocol):
    """What a background job offers (core.periodic.Periodic, tenants.revocations.Subscriber)."""

    name: str

    def start(self) -> Job: ...
    def request_stop(self) -> None: ...
    def stop(self, timeout: float = 10) -> bool: ...
    @property
    def running(self) -> bool: ...


# Each makes one job (not started), or None when it has nothing to do here.
JOBS: tuple[Callable[[], Job | None], ...] = (
    health_writer, provider_state_writer, key_usage_writer, settlement_sweep, spool_replayer, listener,
)
STOP_TIMEOUT = 5.0

_started = False
_jobs: list[Job] = []
_lock = threading.Lock()


def ensure_started() -> None:
    """Start the background jobs, once; afterwards a flag test."""
    global _started
    if _started:
        return
    with _lock:
        if _started:
            return
        for make in JOBS:
            job = make()
            if job is not None:
                _jobs.append(job.start())
        atexit.register(stop)
        _started = True


def stop(timeout: float = STOP_TIMEOUT) -> None:
    """Stop the jobs (their final runs included), waiting at most ``timeout``
    seconds in all; ``ensure_started()`` may then start new ones."""
    global _started
    with _lock:
        jobs = list(_jobs)
        _jobs.clear()
        _started = False
        atexit.unregister(stop)
    for job in jobs:
        job.request_stop()
    deadline = time.monotonic() + timeout
    for job in jobs:
        job.stop(max(0.0, deadline - time.monotonic()))


def running() -> list[str]:
    return [job.name for job in _jobs if job.running]
