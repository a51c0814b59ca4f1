"""Budgets' running spend and reservations (rule G2), in Redis and in the
process: one step reserves across every budget of a request or none; a
window is seeded once from the ledger; a charge replaces its reservation;
alerts are called for once per window; a reservation its process stops
renewing lapses (a killed process holds no budget for ever).

Mirrors billing/budgets/store.py. The Redis cases run on the Redis the suite
uses (REDIS_URL, else 127.0.0.1:6379), in keys of their own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import redis

from billing.budgets.store import Line, LocalBudgetStore, RedisBudgetStore, from_units, reserved_usd, to_units
from billing.budgets.windows import window_at
from tests.support.processes import ROOT

NOW = datetime(2026, 12, 5, 21, 30, tzinfo=UTC)
REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"


def redis_or_skip() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5).ping()
    except redis.RedisError:
        pytest.skip("no Redis on REDIS_URL or 127.0.0.1:6379")
    return REDIS_URL


def line(limit: int, threshold: int | None = None, period: str = "1d") -> Line:
    # A budget id no other test uses: the keys in Redis are the test's own.
    return Line(int(uuid.uuid4().int % 10**9), window_at(period, NOW), limit, threshold)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["local", "redis"])
def store(request, settings):
    settings.HOPBASE_RESERVATION_LEASE = 300
    if request.param == "local":
        return LocalBudgetStore()
    return RedisBudgetStore(redis_or_skip())


def run(coroutine):
    return asyncio.run(coroutine)


def test_units_are_the_ledgers_precision_rounded_up_for_a_reservation():
    assert to_units(Decimal("0.0000000001")) == 1
    assert to_units(Decimal("0.00000000011")) == 2
    assert from_units(to_units(Decimal("12.5"))) == Decimal("12.5000000000")


def test_a_window_is_seeded_once_then_reserved_against(store):
    budget = line(limit=100)
    assert run(store.reserve([budget], "r1", 10, {})).needs_seed == 0
    assert run(store.reserve([budget], "r1", 10, {budget.budget_id: 85})).refused is None
    # Seeded with 85 of 100 and 10 reserved: 5 more fit, 6 do not (a seed given again changes nothing).
    assert run(store.reserve([budget], "r2", 6, {budget.budget_id: 0})).refused == 0
    assert run(store.reserve([budget], "r3", 5, {})).refused is None


def test_one_step_reserves_on_every_budget_or_on_none(store):
    roomy, tight = line(limit=1000), line(limit=15)
    seeds = {roomy.budget_id: 0, tight.budget_id: 0}
    assert run(store.reserve([roomy, tight], "a", 10, seeds)).refused is None
    refused = run(store.reserve([roomy, tight], "b", 10, seeds))
    assert refused.refused == 1 and refused.first_refusal
    assert run(store.reserve([roomy, tight], "c", 10, seeds)).first_refusal is False  # once per window
    # Nothing of "b" stayed on the roomy budget: 990 still fit there.
    assert run(store.reserve([roomy], "d", 990, seeds)).refused is None


def test_a_charge_replaces_its_reservation_and_calls_for_each_alert_once(store):
    budget = line(limit=100, threshold=80)
    run(store.reserve([budget], "a", 60, {budget.budget_id: 0}))
    run(store.reserve([budget], "b", 40, {}))
    refused = run(store.reserve([budget], "c", 1, {}))  # 100 of 100 reserved
    assert refused.refused == 0 and refused.first_refusal  # the window's exhaustion, called for now
    first = run(store.settle([budget], "a", 50))[0]
    assert (first.spent, first.threshold_crossed, first.exhausted) == (50, False, False)
    assert run(store.reserve([budget], "c", 10, {})).refused is None  # the 10 the charge left free
    second = run(store.settle([budget], "b", 35))[0]
    assert (second.spent, second.threshold_crossed, second.exhausted) == (85, True, False)
    third = run(store.settle([budget], "c", 15))[0]
    # Spend reaches the limit, but exhaustion was called for already, at the refusal: once per window.
    assert (third.spent, third.threshold_crossed, third.exhausted) == (100, False, False)


def test_a_settlement_sent_again_adds_its_charge_once():
    """Its answer lost on the way back (a timeout, a dropped connection), the
    settler sends it again: Redis remembers the request and adds nothing."""
    store = RedisBudgetStore(redis_or_skip())
    budget = line(limit=100)
    run(store.reserve([budget], "a", 10, {budget.budget_id: 0}))
    assert run(store.settle([budget], "a", 30))[0].spent == 30
    assert run(store.settle([budget], "a", 30))[0].spent == 30
    assert run(store.settle([budget], "b", 5))[0].spent == 35


def test_spend_reaching_the_limit_calls_for_exhaustion_once(store):
    budget = line(limit=100)
    run(store.reserve([budget], "a", 100, {budget.budget_id: 0}))
    assert run(store.settle([budget], "a", 100))[0].exhausted
    run(store.reserve([line(limit=1)], "b", 1, {}))
    assert run(store.settle([budget], "b", 0))[0].exhausted is False


def test_a_charge_above_its_reservation_is_counted_in_full(store):
    budget = line(limit=100)
    run(store.reserve([budget], "a", 10, {budget.budget_id: 0}))
    assert run(store.settle([budget], "a", 120))[0].spent == 120
    assert run(store.reserve([budget], "b", 1, {})).refused == 0


def test_a_new_window_starts_empty(store):
    today = line(limit=10)
    tomorrow = Line(today.budget_id, window_at("1d", datetime(2026, 12, 6, tzinfo=UTC)), 10)
    run(store.reserve([today], "a", 10, {today.budget_id: 0}))
    assert run(store.reserve([today], "b", 1, {})).refused == 0
    assert run(store.reserve([tomorrow], "b", 10, {today.budget_id: 0})).refused is None


def test_an_unrenewed_reservation_lapses_and_a_renewed_one_holds(settings):
    settings.HOPBASE_RESERVATION_LEASE = 30
    clock = Clock()
    store = LocalBudgetStore(clock)
    budget = line(limit=10)
    run(store.reserve([budget], "kept", 5, {budget.budget_id: 0}))
    run(store.reserve([budget], "lost", 5, {}))
    clock.now += 20
    run(store.renew([budget], ["kept"]))
    clock.now += 15  # "lost" was last renewed 35 s ago
    assert store.reserved(budget) == 5
    assert run(store.reserve([budget], "new", 5, {})).refused is None


HOLDER = """
import asyncio, os, sys, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hopbase.settings")
django.setup()
from datetime import datetime, timezone
from billing.budgets.store import Line, RedisBudgetStore
from billing.budgets.windows import window_at
line = Line(int(sys.argv[2]), window_at("1d", datetime.fromisoformat(sys.argv[3])), 100)
admission = asyncio.run(RedisBudgetStore(sys.argv[1]).reserve([line], "held-by-the-dead", 100, {line.budget_id: 0}))
print("reserved" if admission.refused is None else "refused", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_killed_processs_reservation_lapses_in_redis(settings):
    url = redis_or_skip()
    settings.HOPBASE_RESERVATION_LEASE = 1.5
    budget = line(limit=100)
    env = {**os.environ, "HOPBASE_RESERVATION_LEASE": "1.5", "HOPBASE_DEBUG": "1"}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(budget.budget_id), NOW.isoformat()],
                              cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "reserved"
        holder.kill()
        holder.wait(10)
        store = RedisBudgetStore(url)
        assert run(store.reserve([budget], "alive", 1, {})).refused == 0  # still held by the dead
        assert reserved_usd(budget.budget_id, budget.window) == from_units(100)
        deadline = asyncio.run(_lapses(store, budget, within=10))
        assert deadline, "the dead process's reservation never lapsed"
        assert reserved_usd(budget.budget_id, budget.window) == from_units(1)
    finally:
        if holder.poll() is None:
            holder.kill()


async def _lapses(store: RedisBudgetStore, budget: Line, within: float) -> bool:
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while loop.time() < until:
        if (await store.reserve([budget], "alive", 1, {})).refused is None:
            return True
        await asyncio.sleep(0.1)  # the lease runs on Redis's clock: nothing here to await but time
    return False
