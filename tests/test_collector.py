"""The garbage collector of a gateway process (hopbase.collector): what is
loaded at start is frozen, and young objects gather longer between
collections."""

from __future__ import annotations

import gc

from hopbase import collector


def test_settling_freezes_what_is_loaded_and_raises_the_young_threshold():
    thresholds = gc.get_threshold()
    frozen = gc.get_freeze_count()
    loaded = object.__new__(type("Loaded", (), {}))
    try:
        collector.settle()
        assert gc.get_freeze_count() > frozen
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *thresholds[1:])
        assert not any(o is loaded for o in gc.get_objects())  # frozen: no longer walked
    finally:
        gc.set_threshold(*thresholds)
        if frozen == 0:
            gc.unfreeze()  # as the test process was
