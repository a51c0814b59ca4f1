"""The console's pages read as the tenant sees them (console.overview,
console.logs, console.statement, console.connect; K2): balance, budgets,
charts, request logs with filters and keyset pages, the statement and its
CSV (the export's, byte for byte), and the connect snippets."""

from __future__ import annotations

import datetime as dt
import html
import io
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.ledger import post_entry, top_up
from billing.models import Budget, LedgerEntry
from console import logs as console_logs
from tests.support.console_cast import cast, fast_passwords, signed_in  # noqa: F401 (a fixture)
from tests.support.factories import make_channel, make_key, make_log

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def people():
    return cast()


def text(response) -> str:
    return response.content.decode()


def test_the_overview_shows_balance_budgets_and_30_days_by_day_model_and_key(people):
    tenant = people.tenant_a
    top_up(tenant, Decimal("12.5"))
    key, _ = make_key(tenant, label="backend")
    Budget.objects.create(tenant=tenant, period="1mo", limit_usd=Decimal("40"))
    make_log(tenant, key, model="gpt-big", charge_usd=Decimal("0.75"), input_tokens=100, output_tokens=20)
    make_log(tenant, key, model="gpt-big", charge_usd=Decimal("0.25"), created_at=NOW - dt.timedelta(days=40))
    make_log(people.tenant_b, model="their-model", charge_usd=Decimal("9"))
    page = text(signed_in(people.bob).get("/console/"))
    assert "12.50" in page
    assert "Whole tenant" in page and "1mo" in page and "0.75" in page and "40.00" in page
    assert "gpt-big" in page and "120 tok" in page and f"{key.prefix}… backend" in page
    assert "their-model" not in page and "9.00" not in page


def test_the_overview_sums_each_day_over_models_and_each_model_over_days(people):
    from console.overview import overview

    tenant = people.tenant_a
    key, _ = make_key(tenant)
    yesterday = NOW - dt.timedelta(days=1)
    for model, when, charge, tokens in (("m-a", NOW, "1.5", 10), ("m-b", NOW, "0.25", 5),
                                        ("m-b", yesterday, "2", 7), ("m-a", yesterday, "0.5", 1)):
        make_log(tenant, key, model=model, created_at=when, charge_usd=Decimal(charge), input_tokens=tokens)
    seen = overview(tenant, NOW)
    days = {bar.label: (bar.spend, bar.tokens) for bar in seen.by_day}
    assert days[str(NOW.date())] == (Decimal("1.75"), 15) and days[str(yesterday.date())] == (Decimal("2.5"), 8)
    assert [(bar.label, bar.spend, bar.tokens, bar.percent) for bar in seen.by_model] == [
        ("m-b", Decimal("2.25"), 12, 100), ("m-a", Decimal("2.0"), 11, 88)]


def test_the_logs_page_shows_status_tokens_and_charge_and_never_the_channel(people):
    channel = make_channel(name="secret-upstream-channel")
    log = make_log(people.tenant_a, status="cancelled", channel=channel, output_tokens=77,
                   charge_usd=Decimal("0.0012345"))
    client = signed_in(people.alice)
    page = text(client.get("/console/logs/"))
    assert log.request_id in page and "cancelled" in page and "77" in page and "0.0012345" in page
    detail = text(client.get(f"/console/logs/{log.request_id}/"))
    assert log.request_id in detail and "0.0012345" in detail
    assert "secret-upstream-channel" not in page + detail


@pytest.mark.parametrize(("query", "kept"), [
    ("status=failed", {"failed"}),
    ("model=gpt-b", {"b"}),
    ("since=2025-01-02&until=2025-01-03", {"b"}),
    ("request_id=REQ-A", {"a"}),
])
def test_the_logs_filters_select_rows(people, query, kept):
    day = dt.datetime(2025, 1, 1, 12, tzinfo=dt.timezone.utc)
    make_log(people.tenant_a, request_id="REQ-A", model="gpt-a", created_at=day)
    make_log(people.tenant_a, request_id="REQ-B", model="gpt-b", created_at=day + dt.timedelta(days=1))
    make_log(people.tenant_a, request_id="REQ-F", model="gpt-a", status="failed", created_at=day + dt.timedelta(days=2))
    page = text(signed_in(people.alice).get(f"/console/logs/?{query}"))
    shown = {name for name, rid in (("a", "REQ-A"), ("b", "REQ-B"), ("failed", "REQ-F")) if rid in page}
    assert shown == kept


