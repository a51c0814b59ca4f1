"""Staff roles: Django groups with Django permissions, nothing of our own.

- **operator** runs the gateway: tenants (and their price multipliers), API
  keys, channels, prices, top-ups, budgets; reads request logs, the ledger
  and the admin's change log.
- **finance** reads: request logs (and their exports and the dashboard), the
  ledger, tenants, prices, budgets and the admin's change log. It changes
  nothing.

Superusers have every permission, as Django has them. The groups are made by
a migration (tenants/migrations/0003_staff_roles.py), which calls
``install_roles`` with the historical app registry and the roles as they
were then; a change of ``ROLES`` is a migration of its own that installs them
again with the new table, written out in it (0006_budget_roles.py): a
migration run on a new database meets only the models that exist at its
point. ``manage.py createstaff`` makes a missing group again
(``ensure_role``) but never rewrites one an operator has adjusted.
"""

from __future__ import annotations

from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions

TOP_UP_PERMISSION = "hopbase.top_up_tenant"

ROLES: dict[str, tuple[str, ...]] = {
    "operator": (
        "hopbase.view_tenant", "hopbase.add_tenant", "hopbase.change_tenant", TOP_UP_PERMISSION,
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


def _permissions(apps, names: tuple[str, ...]) -> list:
    Permission = apps.get_model("auth", "Permission")
    found = []
    for name in names:
        app_label, codename = name.split(".")
        found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return found


def _create_all_permissions(apps) -> None:
    """Permissions are made after migrations (post_migrate); a migration
    that hands them out makes them first."""
    from django.contrib.contenttypes.management import create_contenttypes

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_contenttypes(app_config, verbosity=0, apps=apps)
        create_permissions(app_config, verbosity=0, apps=apps)
        app_config.models_module = None


def install_roles(apps=global_apps, roles: dict[str, tuple[str, ...]] = ROLES) -> None:
    """Every role's group with exactly its permissions (a migration, with the table of its time)."""
    _create_all_permissions(apps)
    Group = apps.get_model("auth", "Group")
    for role, names in roles.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(_permissions(apps, names))


def ensure_role(role: str):
    """The role's group; made with its permissions when missing."""
    from django.contrib.auth.models import Group

    group = Group.objects.filter(name=role).first()
    if group is None:
        group = Group.objects.create(name=role)
        group.permissions.set(_permissions(global_apps, ROLES[role]))
    return group
