from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    # The label the tables, migrations and permissions were made under, when
    # these models lived in the project's package: hopbase_tenant, hopbase_apikey.
    label = "hopbase"
    verbose_name = "Tenants and keys"
