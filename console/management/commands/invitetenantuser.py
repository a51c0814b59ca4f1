"""invitetenantuser TENANT EMAIL --role {owner,member} [--base-url URL]

Invite a person to a tenant's console (K1): prints the one-time link, which
works until HOPBASE_CONSOLE_INVITE_AGE, and mails it where EMAIL_HOST is
set. The link is the gateway's address (``--base-url``, else
HOPBASE_PUBLIC_URL) and the invitation's path; with neither, the path alone.
The invitation is in the admin log by the OS user (core.audit).
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError

from console import invitations
from console.models import Role
from core import audit
from core.commands import OperatorCommand
from tenants.commands import find_tenant


class Command(OperatorCommand):
    help = "Invite a person to a tenant's console: prints the one-time link (and mails it where mail is set up)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")
        parser.add_argument("email", help="The person's email, which they will sign in with")
        parser.add_argument("--role", required=True, help=f"One of {', '.join(Role.values)}")
        parser.add_argument("--base-url", default="", help="The gateway's address, e.g. https://llm.example.com")

    def handle(self, *args, tenant: str, email: str, role: str, base_url: str, **options) -> None:
        owner = find_tenant(tenant)
        try:
            invitation, token = invitations.invite(owner, email, role.strip().lower(), audit.actor(), operator=True)
        except invitations.InvitationRefused as refused:
            raise CommandError(str(refused)) from None
        link = (base_url.rstrip("/") or settings.HOPBASE_PUBLIC_URL) + invitations.path_of(token)
        mailed = invitations.mail(invitation, link) if link.startswith("http") else False
        self.stdout.write(
            f"invited {invitation.email} as {invitation.role} of tenant {owner.name}, until "
            f"{invitation.expires_at:%Y-%m-%d %H:%M} UTC{'; mailed' if mailed else ''}; the link (works once):\n{link}"
        )
