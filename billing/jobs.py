"""Billing's periodic work in a gateway process: replaying the spools of
dead gateway processes, and the in-process settlement sweep.

Replay: a gateway process that was killed (SIGKILL, OOM) leaves its spool
(billing.spool); every gateway process on the same host replays such files
right after it starts and every SPOOL_REPLAY_INTERVAL seconds. (Celery
workers may run on other hosts and cannot read them.)

With REDIS_URL, Celery beat runs ``billing.tasks.sweep_unsettled`` every
HOPBASE_SWEEP_INTERVAL seconds. Without it there is no beat, so the gateway
runs the same sweep on a thread of its own (``core.periodic``), started by
``serving.background`` with the first API request: manage.py commands,
Celery workers and the test process never sweep behind anyone's back. The
first sweep comes soon after start-up (SWEEP_DELAY at most): it settles
what a previous run of the gateway left behind.
"""

from __future__ import annotations

import logging

from django.conf import settings

from billing.recorder import recorder
from billing.settlement import SWEEP_DELAY, sweep
from billing.spool import replay_dead
from core import loggers
from core.periodic import Periodic

SPOOL_REPLAY_INTERVAL = 10.0

log = logging.getLogger(loggers.SETTLEMENT)


def in_process_sweep_interval() -> float | None:
    """Seconds between in-process sweeps: only without a broker (no beat)."""
    return None if settings.REDIS_URL else settings.HOPBASE_SWEEP_INTERVAL


def sweep_once() -> int:
    result = sweep()
    if result.settled:
        log.info("in-process sweep settled %d request logs", result.settled)
    return result.settled


def settlement_sweep() -> Periodic | None:
    """The in-process sweep job (not started), or None when beat sweeps."""
    interval = in_process_sweep_interval()
    if interval is None:
        return None
    return Periodic("settlement-sweep", sweep_once, interval, first_delay=min(interval, SWEEP_DELAY.total_seconds()))


def replay_spools() -> int:
    return replay_dead(settings.HOPBASE_SPOOL_DIR, recorder.write_now)


def spool_replayer() -> Periodic:
    """The job that turns dead processes' spools into rows (not started)."""
    return Periodic("spool-replay", replay_spools, SPOOL_REPLAY_INTERVAL, first_delay=0)
