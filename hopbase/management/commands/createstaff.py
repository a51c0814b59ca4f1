"""createstaff USERNAME --role {operator,finance} --password-stdin

A staff user (may log in to the admin, is no superuser) in one role's group
(tenants.roles). The password is the first line of standard input, never an
argument (it would show in the process list and shell history), and must
pass Django's password validators (AUTH_PASSWORD_VALIDATORS). The admin log
has the user's addition and role by the OS user (core.audit).
"""

from __future__ import annotations

import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from core import audit
from core.commands import OperatorCommand, parse_name
from tenants.roles import ROLES, ensure_role


class Command(OperatorCommand):
    help = "Create a staff user in a role (operator or finance); the password is read from standard input."
    stealth_options = ("stdin",)  # call_command(..., stdin=...) in tests, as createsuperuser takes it

    def add_arguments(self, parser) -> None:
        parser.add_argument("username", help="The staff user's login name")
        parser.add_argument("--role", required=True, help=f"One of {', '.join(ROLES)}")
        parser.add_argument(
            "--password-stdin", action="store_true", help="Read the password from the first line of standard input"
        )

    def handle(self, *args, username: str, role: str, password_stdin: bool, **options) -> None:
        User = get_user_model()
        if role.strip().lower() not in ROLES:
            raise CommandError(f"--role: {role!r} is not one of {', '.join(ROLES)}")
        role = role.strip().lower()
        if not password_stdin:
            raise CommandError("give the password on standard input, with --password-stdin")
        username = parse_name(username, "username", User._meta.get_field(User.USERNAME_FIELD).max_length)
        try:
            User._meta.get_field(User.USERNAME_FIELD).run_validators(username)
        except ValidationError as error:
            raise CommandError(f"username: {' '.join(error.messages)}") from None
        stdin = options.get("stdin") or sys.stdin
        password = stdin.readline().rstrip("\r\n")
        if not password:
            raise CommandError("no password on standard input (its first line is the password)")
        user = User(**{User.USERNAME_FIELD: username}, is_staff=True, is_superuser=False, is_active=True)
        try:
            validate_password(password, user)
        except ValidationError as error:
            raise CommandError(f"password: {' '.join(error.messages)}") from None
        if User._default_manager.filter(**{User.USERNAME_FIELD: username}).exists():
            raise CommandError(f"a user named {username!r} already exists")
        user.set_password(password)
        try:
            with transaction.atomic():
                user.save()
                group = ensure_role(role)
                user.groups.add(group)
                audit.added(user, [("group", str(group))])
        except IntegrityError:  # created by someone else since the check above
            raise CommandError(f"a user named {username!r} already exists") from None
        self.stdout.write(f"created staff user {username} (id {user.pk}) in role {role}")
