"""Mail from the console (invitations, password resets) by Django's mail,
where EMAIL_HOST is set; without it nothing is sent and the link is handed
over by hand (the page or the command shows it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from django.conf import settings
from django.core.mail import send_mail

from core import loggers

log = logging.getLogger(loggers.CONSOLE_MAIL)
# Mail a page asks for goes out from here, after its answer: a page that
# mails only when an account exists must take as long either way.
_later = ThreadPoolExecutor(max_workers=1, thread_name_prefix="console-mail")


def configured() -> bool:
    return bool(settings.EMAIL_HOST)


def send(to: str, subject: str, body: str) -> bool:
    """True once the mail server took the message. A failure is logged
    without the body (it carries a one-time link) and is no error: the
    link is still shown to whoever asked for it."""
    if not configured():
        return False
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [to])
    except (OSError, ValueError) as error:  # smtplib's errors are OSErrors
        log.warning("console mail to %s not sent: %s", to, type(error).__name__)
        return False
    return True


def later(job: Callable[..., object], *args: object) -> Future:
    """Run ``job`` (which mails) off the request, one at a time."""
    return _later.submit(job, *args)
