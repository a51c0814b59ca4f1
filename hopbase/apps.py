from django.apps import AppConfig


class HopbaseConfig(AppConfig):
    name = "hopbase"
    verbose_name = "Tenants and keys"
