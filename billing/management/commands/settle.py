"""settle: settle every logged request not yet in the ledger, now, in this
process (billing.settlement.sweep with no delay), and say how many.

Safe beside running workers: settlement is idempotent and row-locked. A log
whose model had no price when it was made stays unsettled; the count of
those goes to stderr and the command exits 1, so a script does not take an
unbilled request for a billed one.
"""

from __future__ import annotations

import datetime as dt

from django.core.management.base import CommandError

from billing.settlement import sweep
from core.commands import OperatorCommand


class Command(OperatorCommand):
    help = "Settle every logged request not yet in the ledger."

    def handle(self, *args, **options) -> None:
        result = sweep(older_than=dt.timedelta(0))
        self.stdout.write(f"settled {result.settled} request logs")
        if result.unpriced:
            raise CommandError(
                f"{result.unpriced} request logs have no price in force at the time they were made "
                "and stay unsettled"
            )
