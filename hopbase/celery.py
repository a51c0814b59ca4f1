"""The Celery app: settlement tasks and the periodic sweep (billing.tasks)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hopbase.settings")

app = Celery("hopbase")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
