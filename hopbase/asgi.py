"""The ASGI entry point Daphne and uvicorn serve: ``hopbase.asgi:application``
(plain ``daphne``, or ``manage.py serve``'s workers: hopbase.serve_worker).

Django is set up here, before anything of the gateway is imported; the
server's Twisted web server is adjusted before the application exists, and
the drain is hooked to Daphne's reactor (serving.lifecycle) before
Daphne's ``Server.run`` adds its own shutdown trigger.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hopbase.settings")

import django  # noqa: E402

django.setup(set_prefix=False)

from serving import lifecycle, twisted_web  # noqa: E402

twisted_web.adjust()

from serving.handler import application  # noqa: E402

lifecycle.install()

__all__ = ["application"]
