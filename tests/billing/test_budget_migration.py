"""The monthly spend limit a key had becomes its ``1mo`` budget (G1), the
same limit over the same calendar month: the data migration, run forwards
and back on a database holding such keys."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("hopbase", "0004_apikey_tpm"), ("billing", "0005_budgets")]
AFTER = [("hopbase", "0005_monthly_limit_is_a_budget"), ("billing", "0006_monthly_limits_become_budgets")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_each_monthly_limit_becomes_a_monthly_key_budget_and_back():
    try:
        apps = migrate(BEFORE)
        Tenant, ApiKey = apps.get_model("hopbase", "Tenant"), apps.get_model("hopbase", "ApiKey")
        tenant = Tenant.objects.create(name="limited-tenant")
        capped = ApiKey.objects.create(tenant=tenant, key_hash="a" * 64, prefix="hb-capped",
                                       monthly_limit_usd=Decimal("12.5"))
        ApiKey.objects.create(tenant=tenant, key_hash="b" * 64, prefix="hb-free")

        apps = migrate(AFTER)
        budgets = list(apps.get_model("billing", "Budget").objects.values("api_key_id", "tenant_id", "period",
                                                                           "limit_usd"))
        assert budgets == [{"api_key_id": capped.pk, "tenant_id": tenant.pk, "period": "1mo",
                            "limit_usd": Decimal("12.5")}]

        apps = migrate(BEFORE)
        ApiKey = apps.get_model("hopbase", "ApiKey")
        assert ApiKey.objects.get(pk=capped.pk).monthly_limit_usd == Decimal("12.5")
        assert ApiKey.objects.get(prefix="hb-free").monthly_limit_usd is None
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
