"""setbudget (--tenant NAME | --key PREFIX) --usd USD --period PERIOD [--alert-at PCT] [--webhook URL]

Sets the USD budget of a tenant, or of one key, for one period (rule G1):
``1h``, ``1d``, ``1w`` (from Monday 00:00 UTC), ``1mo`` (the calendar month,
UTC), ``total``, or a number of seconds (``30s``). Run again for the same
scope and period, it changes that budget; ``--usd 0`` removes it.

``--alert-at`` is the percent of the limit whose crossing raises an alert
(G4); ``--webhook`` is where alerts are posted, signed with a secret made
afresh each time the flag is given and printed alone on the last stdout line,
once: it is stored encrypted and shown nowhere else. A budget changed
without these flags keeps the ones it had, so that raising a limit does not
change the receiver's secret under it. Everything is checked before anything
is written, and a refusal names the flag to fix. The admin log has the
budget's addition, change (the fields that changed, by name: the webhook's
secret is named, never shown) or deletion, by the OS user (core.audit), in
the same transaction.
"""

from __future__ import annotations

import secrets
from decimal import Decimal

from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone

from billing.budgets.options import parse_budget_period, parse_percent, validate_webhook
from billing.budgets.windows import describe, window_at
from billing.exports import utc_iso
from billing.models import Budget
from core import audit
from core.commands import OperatorCommand, checked, parse_usd
from core.money import usd_text
from tenants.commands import find_tenant
from tenants.models import ApiKey, Tenant


def find_key(prefix: str) -> ApiKey:
    """The one key whose display prefix starts with ``prefix``."""
    prefix = prefix.strip()
    if not prefix:
        raise CommandError("--key must not be empty")
    found = list(ApiKey.objects.filter(prefix__startswith=prefix).select_related("tenant")[:2])
    if not found:
        raise CommandError(f"--key: no key has the prefix {prefix!r}")
    if len(found) > 1:
        raise CommandError(f"--key: {prefix!r} is the prefix of more than one key; give more of it")
    return found[0]


# How the admin log names each field this command sets (the admin's budget form's labels).
FIELD_LABELS = {"limit_usd": "Limit (USD)", "alert_at_pct": "Alert at (%)", "webhook_url": "Webhook URL",
                "webhook_secret": "Webhook secret"}


def scope_name(tenant: Tenant, key: ApiKey | None) -> str:
    return f"key {key.prefix} (tenant {tenant.name})" if key is not None else f"tenant {tenant.name}"


class Command(OperatorCommand):
    help = "Set, change or remove (--usd 0) a tenant's or a key's USD budget for a period."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", metavar="NAME", help="The tenant's budget (all its keys together)")
        parser.add_argument("--key", metavar="PREFIX", help="One key's budget, by its display prefix (hb-…)")
        parser.add_argument("--usd", required=True, metavar="USD", help="The limit per window; 0 removes the budget")
        parser.add_argument("--period", required=True, metavar="PERIOD",
                            help="1h, 1d, 1w, 1mo, total, or a number of seconds (30s)")
        parser.add_argument("--alert-at", metavar="PCT", help="Alert when this percent of the limit is spent (1-100)")
        parser.add_argument("--webhook", metavar="URL",
                            help="POST alerts here; a new signing secret is printed on the last line")

    def handle(self, *args, **options) -> None:
        if (options["tenant"] is None) == (options["key"] is None):
            raise CommandError("give either --tenant NAME or --key PREFIX, not both or neither")
        limit = parse_usd(options["usd"], "--usd", positive=False)
        period = parse_budget_period(options["period"], "--period")
        alert_at = parse_percent(options["alert_at"], "--alert-at") if options["alert_at"] is not None else None
        webhook = checked(options["webhook"], validate_webhook, "--webhook") if options["webhook"] is not None else None
        if limit == 0:
            for flag, value in (("--alert-at", alert_at), ("--webhook", webhook)):
                if value is not None:
                    raise CommandError(f"{flag} does not apply with --usd 0, which removes the budget")
        if options["key"] is not None:
            key = find_key(options["key"])
            tenant = key.tenant
        else:
            key, tenant = None, find_tenant(options["tenant"], "--tenant")

        if limit == 0:
            self._remove(tenant, key, period)
            return
        if key is not None and key.revoked:
            raise CommandError(f"--key: key {key.prefix} is revoked")
        self._set(tenant, key, period, limit, alert_at, webhook)

    def _remove(self, tenant: Tenant, key: ApiKey | None, period: str) -> None:
        with transaction.atomic():
            budget = (Budget.objects.select_for_update(of=("self",)).select_related("tenant", "api_key")
                      .filter(tenant=tenant, api_key=key, period=period).defer("webhook_secret").first())
            if budget is None:
                raise CommandError(f"--period: {scope_name(tenant, key)} has no {period} budget to remove")
            audit.deleted(budget)
            budget.delete()
        self.stdout.write(f"removed the {period} budget of {scope_name(tenant, key)}")

    def _set(self, tenant: Tenant, key: ApiKey | None, period: str, limit: Decimal, alert_at: int | None,
             webhook: str | None) -> None:
        changes: dict[str, object] = {"limit_usd": limit}
        if alert_at is not None:
            changes["alert_at_pct"] = alert_at
        secret = None
        if webhook is not None:
            secret = secrets.token_urlsafe(32)
            changes |= {"webhook_url": webhook, "webhook_secret": secret}
        with transaction.atomic():
            before = (Budget.objects.select_for_update().filter(tenant=tenant, api_key=key, period=period)
                      .defer("webhook_secret").first())
            # Locks the row it changes, and takes a budget made meanwhile for the one to change.
            budget, created = Budget.objects.update_or_create(tenant=tenant, api_key=key, period=period,
                                                              defaults=changes)
            if created:
                audit.added(budget)
            else:
                # A fresh webhook secret is a change even where the URL is the same.
                audit.changed(budget, [FIELD_LABELS[field] for field, value in changes.items()
                                       if before is None or field == "webhook_secret"
                                       or getattr(before, field) != value])
        window = window_at(period, timezone.now())
        ends = f"until {utc_iso(window.end)}" if window.end is not None else "for ever"
        self.stdout.write(
            f"{'set' if created else 'changed'} the {describe(period)} ({period}) budget of {scope_name(tenant, key)}: "
            f"{usd_text(budget.limit_usd)} USD per window; this window from {utc_iso(window.start)} {ends}"
        )
        self.stdout.write(f"alert at: {f'{budget.alert_at_pct}%' if budget.alert_at_pct else 'none'}; "
                          f"webhook: {budget.webhook_url or 'none (alerts recorded, not posted)'}")
        self.stdout.write("in force on every gateway process within 10 s")
        if secret is not None:
            self.stdout.write("webhook signing secret (HMAC-SHA256 key; shown once, stored encrypted):")
            self.stdout.write(secret)
