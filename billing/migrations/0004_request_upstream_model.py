from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0003_ledgerentry_idempotency_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="requestlog",
            name="upstream_model",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="requestlog",
            name="provider_request_id",
            field=models.CharField(blank=True, max_length=100),
        ),
    ]
