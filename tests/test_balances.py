"""Who may still spend: tenants with credit left, keys under their monthly
spend limit (balance gating, B-rules of billing)."""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import httpx
import pytest
from django.utils import timezone

from billing.balances import load_exhausted_tenants, load_keys_over_limit
from billing.ledger import top_up
from billing.settlement import settle_many
from hopbase.models import ApiKey, Tenant
from tests.factories import make_key, make_log, make_tenant
from tests.wire import call, wait_for_log


@pytest.mark.django_db
def test_tenants_with_nothing_left_are_exhausted():
    broke, funded = make_tenant(), make_tenant()
    top_up(funded, Decimal("1"))
    exhausted = load_exhausted_tenants()
    assert broke.pk in exhausted and funded.pk not in exhausted


@pytest.mark.django_db
def test_a_key_is_over_its_limit_once_this_months_charges_reach_it():
    tenant = make_tenant()
    capped, _ = make_key(tenant, monthly_limit_usd=Decimal("1.00"))
    uncapped, _ = make_key(tenant)
    zero, _ = make_key(tenant, monthly_limit_usd=Decimal("0"))
    last_month = timezone.now().replace(day=1) - dt.timedelta(days=2)
    make_log(tenant, key=capped, charge_usd=Decimal("5"), created_at=last_month)
    make_log(tenant, key=capped, charge_usd=Decimal("0.60"))
    make_log(tenant, key=uncapped, charge_usd=Decimal("500"))
    assert load_keys_over_limit() == frozenset({zero.pk})
    make_log(tenant, key=capped, charge_usd=Decimal("0.40"))
    assert load_keys_over_limit() == frozenset({zero.pk, capped.pk})


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
def test_a_key_past_its_monthly_limit_is_refused_in_its_protocols_format(gateway, world):
    key, secret = ApiKey.objects.issue(Tenant.objects.get(pk=world.tenant_id), monthly_limit_usd=Decimal("0.000001"))
    request = call("chat", secret, "sim-model", "hi [sim tokens=5]", stream=False)
    first = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers)
    assert first.status_code == 200
    settle_many([wait_for_log(first.headers["x-hopbase-request-id"]).pk])
    deadline = time.monotonic() + 5
    while (refused := httpx.post(gateway.url + request.path, json=request.body, headers=request.headers)).status_code == 200:
        assert time.monotonic() < deadline  # seen within HOPBASE_CONFIG_TTL
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert "monthly spend limit" in refused.json()["error"]["message"]
