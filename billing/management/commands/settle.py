"""settle: settle every logged request not yet in the ledger.

Settlement (billing.tasks) is a separate piece of work that has not landed.
Until it does, this command says so and exits with status 2 rather than
pretend: a script that relies on it must not believe its requests are billed.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Settle every logged request not yet in the ledger (not implemented yet)."

    def handle(self, *args, **options) -> None:
        raise CommandError("settlement is not implemented yet; nothing was settled", returncode=2)
