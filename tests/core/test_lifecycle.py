"""The end of a drain (core.lifecycle): what joined to be flushed is
flushed once every request has ended, the request logs last, and one
flush's failure stops none of the others."""

from __future__ import annotations

import asyncio

import pytest

from core import lifecycle
from core.lifecycle import Lifecycle


@pytest.fixture
def flushes(monkeypatch) -> list[str]:
    monkeypatch.setattr(lifecycle, "_flushes", [])
    monkeypatch.setattr(lifecycle, "_last_flushes", [])
    return []


def drained() -> None:
    life = Lifecycle(drain_timeout=1)
    life.begin_drain()
    asyncio.run(asyncio.wait_for(life.drained(), 5))


def test_the_request_logs_are_flushed_after_the_quick_flushes_whatever_the_order_they_joined(flushes):
    def flush(name: str):
        async def run() -> None:
            flushes.append(name)
        return run

    lifecycle.flush_when_drained(flush("request logs"), last=True)
    lifecycle.flush_when_drained(flush("slots"))
    lifecycle.flush_when_drained(flush("charges"))
    drained()
    assert flushes == ["slots", "charges", "request logs"]


def test_a_failed_flush_is_logged_and_the_next_still_runs(flushes, caplog):
    async def broken() -> None:
        raise ConnectionError("redis is away")

    async def logs() -> None:
        flushes.append("request logs")

    lifecycle.flush_when_drained(broken)
    lifecycle.flush_when_drained(logs, last=True)
    drained()
    assert flushes == ["request logs"]
    assert any("flushing" in record.getMessage() and record.name == "hopbase.lifecycle" for record in caplog.records)
