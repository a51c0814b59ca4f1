"""The gateway as it runs: the relay put together from the process's real
collaborators, once per event loop (the HTTP client's pool belongs to one
loop; Daphne runs one, the tests several)."""

from __future__ import annotations

import asyncio

from billing.recorder import recorder as billing_recorder
from channels_pool.affinity import affinity
from channels_pool.health import board
from channels_pool.http_client import new_client
from channels_pool.selection import directory
from core import lifecycle
from gateway.governance.capacity import FairShare, max_open_requests
from gateway.governance.limits import limits
from gateway.governance.spend import spend
from gateway.metrics import Counted, PrometheusMeter
from gateway.relay.collaborators import Timings
from gateway.relay.drain import Drain
from gateway.relay.relay import Relay

# Every record the gateway makes is counted on its way (gateway.metrics).
recorder = Counted(billing_recorder)
_relays: dict[int, Relay] = {}


def relay() -> Relay:
    loop_id = id(asyncio.get_running_loop())
    built = _relays.get(loop_id)
    if built is None:
        built = _relays[loop_id] = Relay(
            http=new_client(),
            board=board,
            limits=limits,
            affinity=affinity,
            recorder=recorder,
            directory=directory,
            timings=Timings.from_settings(),
            drain=Drain(lifecycle.drain_deadline, lifecycle.drain_signal),
            meter=PrometheusMeter(),
            spend=spend,
            fair=FairShare(max_open_requests),
        )
        lifecycle.process.close_when_drained(built.http.aclose)
    return built
