"""Staff roles (hopbase.roles): the top-up permission of its own, and the
operator and finance groups with their permissions. The groups are made
after every model they name exists, so this depends on each app's latest
migration at the time; a later change of the roles is a new migration."""

from django.db import migrations


def install_roles(apps, schema_editor):
    from hopbase.roles import install_roles

    install_roles(apps)


def remove_roles(apps, schema_editor):
    from hopbase.roles import ROLES

    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("hopbase", "0002_apikey_expires_at"),
        ("billing", "0003_ledgerentry_idempotency_key"),
        ("channels_pool", "0003_channel_secret_encrypted"),
        ("admin", "0003_logentry_add_action_flag_choices"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="tenant",
            options={"ordering": ["name"], "permissions": [("top_up_tenant", "Can top up a tenant's balance")]},
        ),
        migrations.RunPython(install_roles, remove_roles),
    ]
