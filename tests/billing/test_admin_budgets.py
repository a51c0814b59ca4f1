"""The admin's budgets (billing.budgets.admin, rule G6) as staff use it, with
a real login and CSRF checks on: operators add, change and delete budgets;
finance reads them and changes nothing; each row shows its window, spent,
reserved and limit with a bar; the list's queries do not grow with its rows;
a webhook's secret is never shown."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from billing.budgets import store as budget_store
from billing.budgets.windows import window_at
from billing.models import Budget
from tests.support.factories import make_key, make_log, make_tenant
from tests.support.staff_checks import create_staff, log_in, post

pytestmark = pytest.mark.django_db

LIST = "admin:billing_budget_changelist"
ADD = "admin:billing_budget_add"


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def reservations(monkeypatch):
    held: dict[int, Decimal] = {}
    monkeypatch.setattr(budget_store, "reserved_usd", lambda budget_id, window: held.get(budget_id, Decimal(0)))
    return held


@pytest.fixture
def operator():
    create_staff("oscar", "operator")
    return log_in("oscar")


@pytest.fixture
def finance():
    create_staff("fiona", "finance")
    return log_in("fiona")


@pytest.fixture
def budget(reservations):
    """acme's daily budget of 10 USD: 2.50 spent today (and 4 yesterday), 1.25 reserved."""
    tenant = make_tenant("acme")
    key, _ = make_key(tenant)
    today = window_at("1d", timezone.now())
    make_log(tenant, key, created_at=today.start, charge_usd=Decimal("2.5"))
    make_log(tenant, key, created_at=today.start - dt.timedelta(seconds=1), charge_usd=Decimal("4"))
    found = Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal(10), alert_at_pct=20,
                                  webhook_url="https://hooks.example/acme", webhook_secret="whsec-never-shown-42")
    reservations[found.pk] = Decimal("1.25")
    return found


