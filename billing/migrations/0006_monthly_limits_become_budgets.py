"""Each key's monthly spend limit becomes its ``1mo`` budget (G1): the same
limit over the same calendar month, now reserved at admission."""

from django.db import migrations


def limits_to_budgets(apps, schema_editor):
    ApiKey = apps.get_model("hopbase", "ApiKey")
    Budget = apps.get_model("billing", "Budget")
    for key in ApiKey.objects.filter(monthly_limit_usd__isnull=False).iterator():
        Budget.objects.get_or_create(tenant_id=key.tenant_id, api_key_id=key.pk, period="1mo",
                                     defaults={"limit_usd": key.monthly_limit_usd})


def budgets_to_limits(apps, schema_editor):
    ApiKey = apps.get_model("hopbase", "ApiKey")
    Budget = apps.get_model("billing", "Budget")
    for budget in Budget.objects.filter(api_key__isnull=False, period="1mo").iterator():
        ApiKey.objects.filter(pk=budget.api_key_id).update(monthly_limit_usd=budget.limit_usd)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_budgets"),
        ("hopbase", "0004_apikey_tpm"),
    ]

    operations = [migrations.RunPython(limits_to_budgets, budgets_to_limits)]
