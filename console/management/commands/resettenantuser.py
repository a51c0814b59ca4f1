"""resettenantuser EMAIL [--base-url URL]

A one-time link for a console user to choose a new password (K1), printed
for the operator to hand over (and mailed where EMAIL_HOST is set). It
works until PASSWORD_RESET_TIMEOUT (HOPBASE_CONSOLE_RESET_AGE) and ends
once used. The link is the gateway's address (``--base-url``, else
HOPBASE_PUBLIC_URL) and the reset's path; with neither, the path alone.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError

from console import passwords
from core.commands import OperatorCommand


class Command(OperatorCommand):
    help = "Print a one-time password reset link for a console user (and mail it where mail is set up)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("email", help="The console user's email")
        parser.add_argument("--base-url", default="", help="The gateway's address, e.g. https://llm.example.com")

    def handle(self, *args, email: str, base_url: str, **options) -> None:
        user = passwords.console_user(email)
        if user is None:
            raise CommandError(f"EMAIL: {email.strip()!r} is no active console user")
        link = (base_url.rstrip("/") or settings.HOPBASE_PUBLIC_URL) + passwords.path_of(user)
        mailed = link.startswith("http") and passwords.send_link(user, link)
        minutes = settings.PASSWORD_RESET_TIMEOUT // 60
        self.stdout.write(f"a password reset link for {user.get_username()} (works once, for {minutes} minutes"
                          f"{'; mailed' if mailed else ''}):\n{link}")
