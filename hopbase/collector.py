"""The garbage collector, set for a gateway process (hopbase.asgi calls
``settle()`` once the process has loaded).

A gateway process holds some 120,000 objects once Django, the apps and
their libraries are loaded, and keeps nearly all of them for its life. Left
as it is, the collector walks them all in every full collection (about 60
ms each, a few times a minute under load), and runs its youngest
collection every 700 new objects: together about 7 % of the gateway's CPU
per request. So what is loaded at start is frozen (never walked again; it
lives as long as the process anyway), and the youngest collection waits for
more new objects. Garbage with reference cycles is still collected, in
larger batches.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle() -> None:
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
