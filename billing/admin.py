"""Operator admin for prices, request logs and the ledger (B7).

History is never rewritten here: a price row, once saved, is read-only (a new
price is a new row), and request logs and ledger entries are view-only.
Request logs and ledger entries grow with traffic, so their lists avoid
whole-table counts (EstimatedCountPaginator) and join their foreign keys in
the list query.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.paginator import Paginator
from django.db import connections
from django.utils import timezone
from django.utils.functional import cached_property

from billing.exports import usd_text
from billing.models import LedgerEntry, ModelPrice, RequestLog
from hopbase.forms import parse_model_names

PRICE_FIELDS = (
    "input_usd_per_mtok", "output_usd_per_mtok", "cache_read_usd_per_mtok", "cache_write_usd_per_mtok",
)


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


class ModelPriceForm(forms.ModelForm):
    effective_from = forms.SplitDateTimeField(
        required=False,
        widget=AdminSplitDateTime,
        help_text="Leave empty for now. A moment in the past is refused: it would reprice earlier requests.",
    )

    class Meta:
        model = ModelPrice
        fields = ["model", *PRICE_FIELDS, "effective_from"]

    def clean_model(self) -> str:
        names = parse_model_names(self.cleaned_data["model"])
        if len(names) != 1:
            raise forms.ValidationError("Enter one model name.")
        return names[0]

    def clean_effective_from(self):
        moment = self.cleaned_data["effective_from"]
        if moment is None:
            return timezone.now()
        if moment < timezone.now():
            raise forms.ValidationError("This moment has passed; leave the field empty for now.")
        return moment


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    form = ModelPriceForm
    list_display = ("model", "input_usd_per_mtok", "output_usd_per_mtok", "cache_read_usd_per_mtok",
                    "cache_write_usd_per_mtok", "effective_from")
    list_filter = ("model",)
    search_fields = ("model",)
    date_hierarchy = "effective_from"

    def has_change_permission(self, request, obj=None) -> bool:
        # The list is reachable (obj is None); a saved row cannot be edited.
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a mistake is corrected by a newer row

    def get_readonly_fields(self, request, obj=None):
        return ("model", *PRICE_FIELDS, "effective_from") if obj is not None else ()


@admin.register(RequestLog)
class RequestLogAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at", "tenant", "key_prefix", "model", "channel", "protocol", "stream", "status",
        "tokens", "usage_estimated", "ttft_ms", "duration_ms", "charge", "settled",
    )
    list_filter = ("status", "protocol", "created_at", "stream", "usage_estimated")
    list_select_related = ("tenant", "api_key", "channel")
    search_fields = ("=request_id",)
    search_help_text = "Exact request id (the x-hopbase-request-id header)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")

    @admin.display(description="key", ordering="api_key__prefix")
    def key_prefix(self, log: RequestLog) -> str:
        return log.api_key.prefix if log.api_key is not None else "-"

    @admin.display(description="tokens in / out / cache r / cache w")
    def tokens(self, log: RequestLog) -> str:
        return f"{log.input_tokens} / {log.output_tokens} / {log.cache_read_tokens} / {log.cache_write_tokens}"

    @admin.display(description="charge (USD)", ordering="charge_usd")
    def charge(self, log: RequestLog) -> str:
        return usd_text(log.charge_usd) if log.charge_usd is not None else "-"

    @admin.display(description="settled", boolean=True, ordering="settled_at")
    def settled(self, log: RequestLog) -> bool:
        return log.settled_at is not None


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "tenant", "kind", "amount", "balance_after", "request", "note")
    list_filter = ("kind", "created_at")
    list_select_related = ("tenant", "request_log")
    search_fields = ("tenant__name", "=request_log__request_id")
    date_hierarchy = "created_at"

    @admin.display(description="amount (USD)", ordering="amount_usd")
    def amount(self, entry: LedgerEntry) -> str:
        return usd_text(entry.amount_usd)

    @admin.display(description="balance after (USD)")
    def balance_after(self, entry: LedgerEntry) -> str:
        return usd_text(entry.balance_after_usd)

    @admin.display(description="request")
    def request(self, entry: LedgerEntry) -> str:
        return entry.request_log.request_id if entry.request_log is not None else ""
