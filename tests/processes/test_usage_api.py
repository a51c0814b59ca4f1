"""``GET /v1/usage`` (B8): customers see their own request logs and balance,
cancelled and stalled streams included, with their charges, authenticated
by their key; never another tenant's.

Served by the real gateway process, so the data is committed (``gateway``
tests run last). alice has traffic of every status, bob a little, charlie
none; each sees only their own. dora's two keys each see the budgets that
cover them (G6): dora's, and their own, never the other key's or erin's.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

import httpx
import pytest
from django.utils import timezone

from billing.budgets.windows import window_at
from billing.exports import utc_iso
from billing.ledger import top_up
from billing.models import Budget
from billing.settlement import settle
from tenants.models import Tenant
from tests.support.factories import make_key, make_log, make_price, make_tenant, unique

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

FIELDS = {"object", "tenant", "balance_usd", "data", "first_id", "last_id", "has_more", "budgets"}
BUDGET_FIELDS = ["scope", "period", "window_start", "window_end", "limit_usd", "spent_usd", "reserved_usd"]
ROW_FIELDS = {
    "request_id", "created_at", "model", "status", "stream", "api_key", "input_tokens", "output_tokens",
    "cache_read_tokens", "cache_write_tokens", "usage_estimated", "charge_usd", "settled",
}


@dataclass
class Cast:
    alice: Tenant
    alice_key: str
    alice_prefix: str
    bob: Tenant
    bob_key: str
    charlie_key: str
    alice_ids: list[str]  # oldest first
    bob_ids: list[str]
    start: dt.datetime


@pytest.fixture(scope="module")
def cast(django_db_blocker, gateway) -> Cast:
    with django_db_blocker.unblock():
        model = unique("usage-model")
        make_price(model, input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
                   effective_from=timezone.now() - dt.timedelta(days=30))
        alice, bob, charlie = make_tenant(unique("alice")), make_tenant(unique("bob")), make_tenant(unique("charlie"))
        top_up(alice, Decimal("5"))
        alice_row, alice_key = make_key(alice)
        _, bob_key = make_key(bob)
        _, charlie_key = make_key(charlie)
        start = timezone.now().replace(microsecond=0) - dt.timedelta(days=10)
        statuses = ["completed", "cancelled", "stalled", "interrupted", "failed", "rejected", "completed"]
        alice_ids = []
        for n, status in enumerate(statuses):
            # The newest is not settled yet, and stays so: no price exists for
            # its model, so no sweep of the gateway's can settle it meanwhile.
            log = make_log(alice, alice_row, request_id=unique("req-alice"),
                           model=model if n < 6 else unique("unpriced"), status=status,
                           created_at=start + dt.timedelta(days=n), input_tokens=1000, output_tokens=100 * n,
                           usage_estimated=status in ("cancelled", "stalled", "interrupted"), stream=True)
            alice_ids.append(log.request_id)
            if n < 6:
                settle(log.pk)
        bob_ids = [make_log(bob, request_id=unique("req-bob"), model=model, created_at=start).request_id
                   for _ in range(3)]
        return Cast(alice, alice_key, alice_row.prefix, bob, bob_key, charlie_key, alice_ids, bob_ids, start)


def get(gateway, key: str | None, params: dict | None = None, header: str = "authorization") -> httpx.Response:
    headers = {}
    if key is not None:
        headers = {"authorization": f"Bearer {key}"} if header == "authorization" else {header: key}
    return httpx.get(gateway.url + "/v1/usage", params=params or {}, headers=headers, timeout=10)


def test_it_refuses_an_unknown_key_in_openai_format(gateway, cast):
    for key in (None, "hb-not-a-real-key", "sk-something-else"):
        response = get(gateway, key)
        assert response.status_code == 401
        assert response.json() == {"error": {"message": "Invalid API key.", "type": "invalid_request_error",
                                             "param": None, "code": "invalid_api_key"}}
        assert response.headers["x-hopbase-request-id"]


def test_it_lists_the_tenants_own_logs_newest_first_with_charges(gateway, cast):
    response = get(gateway, cast.alice_key, {"limit": "100"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == FIELDS
    assert (body["object"], body["tenant"], body["has_more"], body["budgets"]) == ("list", cast.alice.name, False, [])
    rows = body["data"]
    assert [row["request_id"] for row in rows] == cast.alice_ids[::-1]
    assert all(set(row) == ROW_FIELDS for row in rows)
    by_status = {row["status"]: row for row in rows[1:]}
    # Cancelled, stalled and interrupted streams are there, with what they cost.
    assert by_status["cancelled"] == {
        "request_id": cast.alice_ids[1],
        "created_at": (cast.start + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
        "model": by_status["cancelled"]["model"], "status": "cancelled", "stream": True, "api_key": cast.alice_prefix,
        "input_tokens": 1000, "output_tokens": 100, "cache_read_tokens": 0, "cache_write_tokens": 0,
        "usage_estimated": True, "charge_usd": "0.0045", "settled": True,
    }
    assert (by_status["stalled"]["charge_usd"], by_status["interrupted"]["charge_usd"]) == ("0.006", "0.0075")
    assert (by_status["failed"]["charge_usd"], by_status["rejected"]["charge_usd"]) == ("0.00", "0.00")
    assert (rows[0]["settled"], rows[0]["charge_usd"]) == (False, None)  # not settled yet
    charged = sum(Decimal(row["charge_usd"]) for row in rows if row["charge_usd"])
    assert Decimal(body["balance_usd"]) == Decimal("5") - charged


def test_it_never_shows_another_tenants_rows(gateway, cast):
    bob = get(gateway, cast.bob_key, {"limit": "100"}).json()
    assert bob["tenant"] == cast.bob.name and bob["balance_usd"] == "0.00"
    assert sorted(row["request_id"] for row in bob["data"]) == sorted(cast.bob_ids)
    charlie = get(gateway, cast.charlie_key).json()
    assert (charlie["data"], charlie["has_more"], charlie["first_id"]) == ([], False, None)
    # A cursor from another tenant's page reveals nothing either.
    response = get(gateway, cast.bob_key, {"before": cast.alice_ids[-1]})
    assert response.status_code == 400
    assert cast.alice_ids[0] not in response.text


def test_it_takes_the_key_from_every_header_the_sdks_use(gateway, cast):
    for header in ("x-api-key", "x-goog-api-key"):
        assert get(gateway, cast.alice_key, header=header).json()["tenant"] == cast.alice.name
    # Not from the query: ?key= is Gemini's alone, and a key in a URL ends up in logs.
    response = httpx.get(gateway.url + "/v1/usage", params={"key": cast.alice_key}, timeout=10)
    assert response.status_code == 401


def test_it_pages_with_a_cursor(gateway, cast):
    seen: list[str] = []
    params = {"limit": "3"}
    while True:
        body = get(gateway, cast.alice_key, params).json()
        seen += [row["request_id"] for row in body["data"]]
        assert body["last_id"] == body["data"][-1]["request_id"]
        if not body["has_more"]:
            break
        params = {"limit": "3", "before": body["last_id"]}
    assert seen == cast.alice_ids[::-1]


def test_it_filters_by_time(gateway, cast):
    since = (cast.start + dt.timedelta(days=2)).isoformat()
    until = (cast.start + dt.timedelta(days=4)).strftime("%Y-%m-%dT%H:%M:%S")  # naive: UTC
    body = get(gateway, cast.alice_key, {"since": since, "until": until}).json()
    assert [row["request_id"] for row in body["data"]] == [cast.alice_ids[3], cast.alice_ids[2]]


@pytest.mark.parametrize(
    "params", [{"limit": "0"}, {"limit": "101"}, {"limit": "ten"}, {"since": "yesterday"}, {"until": "2025-13-01"},
               {"before": "req-that-never-was"}],
)
def test_it_refuses_bad_parameters_in_openai_format(gateway, cast, params):
    response = get(gateway, cast.alice_key, params)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_it_answers_get_only(gateway, cast):
    response = httpx.post(gateway.url + "/v1/usage", headers={"authorization": f"Bearer {cast.alice_key}"}, timeout=10)
    assert response.status_code == 405
    assert "error" in response.json()



# Budgets (G6)


@dataclass
class Budgets:
    first_key: str
    second_key: str
    erin_key: str
    moment: dt.datetime


@pytest.fixture(scope="module")
def budgets(django_db_blocker, gateway) -> Budgets:
    """dora spends 0.50 through her first key and 0.25 through her second,
    this month; erin spends 9 beside her. Each has budgets of several scopes."""
    with django_db_blocker.unblock():
        dora, erin = make_tenant(unique("dora")), make_tenant(unique("erin"))
        (first, first_key), (second, second_key), (erin_row, erin_key) = make_key(dora), make_key(dora), make_key(erin)
        moment = window_at("1mo", timezone.now()).start
        for tenant, key, charge in ((dora, first, "0.5"), (dora, second, "0.25"), (erin, erin_row, "9")):
            make_log(tenant, key, request_id=unique("req-budget"), created_at=moment, charge_usd=Decimal(charge),
                     settled_at=moment)
        for tenant, key, period, limit in ((dora, None, "1mo", "10"), (dora, None, "total", "100"),
                                           (dora, first, "total", "1"), (dora, second, "1mo", "0.3"),
                                           (erin, None, "1mo", "50")):
            Budget.objects.create(tenant=tenant, api_key=key, period=period, limit_usd=Decimal(limit),
                                  webhook_url="https://hooks.example/", webhook_secret="whsec-not-for-customers")
        return Budgets(first_key, second_key, erin_key, moment)


def test_it_shows_the_budgets_that_cover_the_key_and_no_others(gateway, budgets):
    month = window_at("1mo", timezone.now())
    this_month = {"window_start": utc_iso(month.start), "window_end": utc_iso(month.end)}
    all_time = {"window_start": "1970-01-01T00:00:00.000000Z", "window_end": None}
    dora_month = {"scope": "tenant", "period": "1mo", **this_month, "limit_usd": "10.00", "spent_usd": "0.75",
                  "reserved_usd": "0.00"}
    dora_total = {"scope": "tenant", "period": "total", **all_time, "limit_usd": "100.00", "spent_usd": "0.75",
                  "reserved_usd": "0.00"}

    first = get(gateway, budgets.first_key)
    assert first.status_code == 200 and "whsec" not in first.text
    assert [list(budget) for budget in first.json()["budgets"]] == [BUDGET_FIELDS] * 3
    assert first.json()["budgets"] == [dora_month, dora_total, {
        "scope": "key", "period": "total", **all_time, "limit_usd": "1.00", "spent_usd": "0.50",
        "reserved_usd": "0.00"}]
    assert get(gateway, budgets.second_key).json()["budgets"] == [dora_month, dora_total, {
        "scope": "key", "period": "1mo", **this_month, "limit_usd": "0.30", "spent_usd": "0.25",
        "reserved_usd": "0.00"}]
    assert get(gateway, budgets.erin_key).json()["budgets"] == [{
        "scope": "tenant", "period": "1mo", **this_month, "limit_usd": "50.00", "spent_usd": "9.00",
        "reserved_usd": "0.00"}]


def test_budgets_are_shown_whatever_page_is_asked_for(gateway, budgets):
    later = (budgets.moment + dt.timedelta(days=400)).isoformat()
    body = get(gateway, budgets.first_key, {"since": later, "limit": "1"}).json()
    assert body["data"] == [] and [budget["spent_usd"] for budget in body["budgets"]] == ["0.75", "0.75", "0.50"]


@pytest.mark.parametrize("params", [
    {"since": "9999-12-31T23:59:59-23:59"},  # past datetime's range once in UTC
    {"until": "0001-01-01T00:00:00+23:59"},
    {"since": "0001-01-01"},
    {"until": "9999-12-31T23:59:59.999999"},
    {"limit": "²"},
    {"limit": "１０"},  # full-width digits
    {"before": "\x00"},
])
def test_crafted_filters_get_a_400_in_openai_format_never_a_500(gateway, cast, params):
    response = get(gateway, cast.alice_key, params)
    assert response.status_code in (200, 400), response.text
    assert response.headers["content-type"].startswith("application/json")
    if response.status_code == 400:
        assert response.json()["error"]["type"] == "invalid_request_error"
