"""Where budgets stand (billing.budgets.status): spent for many budgets in one
query equals budget_spend.spent_in of each, whatever their scope and window;
reserved is the gateway's (budget_store), unknown when Redis does not answer;
each budget's G6 object."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from billing.budgets import status as budget_status
from billing.budgets import store as budget_store
from billing.budgets.spend import spent_in
from billing.budgets.status import spent_by_budget, standings
from billing.budgets.windows import window_at
from billing.models import Budget
from core.money import round_charge, usd_text
from tests.support.factories import make_key, make_log, make_tenant

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2031, 5, 14, 10, 30, 15, tzinfo=dt.UTC)
PERIODS = ("1h", "1d", "1w", "1mo", "total", "45s", "7200s")


@pytest.fixture(autouse=True)
def reservations(monkeypatch):
    held: dict[int, Decimal] = {}
    monkeypatch.setattr(budget_store, "reserved_usd", lambda budget_id, window: held.get(budget_id, Decimal(0)))
    return held


@pytest.fixture
def budgets() -> list[Budget]:
    """Two tenants, two keys each, logs spread over two months (some with no
    charge yet), and a budget of every period on every scope."""
    found = []
    for name in ("acme", "bob"):
        tenant = make_tenant(name)
        keys = [make_key(tenant)[0], make_key(tenant)[0]]
        for n in range(40):
            make_log(tenant, keys[n % 2], created_at=NOW - dt.timedelta(hours=37 * n, seconds=n),
                     charge_usd=None if n % 7 == 3 else round_charge(Decimal(n) / 3 + Decimal("0.0000000001")))
        for owner in (None, *keys):
            found += [Budget.objects.create(tenant=tenant, api_key=owner, period=period, limit_usd=Decimal(100))
                      for period in PERIODS]
    return list(Budget.objects.select_related("tenant", "api_key").order_by("pk"))


def test_spend_of_many_budgets_in_one_query_is_each_ones_spent_in(budgets, django_assert_num_queries):
    windows = {budget.pk: window_at(budget.period, NOW) for budget in budgets}
    with django_assert_num_queries(1):
        spent = spent_by_budget(budgets, windows)
    expected = {budget.pk: spent_in(budget, windows[budget.pk]) for budget in budgets}
    assert spent == expected
    assert len(set(expected.values())) >= 8  # the windows and scopes do tell the budgets apart


def test_standings_come_in_order_a_query_per_chunk(budgets, reservations, monkeypatch, django_assert_num_queries):
    monkeypatch.setattr(budget_status, "PER_QUERY", 10)
    reservations[budgets[3].pk] = Decimal("0.125")
    with django_assert_num_queries(5):  # 42 budgets
        found = list(standings(budgets, NOW))
    assert [standing.budget for standing in found] == budgets
    for standing in found:
        assert standing.window == window_at(standing.budget.period, NOW)
        assert standing.spent_usd == spent_in(standing.budget, standing.window)
    assert [standing.reserved_usd for standing in found[2:5]] == [Decimal(0), Decimal("0.125"), Decimal(0)]


def test_nothing_to_stand_costs_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert list(standings([], NOW)) == [] and spent_by_budget([], {}) == {}


def test_a_budgets_object_is_g6s(budgets, reservations):
    key_budget = next(b for b in budgets if b.api_key_id is not None and b.period == "1w")
    reservations[key_budget.pk] = Decimal("2.5")
    standing = next(standings([key_budget], NOW))
    assert standing.as_json() == {
        "scope": "key", "tenant": key_budget.tenant.name, "key_prefix": key_budget.api_key.prefix, "period": "1w",
        "window_start": "2031-05-12T00:00:00.000000Z", "window_end": "2031-05-19T00:00:00.000000Z",
        "limit_usd": "100.00", "spent_usd": usd_text(spent_in(key_budget, standing.window)),
        "reserved_usd": "2.50",
    }
    total = next(b for b in budgets if b.api_key_id is None and b.period == "total")
    found = next(standings([total], NOW)).as_json()
    assert (found["scope"], found["key_prefix"], found["window_start"], found["window_end"]) == (
        "tenant", None, "1970-01-01T00:00:00.000000Z", None)


def test_reservations_are_unknown_when_redis_does_not_answer(budgets, monkeypatch):
    def unreachable(budget_id, window):
        raise RedisTimeoutError("Timeout reading from socket")

    monkeypatch.setattr(budget_store, "reserved_usd", unreachable)
    found = list(standings(budgets[:3], NOW))
    assert [standing.reserved_usd for standing in found] == [None] * 3
    assert found[0].as_json()["reserved_usd"] is None
    assert found[0].spent_usd == spent_in(budgets[0], found[0].window)
