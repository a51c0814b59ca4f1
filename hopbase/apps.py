from django.apps import AppConfig
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections


class HopbaseConfig(AppConfig):
    name = "hopbase"
    # "hopbase" is the tenants app's label (tenants.apps); the project's own
    # app holds no models, only the admin's registrations and operator commands.
    label = "project"
    verbose_name = "HopBase"

    def ready(self) -> None:
        # Django closes stale database connections around every request, in
        # its one sync thread. The API handler (serving.handler.ApiHandler)
        # touches the database only from pool threads that refresh their own
        # connections (core.snapshots), so the per-request hand-off to
        # that thread is kept for the admin's handler alone.
        for signal in (signals.request_started, signals.request_finished):
            signal.disconnect(close_old_connections)
            signal.connect(close_old_connections, sender=ASGIHandler)
