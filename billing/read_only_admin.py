"""The admin of records nobody edits (request logs, the ledger, budget
alerts, the admin's own change log): read-only for everyone, and listed
without counting every row of a table that only grows."""

from __future__ import annotations

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property


class EstimatedCountPaginator(Paginator):
    """An unfiltered list of a big PostgreSQL table takes the planner's row
    estimate instead of COUNT(*), which reads the whole table. Filtered lists
    (the usual way to look for something) get an exact count."""

    # Below this an exact count is cheap, and an estimate could be visibly off.
    estimate_above = 10_000

    @cached_property
    def count(self) -> int:
        query = self.object_list.query
        connection = connections[self.object_list.db]
        if not query.where and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE relname = %s", [query.model._meta.db_table]
                )
                row = cursor.fetchone()
            # -1 or 0 until the table has been vacuumed or analysed.
            if row and row[0] > self.estimate_above:
                return int(row[0])
        return super().count


class ReadOnlyAdmin(admin.ModelAdmin):
    paginator = EstimatedCountPaginator
    show_full_result_count = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
