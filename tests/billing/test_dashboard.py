"""The operators' dashboard (B7): staff only; numbers aggregated by the
database, per day, per model and per tenant, drawn as inline SVG."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing.dashboard import MIN_DAYS_SHOWN, dashboard_context, fitted_start, parse_days
from tests.support.factories import make_log, make_tenant

pytestmark = pytest.mark.django_db

URL = "/admin/dashboard/"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def traffic():
    """Today: acme 3 completed (0.5 each), 1 failed, 1 cancelled (0.25);
    globex 1 stalled (0.1). Two days ago: acme 1 completed (2). Forty days
    ago: one more, outside a 30-day window."""
    now = timezone.now()
    acme, globex = make_tenant("acme"), make_tenant("globex")
    for _ in range(3):
        make_log(acme, model="gpt-a", charge_usd=Decimal("0.5"), input_tokens=100, output_tokens=10, created_at=now)
    make_log(acme, model="gpt-a", status="failed", created_at=now)
    make_log(acme, model="claude-b", status="cancelled", charge_usd=Decimal("0.25"), output_tokens=40, created_at=now)
    make_log(globex, model="claude-b", status="stalled", charge_usd=Decimal("0.1"), created_at=now)
    make_log(acme, model="gpt-a", charge_usd=Decimal("2"), input_tokens=1000, created_at=now - dt.timedelta(days=2))
    make_log(acme, model="gpt-old", charge_usd=Decimal("99"), created_at=now - dt.timedelta(days=40))
    return acme, globex


def test_it_sends_anonymous_visitors_to_login(client):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_it_refuses_staff_without_permission_to_see_request_logs(client):
    client.force_login(User.objects.create_user("staffer", password="x", is_staff=True))
    assert client.get(URL).status_code == 403


def test_it_renders_for_staff_with_the_numbers_of_the_logs(admin_client, traffic):
    response = admin_client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    totals = re.sub(r"\s+", " ", html[html.index('id="totals"'):html.index("</table>", html.index('id="totals"'))])
    # 7 requests, 3.85 USD, tokens 3*110 + 40 + 1000, 2 errors, 1 cancelled, 0 rejected
    assert re.findall(r'<td class="num">([^<]*)</td>', totals) == ["7", "3.85", "1370", "2", "1", "0"]
    main = html[html.index('id="content-main"'):html.index('id="per-day"')]
    assert main.count('<svg viewBox="0 0 720 140"') == 5 and "<rect" in main
    assert "gpt-old" not in html  # outside the window
    per_model = html[html.index('id="per-model"'):html.index('id="per-tenant"')]
    assert per_model.index("gpt-a") < per_model.index("claude-b")  # by spend
    assert "acme" in html and "globex" in html
    # No script for the charts, nothing from a CDN.
    assert "<script" not in main and 'src="http' not in html and 'href="http' not in html


def test_the_aggregates_are_per_day_model_and_tenant(traffic):
    context = dashboard_context(30)
    daily = {stats.label: stats for stats in context["daily"]}
    today = timezone.now().astimezone(dt.timezone.utc).date()
    # A 30-day window, shown from its first day with requests, at least a week.
    assert context["window_start"] == today - dt.timedelta(days=29)
    assert len(daily) == 7 and context["first_day"] == today - dt.timedelta(days=6)
    assert (daily[today.isoformat()].requests, daily[today.isoformat()].spend) == (6, Decimal("1.85"))
    assert daily[(today - dt.timedelta(days=2)).isoformat()].tokens == 1000
    assert daily[(today - dt.timedelta(days=1)).isoformat()].requests == 0
    today_stats = daily[today.isoformat()]
    assert (today_stats.error_rate, today_stats.cancel_rate) == (pytest.approx(2 / 6), pytest.approx(1 / 6))
    models = {stats.label: stats for stats, _share in context["models"]}
    assert (models["gpt-a"].requests, models["gpt-a"].spend, models["claude-b"].errors) == (5, Decimal("3.5"), 1)
    tenants = {stats.label: stats for stats, _share in context["tenants"]}
    assert (tenants["acme"].spend, tenants["globex"].spend) == (Decimal("3.75"), Decimal("0.1"))
    assert "gpt-old" in {s.label for s, _ in dashboard_context(60)["models"]}


def test_the_page_costs_a_few_queries_however_many_logs(admin_client, traffic):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(URL).status_code == 200
        return len(queries)

    before = count()
    acme, _ = traffic
    for n in range(30):
        make_log(acme, model=f"model-{n}", charge_usd=Decimal("0.01"))
    assert count() == before <= 10


@pytest.mark.parametrize("raw,days", [(None, 30), ("7", 7), ("90", 90), ("0", 30), ("abc", 30), ("9999", 30)])
def test_it_shows_a_sane_window(raw, days):
    assert parse_days(raw) == days


# -- the window fitted to the data ---------------------------------


def per_day_rows(html: str) -> list[list[str]]:
    table = html[html.index('id="per-day"'):]
    table = table[table.index("<tbody>"):table.index("</tbody>")]
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in table.split("<tr>")[1:]]


def test_one_day_of_data_is_a_week_not_a_month_of_empty_days(admin_client):
    now = timezone.now()
    make_log(make_tenant("acme"), charge_usd=Decimal("0.5"), input_tokens=10, created_at=now)
    html = admin_client.get(URL).content.decode()
    today = now.astimezone(dt.timezone.utc).date()
    rows = per_day_rows(html)
    assert [row[0] for row in rows] == [(today - dt.timedelta(days=n)).isoformat() for n in range(MIN_DAYS_SHOWN)]
    assert rows[0][1:3] == ["1", "0.50"] and all(row[1] == "0" for row in rows[1:])
    main = html[html.index('id="content-main"'):html.index('id="per-model"')]
    assert main.count("<svg") == 5 and main.count("<rect") == 5 * MIN_DAYS_SHOWN
    assert f'id="first-shown">{(today - dt.timedelta(days=6)).isoformat()}<' in html


def test_the_days_shown_start_at_the_first_day_with_requests():
    now = timezone.now()
    acme = make_tenant("acme")
    make_log(acme, created_at=now - dt.timedelta(days=20))
    make_log(acme, created_at=now)
    context = dashboard_context(30, now)
    today = now.astimezone(dt.timezone.utc).date()
    assert context["first_day"] == today - dt.timedelta(days=20) and len(context["daily"]) == 21
    assert [s.requests for s in context["daily"]] == [1] + [0] * 19 + [1]
    assert len(context["charts"][1].bars) == 21 and context["charts"][1].first_label == context["daily"][0].label
    # All of a shorter window, whatever the data.
    assert len(dashboard_context(3, now)["daily"]) == 3


def test_no_requests_draw_no_empty_charts(admin_client):
    html = admin_client.get(URL).content.decode()
    assert 'id="no-requests"' in html and 'class="module hb-chart"' not in html and 'id="per-day"' not in html
    assert html.count("No requests in this period") == 3  # the charts, per model, per tenant


@pytest.mark.parametrize("first_with_data,shown_from", [
    (None, "2026-03-24"),  # no data: the last week
    ("2026-03-01", "2026-03-01"),  # the window's first day
    ("2026-03-10", "2026-03-10"),
    ("2026-03-29", "2026-03-24"),  # recent data: still a week
])
def test_the_fitted_start(first_with_data, shown_from):
    first, last = dt.date(2026, 3, 1), dt.date(2026, 3, 30)
    found = dt.date.fromisoformat(first_with_data) if first_with_data else None
    assert fitted_start(first, last, found) == dt.date.fromisoformat(shown_from)
    assert fitted_start(dt.date(2026, 3, 28), last, found) == dt.date(2026, 3, 28)  # a 3-day window
