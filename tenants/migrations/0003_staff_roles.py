"""Staff roles (tenants.roles): the top-up permission of its own, and the
operator and finance groups with their permissions. The groups are made
after every model they name exists, so this depends on each app's latest
migration at the time; a later change of the roles is a new migration, and
this one installs the roles of its own time (ROLES below)."""

from django.db import migrations


# The roles as they were at this migration: tenants.roles.ROLES has grown
# since, with permissions of models that do not exist yet at this point of a
# new database's migrations (later migrations install the later tables).
ROLES = {
    "operator": (
        "hopbase.view_tenant", "hopbase.add_tenant", "hopbase.change_tenant", "hopbase.top_up_tenant",
        "hopbase.view_apikey", "hopbase.add_apikey", "hopbase.change_apikey",
        "channels_pool.view_channel", "channels_pool.add_channel", "channels_pool.change_channel",
        "channels_pool.delete_channel", "channels_pool.view_channelhealth",
        "billing.view_modelprice", "billing.add_modelprice",
        "billing.view_requestlog", "billing.view_ledgerentry",
        "admin.view_logentry",
    ),
    "finance": (
        "hopbase.view_tenant",
        "billing.view_modelprice", "billing.view_requestlog", "billing.view_ledgerentry",
        "admin.view_logentry",
    ),
}


def install_roles(apps, schema_editor):
    from tenants.roles import install_roles

    install_roles(apps, ROLES)


def remove_roles(apps, schema_editor):
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
