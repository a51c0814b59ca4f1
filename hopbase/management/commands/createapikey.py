"""createapikey TENANT [--name LABEL] [--models m1,m2] [--rpm N] [--concurrency N] [--expires ISO]

Prints the new key's secret alone on the last stdout line. Only its hash is
stored: the secret cannot be shown again. ``--expires`` takes an ISO 8601
date (midnight UTC) or datetime (UTC when it carries no offset): from then on
the key is refused like a revoked one.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.utils import timezone

from core.commands import OperatorCommand, checked, find_tenant, parse_moment, parse_optional_positive
from core.model_names import parse_required_model_names
from hopbase.models import ApiKey


class Command(OperatorCommand):
    help = "Issue an API key for a tenant; the secret is printed once, on the last line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")
        parser.add_argument("--name", default="", metavar="LABEL", help="A label for the key")
        parser.add_argument("--models", metavar="M1,M2", help="Allowed models (default: every model)")
        parser.add_argument("--rpm", metavar="N", help="Requests per minute (default: no limit)")
        parser.add_argument("--concurrency", metavar="N", help="Open requests at once (default: no limit)")
        parser.add_argument("--expires", metavar="ISO", help="Refused from this moment on (default: never)")

    def handle(
        self, *args, tenant: str, name: str, models: str | None, rpm, concurrency, expires: str | None, **options
    ) -> None:
        label = name.strip()
        max_label = ApiKey._meta.get_field("label").max_length
        if len(label) > max_label:
            raise CommandError(f"--name is longer than {max_label} characters")
        allowed = checked(models, parse_required_model_names, "--models") if models is not None else []
        rpm_limit = parse_optional_positive(rpm, "--rpm")
        concurrency_limit = parse_optional_positive(concurrency, "--concurrency")
        expires_at = parse_moment(expires, "--expires") if expires is not None else None
        if expires_at is not None and expires_at <= timezone.now():
            raise CommandError(f"--expires: {expires.strip()!r} is already past")
        owner = find_tenant(tenant)

        key, secret = ApiKey.objects.issue(
            owner,
            label=label,
            allowed_models=allowed,
            rpm=rpm_limit,
            concurrency=concurrency_limit,
            expires_at=expires_at,
        )
        self.stdout.write(f"key {key.prefix} (id {key.pk}) for tenant {owner.name}")
        self.stdout.write(
            f"models: {', '.join(allowed) or 'all'}; rpm: {rpm_limit or 'no limit'}; "
            f"concurrency: {concurrency_limit or 'no limit'}; "
            f"expires: {expires_at.isoformat() if expires_at else 'never'}"
        )
        self.stdout.write("secret (shown once, not stored):")
        self.stdout.write(secret)
