"""topup TENANT USD: credit a tenant through a ledger entry, logged in the
admin log as the admin's top-up is, by the OS user (core.audit)."""

from __future__ import annotations

from django.db import transaction

from billing.ledger import top_up, topped_up
from core import audit
from core.commands import OperatorCommand, parse_usd
from core.money import usd_text
from tenants.commands import find_tenant


class Command(OperatorCommand):
    help = "Credit a tenant's balance with a top-up ledger entry."

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")
        parser.add_argument("usd", metavar="USD", help="Amount in USD (exact decimal, more than zero)")

    def handle(self, *args, tenant: str, usd: str, **options) -> None:
        amount = parse_usd(usd, "USD")
        owner = find_tenant(tenant)
        with transaction.atomic():
            entry = top_up(owner, amount, note="top-up (topup command)")
            audit.acted([owner], topped_up(entry))
        self.stdout.write(
            f"topped up {owner.name} by {usd_text(amount)} USD (entry #{entry.pk}); "
            f"balance {usd_text(entry.balance_after_usd)} USD"
        )
