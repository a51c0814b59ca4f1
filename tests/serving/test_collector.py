"""The garbage collector of a gateway process (serving.collector): what is
loaded at start is frozen, and young objects gather longer between
collections."""

from __future__ import annotations

import gc

from core import lifecycle
from serving import collector, handler


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


def test_a_process_settles_after_a_request_that_ends_in_quiet_not_in_the_middle_of_a_burst(monkeypatch):
    settled = []
    monkeypatch.setattr(collector, "settled", False)
    monkeypatch.setattr(collector, "ended", 0)
    monkeypatch.setattr(collector, "settle", lambda: settled.append(True))
    monkeypatch.setattr(lifecycle.process, "open_requests", lambda: 5_000)
    handler.settle_collector(None)
    assert settled == []  # it would walk, and freeze, all 5,000
    monkeypatch.setattr(lifecycle.process, "open_requests", lambda: collector.QUIET)
    handler.settle_collector(None)
    assert settled == [True]


def test_a_process_that_is_never_quiet_settles_all_the_same(monkeypatch):
    settled = []
    monkeypatch.setattr(collector, "settled", False)
    monkeypatch.setattr(collector, "ended", 0)
    monkeypatch.setattr(collector, "settle", lambda: settled.append(True))
    for _ in range(collector.PATIENCE - 1):
        collector.request_ended(open_requests=500)
    assert settled == []
    collector.request_ended(open_requests=500)
    assert settled == [True]
