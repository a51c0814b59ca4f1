"""Budget alerts in the admin (billing.budgets.admin_alerts): operators and finance
read each alert and its delivery attempts, and nobody adds, changes or
deletes one; staff without the roles' permissions see nothing. Through a
real login with CSRF checks on, as tests/processes/test_roles.py drives the admin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from billing.budgets.alerts import record_alert
from billing.budgets.windows import window_at
from billing.models import AlertType, Budget, BudgetAlert, WebhookAttempt
from tenants.roles import ROLES
from tests.support.factories import make_key, make_tenant
from tests.support.staff_checks import PASSWORD, browser, create_staff, log_in, post

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 5, 21, 17, 3, tzinfo=UTC)
ALERT_PERMISSIONS = {"billing.view_budgetalert", "billing.view_webhookattempt"}


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def alert() -> BudgetAlert:
    tenant = make_tenant("acme-alerts")
    key, _ = make_key(tenant, label="ci")
    budget = Budget.objects.create(tenant=tenant, api_key=key, period="1d", limit_usd=Decimal("12.5"),
                                   alert_at_pct=80, webhook_url="http://127.0.0.1:9/hooks",
                                   webhook_secret="whsec-admin-test")
    alert = record_alert(budget.pk, AlertType.THRESHOLD, window_at("1d", NOW), Decimal("10.5"))
    WebhookAttempt.objects.create(alert=alert, attempted_at=NOW, status_code=500)
    WebhookAttempt.objects.create(alert=alert, attempted_at=NOW + timedelta(seconds=5),
                                  error="ConnectError: [Errno 111] Connection refused")
    return alert


def page(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def test_both_roles_read_alerts_and_their_attempts():
    for role in ("operator", "finance"):
        assert ALERT_PERMISSIONS <= set(ROLES[role])


@pytest.mark.parametrize("role", ["operator", "finance"])
def test_staff_of_either_role_read_an_alert_with_its_attempts_and_change_nothing(role, alert):
    create_staff(f"{role}-alerts", role)
    client = log_in(f"{role}-alerts")
    listing = page(client, reverse("admin:billing_budgetalert_changelist"))
    assert "Threshold" in listing and f"key {alert.budget.api_key.prefix} 1d budget" in listing
    change_url = reverse("admin:billing_budgetalert_change", args=[alert.pk])
    detail = page(client, change_url)
    assert "HTTP 500" in detail and "ConnectError: [Errno 111] Connection refused" in detail
    assert str(alert.pk) in detail and "&quot;spent_usd&quot;:&quot;10.50&quot;" in detail
    assert "whsec-admin-test" not in detail
    assert client.get(reverse("admin:billing_budgetalert_add")).status_code == 403
    assert post(client, change_url, {"type": AlertType.EXHAUSTED}).status_code == 403
    assert post(client, reverse("admin:billing_budgetalert_delete", args=[alert.pk]), {"post": "yes"}
                ).status_code == 403
    alert.refresh_from_db()
    assert alert.type == AlertType.THRESHOLD and alert.attempts.count() == 2


def test_staff_without_the_permissions_see_no_alerts(alert):
    User.objects.create_user("nobody", password=PASSWORD, is_staff=True)
    client = log_in("nobody")
    assert client.get(reverse("admin:billing_budgetalert_changelist")).status_code == 403
    assert client.get(reverse("admin:billing_budgetalert_change", args=[alert.pk])).status_code == 403


def test_anonymous_visitors_are_sent_to_the_login(alert):
    response = browser().get(reverse("admin:billing_budgetalert_changelist"))
    assert response.status_code == 302 and reverse("admin:login") in response["location"]


@pytest.mark.parametrize("delivered", ["yes", "no", "none"])
def test_the_list_filters_by_delivery(admin_client, alert, delivered):
    listing = page(admin_client, reverse("admin:billing_budgetalert_changelist") + f"?delivered={delivered}")
    assert ("not yet" in listing) == (delivered == "no")


def test_the_list_searches_by_event_id(admin_client, alert):
    url = reverse("admin:billing_budgetalert_changelist")
    assert "not yet" in page(admin_client, url + f"?q={alert.pk}")
    assert "not yet" not in page(admin_client, url + "?q=00000000-0000-0000-0000-000000000000")


def test_the_list_searches_by_tenant_name_and_key_prefix(admin_client, alert):
    url = reverse("admin:billing_budgetalert_changelist")
    assert "not yet" in page(admin_client, url + "?q=acme-alerts")
    assert "not yet" in page(admin_client, url + f"?q={alert.budget.api_key.prefix}")
    assert "not yet" not in page(admin_client, url + "?q=globex")
