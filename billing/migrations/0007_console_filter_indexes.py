# The console's filters by model and status (console.logs). On PostgreSQL
# the indexes are built CONCURRENTLY: request_log is the gateway's busiest
# table, and a plain CREATE INDEX would hold its inserts for the whole build.

from django.db import migrations, models

INDEXES = [
    models.Index(fields=["tenant", "model", "-created_at"], name="log_tenant_model_time"),
    models.Index(fields=["tenant", "status", "-created_at"], name="log_tenant_status_time"),
]


def create(apps, schema_editor):
    model = apps.get_model("billing", "RequestLog")
    for index in INDEXES:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(index.create_sql(model, schema_editor, concurrently=True))
        else:
            schema_editor.add_index(model, index)


def drop(apps, schema_editor):
    model = apps.get_model("billing", "RequestLog")
    for index in INDEXES:
        schema_editor.remove_index(model, index)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("billing", "0006_monthly_limits_become_budgets"),
        ("channels_pool", "0007_secret_fits_a_service_account_key"),
        ("hopbase", "0008_apikey_rotation"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="requestlog", index=index) for index in INDEXES],
            database_operations=[migrations.RunPython(create, drop)],
        ),
    ]
