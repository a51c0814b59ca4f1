"""createtenant NAME [--balance USD]: a new tenant, optionally funded.

An opening balance is a top-up ledger entry, never a bare balance, so the
balance still equals the sum of the tenant's entries (checkledger). The
admin log has the tenant's addition, and its opening top-up's, by the OS
user (core.audit).
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from billing.ledger import top_up
from core import audit
from core.commands import OperatorCommand, parse_name, parse_usd
from core.money import usd_text
from tenants.models import Tenant


class Command(OperatorCommand):
    help = "Create a tenant, optionally with an opening top-up."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="Unique tenant name")
        parser.add_argument("--balance", metavar="USD", help="Opening top-up in USD (exact decimal; 0 = none)")

    def handle(self, *args, name: str, balance: str | None, **options) -> None:
        name = parse_name(name, "tenant name", Tenant._meta.get_field("name").max_length)
        amount = parse_usd(balance, "--balance", positive=False) if balance is not None else None
        if Tenant.objects.filter(name=name).exists():
            raise CommandError(f"a tenant named {name!r} already exists")
        try:
            with transaction.atomic():
                tenant = Tenant.objects.create(name=name)
                opening = top_up(tenant, amount, note="opening balance") if amount else None
                audit.added(tenant, [("ledger entry", f"#{opening.pk}: {usd_text(amount)} USD opening balance")]
                            if opening is not None else [])
        except IntegrityError:  # created by someone else since the check above
            raise CommandError(f"a tenant named {name!r} already exists") from None
        tenant.refresh_from_db(fields=["balance_usd"])
        self.stdout.write(f"created tenant {tenant.name} (id {tenant.pk}), balance {usd_text(tenant.balance_usd)} USD")
