"""createtenantuser TENANT EMAIL --role {owner,member} --password-stdin

A person of a tenant for the console at /console/ (K1). The password is the
first line of standard input, never an argument (it would show in the
process list and shell history), and must pass Django's password validators.
An owner may make and revoke the tenant's keys, so the admin log has the
membership's addition by the OS user (core.audit), in the same transaction.
"""

from __future__ import annotations

import sys

from django.core.management.base import CommandError
from django.db import transaction

from console.members import MemberError, add_member
from console.models import Role
from core import audit
from core.commands import OperatorCommand
from tenants.commands import find_tenant

FLAGS = {"email": "EMAIL", "role": "--role", "password": "password"}


class Command(OperatorCommand):
    help = "Create a console user (owner or member) of a tenant; the password is read from standard input."
    stealth_options = ("stdin",)

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")
        parser.add_argument("email", help="The person's email, which they sign in with")
        parser.add_argument("--role", required=True, help=f"One of {', '.join(Role.values)}")
        parser.add_argument(
            "--password-stdin", action="store_true", help="Read the password from the first line of standard input"
        )

    def handle(self, *args, tenant: str, email: str, role: str, password_stdin: bool, **options) -> None:
        role = role.strip().lower()
        if role not in Role.values:
            raise CommandError(f"--role: {role!r} is not one of {', '.join(Role.values)}")
        if not password_stdin:
            raise CommandError("give the password on standard input, with --password-stdin")
        owner = find_tenant(tenant)
        password = (options.get("stdin") or sys.stdin).readline().rstrip("\r\n")
        if not password:
            raise CommandError("--password-stdin: no password on standard input (its first line is the password)")
        try:
            with transaction.atomic():
                membership = add_member(owner, email, role, password)
                audit.added(membership)
        except MemberError as error:
            raise CommandError(f"{FLAGS[error.field]}: {error.message}") from None
        self.stdout.write(
            f"created {membership.role} {membership.user.get_username()} (id {membership.user.pk}) "
            f"of tenant {owner.name}; they sign in at /console/login/"
        )