def test_the_key_filter_shows_that_keys_rows(people):
    key, _ = make_key(people.tenant_a)
    mine = make_log(people.tenant_a, key)
    other = make_log(people.tenant_a)
    page = text(signed_in(people.alice).get(f"/console/logs/?key={key.pk}"))
    assert mine.request_id in page and other.request_id not in page


@pytest.mark.parametrize(("query", "message"), [
    ("since=yesterday", "since: &#x27;yesterday&#x27; is not a date"),
    ("until=2025-13-01", "until: &#x27;2025-13-01&#x27; is not a date"),
    ("since=2025-02-01&until=2025-01-01", "since must be earlier than until"),
    ("status=done", "status: &#x27;done&#x27; is not one of"),
    ("key=abc", "key: &#x27;abc&#x27; is not one of this tenant"),
    ("before=garbage", "before: not a position"),
    ("since=9999-12-31T23:59:59-23:59", "is not a date"),  # past datetime's range once in UTC
    ("until=0001-01-01T00:00%2B23:59", "is not a date"),
    ("before=9999-12-31T23:59:59-23:59,1", "before: not a position"),
    ("key=%C2%B2", "key: &#x27;²&#x27; is not one of this tenant"),
])
def test_a_malformed_filter_is_a_clear_message_and_no_rows(people, query, message):
    log = make_log(people.tenant_a)
    response = signed_in(people.alice).get(f"/console/logs/?{query}")
    assert response.status_code == 400 and message in text(response) and log.request_id not in text(response)


def test_logs_page_by_keyset_newest_first_without_repeats_or_gaps(people):
    start = dt.datetime(2025, 3, 1, tzinfo=dt.timezone.utc)
    # Two rows share each moment: the id breaks the tie.
    made = [make_log(people.tenant_a, created_at=start + dt.timedelta(seconds=n // 2)).request_id for n in range(7)]
    seen, query = [], {}
    while True:
        page = console_logs.page(people.tenant_a, query, size=3)
        seen += [row["request_id"] for row in page.rows]
        if page.next_cursor is None:
            break
        query = {"before": page.next_cursor}
    assert seen == list(reversed(made))


def test_the_statement_shows_entries_with_the_balance_after_each(people):
    tenant = people.tenant_a
    top_up(tenant, Decimal("10"))
    log = make_log(tenant)
    post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.0000001"), request_log=log)
    page = text(signed_in(people.bob).get("/console/statement/"))
    assert "topup" in page and "10.00" in page and "charge" in page and "-0.0000001" in page and "9.9999999" in page
    assert log.request_id in page


def test_the_statement_csv_is_exportbilling_for_the_tenant_and_range(people):
    day = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    for n in range(5):
        make_log(people.tenant_a, created_at=day + dt.timedelta(hours=n * 12), charge_usd=Decimal("0.5"),
                 model="=cmd()" if n == 1 else "gpt-test")
    make_log(people.tenant_b, created_at=day)
    out = io.StringIO()
    call_command("exportbilling", "--tenant", people.tenant_a.name, "--since", "2025-01-01T06:00",
                 "--until", "2025-01-02T12:00", "--format", "csv", stdout=out)
    response = signed_in(people.alice).get("/console/statement.csv?since=2025-01-01T06:00&until=2025-01-02T12:00")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    body = b"".join(response).decode()
    assert body == out.getvalue() and body.count("\n") == 3  # header and two rows


def test_a_malformed_statement_range_is_a_400_with_its_reason(people):
    response = signed_in(people.alice).get("/console/statement.csv?until=soon")
    assert response.status_code == 400 and "until: 'soon' is not a date" in text(response)


def test_the_connect_page_uses_the_consoles_own_base_url(people, settings):
    settings.ALLOWED_HOSTS = ["gw.example"]
    make_channel(served_models=["gpt-conn"])
    make_key(people.tenant_a)  # the operator's, allowing every model
    page = html.unescape(text(signed_in(people.bob).get("/console/connect/", HTTP_HOST="gw.example:8443", secure=True)))
    assert 'base_url="https://gw.example:8443/v1"' in page  # OpenAI
    assert 'Anthropic(base_url="https://gw.example:8443"' in page
    assert 'HttpOptions(base_url="https://gw.example:8443")' in page
    assert "ANTHROPIC_BASE_URL=https://gw.example:8443" in page and 'wire_api = "responses"' in page
    assert "gpt-conn" in page
