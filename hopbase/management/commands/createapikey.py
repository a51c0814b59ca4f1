"""createapikey TENANT [--name LABEL] [--models m1,m2] [--rpm N] [--concurrency N] [--tpm N]
[--budget-usd USD --budget-period PERIOD] [--expires ISO]

Prints the new key's secret alone on the last stdout line. Only its hash is
stored: the secret cannot be shown again. ``--expires`` takes an ISO 8601
date (midnight UTC) or datetime (UTC when it carries no offset): from then on
the key is refused like a revoked one. ``--tpm`` limits the key's input and
output tokens per sliding minute (G5). ``--budget-usd`` with
``--budget-period`` gives the key a USD budget of its own (G1), made with the
key or not at all; ``setbudget --key`` changes it later. The admin log has
the key's addition (and its budget's) by the OS user (core.audit), never
the secret.
"""

from __future__ import annotations

from decimal import Decimal

from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone

from billing.budgets.options import parse_budget_period
from billing.budgets.windows import describe
from billing.models import Budget
from core import audit
from core.commands import OperatorCommand, checked, parse_moment, parse_optional_positive, parse_usd
from core.model_names import parse_required_model_names
from core.money import usd_text
from tenants.commands import find_tenant
from tenants.models import ApiKey


class Command(OperatorCommand):
    help = "Issue an API key for a tenant; the secret is printed once, on the last line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")
        parser.add_argument("--name", default="", metavar="LABEL", help="A label for the key")
        parser.add_argument("--models", metavar="M1,M2", help="Allowed models (default: every model)")
        parser.add_argument("--rpm", metavar="N", help="Requests per minute (default: no limit)")
        parser.add_argument("--concurrency", metavar="N", help="Open requests at once (default: no limit)")
        parser.add_argument("--tpm", metavar="N", help="Input and output tokens per minute (default: no limit)")
        parser.add_argument("--budget-usd", metavar="USD", help="A USD budget of the key's own, per --budget-period")
        parser.add_argument("--budget-period", metavar="PERIOD",
                            help="The budget's period: 1h, 1d, 1w, 1mo, total, or a number of seconds (30s)")
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
        tpm_limit = parse_optional_positive(options["tpm"], "--tpm")
        budget = self._budget(options["budget_usd"], options["budget_period"])
        expires_at = parse_moment(expires, "--expires") if expires is not None else None
        if expires_at is not None and expires_at <= timezone.now():
            raise CommandError(f"--expires: {expires.strip()!r} is already past")
        owner = find_tenant(tenant)

        with transaction.atomic():  # a key asked for with a budget never exists without it
            key, secret = ApiKey.objects.issue(
                owner,
                label=label,
                allowed_models=allowed,
                rpm=rpm_limit,
                concurrency=concurrency_limit,
                tpm=tpm_limit,
                expires_at=expires_at,
            )
            made = None
            if budget is not None:
                made = Budget.objects.create(tenant=owner, api_key=key, period=budget[1], limit_usd=budget[0])
            audit.added(key, [("budget", str(made))] if made is not None else ())
        self.stdout.write(f"key {key.prefix} (id {key.pk}) for tenant {owner.name}")
        self.stdout.write(
            f"models: {', '.join(allowed) or 'all'}; rpm: {rpm_limit or 'no limit'}; "
            f"concurrency: {concurrency_limit or 'no limit'}; tpm: {tpm_limit or 'no limit'}; "
            f"expires: {expires_at.isoformat() if expires_at else 'never'}"
        )
        if budget is not None:
            self.stdout.write(f"budget: {usd_text(budget[0])} USD {describe(budget[1])} ({budget[1]})")
        self.stdout.write("secret (shown once, not stored):")
        self.stdout.write(secret)

    @staticmethod
    def _budget(usd: str | None, period: str | None) -> tuple[Decimal, str] | None:
        """(limit, canonical period) of the key's budget, or None for none."""
        if usd is None and period is None:
            return None
        if usd is None or period is None:
            given, missing = ("--budget-period", "--budget-usd") if usd is None else ("--budget-usd", "--budget-period")
            raise CommandError(f"{missing} is required with {given}")
        # Zero is refused, not taken for "no budget" (setbudget's --usd 0): leave both flags out for none.
        return parse_usd(usd, "--budget-usd"), parse_budget_period(period, "--budget-period")
