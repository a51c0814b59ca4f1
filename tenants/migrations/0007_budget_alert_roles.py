"""Staff roles with budget alerts (G4): operators and finance view the alerts
and their delivery attempts (billing.budgets.admin_alerts). The groups are set again
to exactly these tables; undone, they go back to 0006's."""

import importlib

from django.db import migrations

# The roles as they are at this migration (tenants.roles.ROLES then): a
# later change of the roles is a migration of its own.
ROLES = {
    "operator": (
        "hopbase.view_tenant", "hopbase.add_tenant", "hopbase.change_tenant", "hopbase.top_up_tenant",
        "hopbase.view_apikey", "hopbase.add_apikey", "hopbase.change_apikey",
        "channels_pool.view_channel", "channels_pool.add_channel", "channels_pool.change_channel",
        "channels_pool.delete_channel", "channels_pool.view_channelhealth",
        "billing.view_modelprice", "billing.add_modelprice",
        "billing.view_requestlog", "billing.view_ledgerentry",
        "billing.view_budget", "billing.add_budget", "billing.change_budget", "billing.delete_budget",
        "billing.view_budgetalert", "billing.view_webhookattempt",
        "admin.view_logentry",
    ),
    "finance": (
        "hopbase.view_tenant",
        "billing.view_modelprice", "billing.view_requestlog", "billing.view_ledgerentry",
        "billing.view_budget",
        "billing.view_budgetalert", "billing.view_webhookattempt",
        "admin.view_logentry",
    ),
}


def install_roles(apps, schema_editor):
    from tenants.roles import install_roles

    install_roles(apps, ROLES)


def previous_roles(apps, schema_editor):
    from tenants.roles import install_roles

    # A module name starting with a digit is no identifier: import it by name.
    install_roles(apps, importlib.import_module("tenants.migrations.0006_budget_roles").ROLES)


class Migration(migrations.Migration):

    dependencies = [
        ("hopbase", "0006_budget_roles"),
        ("billing", "0005_budgets"),  # BudgetAlert and WebhookAttempt
    ]

    operations = [migrations.RunPython(install_roles, previous_roles)]
