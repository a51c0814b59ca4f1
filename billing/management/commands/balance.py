"""balance TENANT: the tenant's exact balance in USD, alone on the last line.

Printed by ``core.money.usd_text``: every significant digit, at least two
decimals, no exponent (12.5000000000 -> 12.50, 0.0001230000 -> 0.000123), so
a script can read it with ``Decimal`` and lose nothing.
"""

from __future__ import annotations

from core.commands import OperatorCommand
from core.money import usd_text
from tenants.commands import find_tenant


class Command(OperatorCommand):
    help = "Print a tenant's exact balance in USD."

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="Tenant name")

    def handle(self, *args, tenant: str, **options) -> None:
        self.stdout.write(usd_text(find_tenant(tenant).balance_usd))
