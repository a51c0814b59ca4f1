"""checkledger: prove the ledger consistent (billing.checks), or list what is
wrong and exit 1."""

from __future__ import annotations

from django.core.management.base import CommandError

from billing.checks import ledger_problems
from billing.models import LedgerEntry
from core.commands import OperatorCommand
from tenants.models import Tenant


class Command(OperatorCommand):
    help = "Verify every balance against its ledger entries and one charge per settled request log."

    def handle(self, *args, **options) -> None:
        problems = ledger_problems()
        if problems:
            for problem in problems:
                self.stderr.write(problem)
            raise CommandError(f"ledger check failed: {len(problems)} problem(s)")
        self.stdout.write(f"ok: {Tenant.objects.count()} tenants, {LedgerEntry.objects.count()} entries checked")
