"""The garbage collector, set for a gateway process (``settle()``, once,
when the process's first API request is done, as serving.handler tells
``request_ended``: by then it has loaded what serving needs, and only a
process that serves is set). Not in the middle of a burst, though (more than ``QUIET`` requests open):
that collection would walk every request in flight and freeze them all; a
process started into 5,000 streams spent seconds in it. It waits for a
request that ends with the process quieter, or for ``PATIENCE`` requests
to have ended (a process that is never quiet is set all the same).

A gateway process holds some 120,000 objects once Django, the apps and
their libraries are loaded, and keeps nearly all of them for its life. Left
as it is, the collector walks them all in every full collection (about 60
ms each), and runs its youngest collection every 700 new objects: with the
cycles one answer used to leave (channels_pool.upstream), about 5 % of the
gateway's CPU per request. So what is loaded at start is frozen (never
walked again; it lives as long as the process anyway), and the youngest
collection waits for more new objects. Garbage with reference cycles is
still collected, in larger batches.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000
QUIET = 8
PATIENCE = 1_000
settled = False
ended = 0


def request_ended(open_requests: int) -> None:
    """An API request ended, ``open_requests`` still open: settle now if
    it is time."""
    global ended
    ended += 1
    if not settled and (open_requests <= QUIET or ended >= PATIENCE):
        settle()


def settle() -> None:
    global settled
    settled = True
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
