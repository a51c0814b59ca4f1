"""The ASGI entry point Daphne serves.

Static files (the admin's and the dashboard's) are served by Django's
staticfiles handler straight from the apps: HopBase needs no CDN, and a
request for anything else passes through after one prefix check.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hopbase.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

application = ASGIStaticFilesHandler(get_asgi_application())
