"""topup TENANT USD: credit a tenant through a ledger entry."""

from __future__ import annotations

from billing.ledger import top_up
from core.commands import OperatorCommand, find_tenant, parse_usd
from core.money import usd_text


class Command(OperatorCommand):
    help = "Credit a tenant's balance with a top-up ledger entry."

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")
        parser.add_argument("usd", metavar="USD", help="Amount in USD (exact decimal, more than zero)")

    def handle(self, *args, tenant: str, usd: str, **options) -> None:
        amount = parse_usd(usd, "USD")
        owner = find_tenant(tenant)
        entry = top_up(owner, amount, note="top-up (topup command)")
        self.stdout.write(
            f"topped up {owner.name} by {usd_text(amount)} USD (entry #{entry.pk}); "
            f"balance {usd_text(entry.balance_after_usd)} USD"
        )