def page(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_the_list_shows_window_spent_reserved_limit_and_a_bar(operator, budget):
    html = page(operator, reverse(LIST))
    window = window_at("1d", timezone.now())
    assert f"{window.start:%Y-%m-%d %H:%M} → {window.end:%Y-%m-%d %H:%M} UTC" in html
    for cell in ("2.50", "1.25", "10.00"):
        assert f">{cell}</td>" in html
    # 25% spent (amber: past the 20% threshold), 12.5% reserved.
    assert 'class="budget-bar" title="25.0% spent, 12.5% reserved"' in html
    assert "width:25.00%;background:#d08a00" in html and "width:12.50%;background:#9bb7d4" in html
    assert "whsec-never-shown-42" not in html


def test_the_bar_is_red_when_spent_and_reserved_fill_the_budget(operator, budget, reservations):
    reservations[budget.pk] = Decimal("20")
    assert 'title="25.0% spent, 75.0% reserved"' in page(operator, reverse(LIST))


def test_names_in_the_list_are_escaped(operator):
    tenant = make_tenant("<script>alert(1)</script>")
    Budget.objects.create(tenant=tenant, period="1h", limit_usd=Decimal(1))
    html = page(operator, reverse(LIST))
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_change_page_shows_the_standing_and_never_the_secret(operator, budget):
    html = page(operator, reverse("admin:billing_budget_change", args=[budget.pk]))
    assert "https://hooks.example/acme" in html and "2.50" in html and "budget-bar" in html
    assert "whsec-never-shown-42" not in html


def test_the_lists_queries_do_not_grow_with_its_rows(operator, django_assert_max_num_queries, reservations):
    month = window_at("1mo", timezone.now())
    for n in range(30):
        tenant = make_tenant(f"t{n}")
        key, _ = make_key(tenant)
        make_log(tenant, key, created_at=month.start, charge_usd=Decimal("0.5"))
        Budget.objects.create(tenant=tenant, period="1mo", limit_usd=Decimal(5))
        Budget.objects.create(tenant=tenant, api_key=key, period="total", limit_usd=Decimal(1))
    operator.get(reverse(LIST))  # the session and permissions, as on any page after the first
    # The session, the user, its permissions (two), the count, the page, the page's spend (one query for
    # all its rows) and the period filter's choices.
    with django_assert_max_num_queries(8):
        html = page(operator, reverse(LIST))
    assert html.count('class="budget-bar"') == 60
    assert html.count(">0.50</td>") == 60


def test_an_operator_adds_changes_and_deletes_budgets(operator):
    tenant = make_tenant("acme")
    key, _ = make_key(tenant)
    response = post(operator, reverse(ADD), {"tenant": tenant.pk, "period": "1MO", "limit_usd": "12.5",
                                             "alert_at_pct": "80"})
    assert response.status_code == 302, response.content.decode()[-3000:]
    response = post(operator, reverse(ADD), {"tenant": tenant.pk, "api_key": key.pk, "period": "90",
                                             "limit_usd": "0.25"})
    assert response.status_code == 302
    tenants, keys = Budget.objects.get(api_key=None), Budget.objects.get(api_key=key)
    assert (tenants.period, tenants.limit_usd, tenants.alert_at_pct) == ("1mo", Decimal("12.5"), 80)
    assert (keys.period, keys.limit_usd, keys.tenant) == ("90s", Decimal("0.25"), tenant)

    # A change touches the limit and threshold only: never the scope, the period or the secret.
    Budget.objects.filter(pk=tenants.pk).update(webhook_url="https://h.example/", webhook_secret="kept-secret")
    response = post(operator, reverse("admin:billing_budget_change", args=[tenants.pk]),
                    {"tenant": make_tenant("other").pk, "period": "1d", "limit_usd": "20", "alert_at_pct": ""})
    assert response.status_code == 302
    tenants.refresh_from_db()
    assert (tenants.tenant, tenants.period, tenants.limit_usd, tenants.alert_at_pct) == (tenant, "1mo", 20, None)
    assert (tenants.webhook_url, tenants.webhook_secret) == ("https://h.example/", "kept-secret")

    response = post(operator, reverse("admin:billing_budget_delete", args=[keys.pk]), {"post": "yes"})
    assert response.status_code == 302 and not Budget.objects.filter(pk=keys.pk).exists()
    assert LogEntry.objects.filter(user__username="oscar").count() == 4


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"period": "fortnight", "limit_usd": "1"}, "is not a period"),
        ({"period": "1d", "limit_usd": "-1"}, "greater than or equal to 0"),
        ({"period": "1d", "limit_usd": "1", "alert_at_pct": "0"}, "greater than or equal to 1"),
        ({"period": "1d", "limit_usd": "1", "alert_at_pct": "101"}, "less than or equal to 100"),
        ({"period": "1D", "limit_usd": "1"}, "Tenant acme already has a 1d budget"),
        ({"period": "1d", "limit_usd": "1", "api_key": "other"}, "is not one of acme&#x27;s"),
    ],
)
def test_the_add_form_refuses_bad_budgets(operator, fields, error):
    tenant = make_tenant("acme")
    Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal(5))
    if fields.get("api_key") == "other":
        fields = {**fields, "api_key": make_key(make_tenant("other"))[0].pk}
    response = post(operator, reverse(ADD), {"tenant": tenant.pk, **fields})
    assert response.status_code == 200
    assert error in response.content.decode()
    assert Budget.objects.count() == 1


def test_finance_reads_budgets_and_changes_nothing(finance, budget):
    assert "budget-bar" in page(finance, reverse(LIST))
    change = reverse("admin:billing_budget_change", args=[budget.pk])
    assert 'name="_save"' not in page(finance, change)
    assert finance.get(reverse(ADD)).status_code == 403
    new = {"tenant": budget.tenant_id, "period": "1h", "limit_usd": "1"}
    assert post(finance, reverse(ADD), new).status_code == 403
    assert post(finance, change, {"limit_usd": "999"}).status_code == 403
    assert post(finance, reverse("admin:billing_budget_delete", args=[budget.pk]), {"post": "yes"}).status_code == 403
    budget.refresh_from_db()
    assert (Budget.objects.count(), budget.limit_usd) == (1, Decimal(10))


def test_reservations_unknown_when_redis_does_not_answer(operator, budget, monkeypatch):
    def unreachable(budget_id, window):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(budget_store, "reserved_usd", unreachable)
    html = page(operator, reverse(LIST))
    assert "unknown (Redis did not answer)" in html and 'title="25.0% spent, 0.0% reserved"' in html
