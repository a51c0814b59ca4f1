"""Operator admin for prices, request logs and the ledger (B7).

History is never rewritten here: a price row, once saved, is read-only (a new
price is a new row), and request logs and ledger entries are view-only.
Request logs and ledger entries grow with traffic, so their lists avoid
whole-table counts (EstimatedCountPaginator), join their foreign keys in
the list query, and offer filters whose choices come from small tables
(tenants, channels, prices) or fixed lists, never a DISTINCT over the logs.

Budgets have their own module (billing.budgets.admin).

The request-log list exports what it shows: its "Export CSV" / "Export
JSONL" buttons stream the currently filtered rows (billing.exports), and two
actions export the selected ones.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.widgets import AdminSplitDateTime
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from billing.budgets import admin as admin_budgets  # noqa: F401  (registers the budgets' admin)
from billing.budgets import admin_alerts  # noqa: F401  (registers the budget alerts' admin)
from billing.exports import CONTENT_TYPES, ENCODERS, export_rows, for_export, streamed
from billing.models import LedgerEntry, ModelPrice, RequestLog
from billing.read_only_admin import ReadOnlyAdmin
from core.model_names import parse_model_names
from core.money import usd_text
from core.vocabulary import ApiName

PRICE_FIELDS = (
    "input_usd_per_mtok", "output_usd_per_mtok", "cache_read_usd_per_mtok", "cache_write_usd_per_mtok",
)


class ModelPriceForm(forms.ModelForm):
    effective_from = forms.SplitDateTimeField(
        required=False,
        widget=AdminSplitDateTime,
        help_text="Leave empty for now. A moment in the past is refused: it would reprice earlier requests.",
    )

    class Meta:
        model = ModelPrice
        fields = ["model", *PRICE_FIELDS, "max_output_tokens", "extras", "effective_from"]
        help_texts = {"extras": 'Surcharges allowed on this model (rule B10), each a multiplier of the token '
                                'charge, e.g. {"service_tier:priority": "2", "tool:web_search": "1.2"}. '
                                'A request switching on a surcharge not named here is refused.'}

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
                    "cache_write_usd_per_mtok", "max_output_tokens", "effective_from")
    list_filter = ("model",)
    search_fields = ("model",)
    date_hierarchy = "effective_from"

    def has_change_permission(self, request, obj=None) -> bool:
        # The list is reachable (obj is None); a saved row cannot be edited.
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a mistake is corrected by a newer row

    def get_readonly_fields(self, request, obj=None):
        return ("model", *PRICE_FIELDS, "max_output_tokens", "extras", "effective_from") if obj is not None else ()


class ModelFilter(admin.SimpleListFilter):
    """Models that have a price (a small table), not a DISTINCT over logs."""

    title = "model"
    parameter_name = "model"

    def lookups(self, request, model_admin):
        names = ModelPrice.objects.order_by("model").values_list("model", flat=True).distinct()
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        return queryset.filter(model=self.value()) if self.value() else queryset


class ProtocolFilter(admin.SimpleListFilter):
    title = "protocol"
    parameter_name = "protocol"

    def lookups(self, request, model_admin):
        return [(name.value, name.value) for name in ApiName]

    def queryset(self, request, queryset):
        return queryset.filter(protocol=self.value()) if self.value() else queryset


class SettledFilter(admin.SimpleListFilter):
    title = "settled"
    parameter_name = "settled"

    def lookups(self, request, model_admin):
        return [("yes", "In the ledger"), ("no", "Not yet")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(settled_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(settled_at__isnull=True)
        return queryset


def export_response(logs: QuerySet[RequestLog], fmt: str) -> StreamingHttpResponse:
    """The logs as a streamed download (async iterator: see exports.streamed)."""
    lines = ENCODERS[fmt](export_rows(for_export(logs)))
    response = StreamingHttpResponse(streamed(lines), content_type=CONTENT_TYPES[fmt])
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="billing-{stamp}.{fmt}"'
    return response


@admin.register(RequestLog)
class RequestLogAdmin(ReadOnlyAdmin):
    # What an operator scans a list for, narrow enough for a laptop screen
    # (1440 px, tests/processes/test_admin_browser.py); the rest is on the row's page.
    list_display = (
        "when", "tenant_key", "model", "channel_tried", "outcome", "ttft", "duration", "tokens", "charge", "settled",
    )
    list_display_links = ("when",)
    list_filter = (
        "status", ("tenant", admin.RelatedFieldListFilter), ModelFilter, ("channel", admin.RelatedFieldListFilter),
        ProtocolFilter, "created_at", SettledFilter, "stream", "usage_estimated",
    )
    list_select_related = ("tenant", "api_key", "channel")
    search_fields = ("=request_id",)
    search_help_text = "Exact request id (the x-hopbase-request-id header)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")
    actions = ("export_selected_csv", "export_selected_jsonl")
    change_list_template = "admin/billing/requestlog/change_list.html"
    fieldsets = (
        ("Request", {"fields": ("request_id", "created_at", "tenant", "api_key", "model", "protocol", "endpoint",
                                "stream")}),
        ("Outcome", {"fields": ("status", "error_kind", "channel", "upstream_model", "provider_request_id",
                                "attempts", "upstream_status", "ttft_ms", "duration_ms")}),
        ("Usage and charge", {"fields": ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
                                         "thinking_tokens", "usage_estimated", "prompt_chars", "sent_chars",
                                         "price_multiplier", "extras", "charge_usd", "settled_at")}),
    )

    @admin.display(description="time (UTC)", ordering="created_at")
    def when(self, log: RequestLog) -> str:
        # The request id (on the row's page, and the search) as its tooltip.
        return format_html('<span title="{}">{}</span>', log.request_id, f"{log.created_at:%Y-%m-%d %H:%M:%S}")

    @admin.display(description="tenant / key", ordering="tenant__name")
    def tenant_key(self, log: RequestLog) -> str:
        prefix = log.api_key.prefix if log.api_key is not None else "-"
        return format_html('{}<br><span class="quiet">{}</span>', log.tenant.name, prefix)

    @admin.display(description="channel", ordering="channel__name")
    def channel_tried(self, log: RequestLog) -> str:
        """The channel that served the request, or for one that failed the
        last one tried; with the number of attempts when there was failover."""
        name = log.channel.name if log.channel is not None else "-"
        if log.attempts > 1:
            return format_html('{}<br><span class="quiet">{} attempts</span>', name, log.attempts)
        return name

    @admin.display(description="status", ordering="status")
    def outcome(self, log: RequestLog) -> str:
        if log.error_kind:
            return format_html('{}<br><span class="quiet">{}</span>', log.status, log.error_kind)
        return log.status

    @admin.display(description="TTFT ms", ordering="ttft_ms")
    def ttft(self, log: RequestLog) -> str:
        return str(log.ttft_ms) if log.ttft_ms is not None else "-"

    @admin.display(description="duration ms", ordering="duration_ms")
    def duration(self, log: RequestLog) -> str:
        return str(log.duration_ms)

    @admin.display(description="tokens in / out")
    def tokens(self, log: RequestLog) -> str:
        # ~: estimated (a stream cut short); cache tokens are on the row's page.
        return f"{'~' if log.usage_estimated else ''}{log.input_tokens} / {log.output_tokens}"

    @admin.display(description="charge (USD)", ordering="charge_usd")
    def charge(self, log: RequestLog) -> str:
        return usd_text(log.charge_usd) if log.charge_usd is not None else "-"

    @admin.display(description="settled", boolean=True, ordering="settled_at")
    def settled(self, log: RequestLog) -> bool:
        return log.settled_at is not None

    def get_urls(self):
        export = path(
            "export/<str:fmt>/",
            self.admin_site.admin_view(self.export_view),
            name="billing_requestlog_export",
        )
        return [export, *super().get_urls()]

    def export_view(self, request: HttpRequest, fmt: str) -> HttpResponse:
        """The rows the list shows with the same query string (filters,
        search, date drill-down), all of them, not one page."""
        if fmt not in ENCODERS:
            raise Http404("Unknown export format")
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("Unknown filter in the query string.")
        return export_response(changelist.get_queryset(request), fmt)

    @admin.action(description="Export selected as CSV", permissions=["view"])
    def export_selected_csv(self, request, queryset):
        return export_response(queryset, "csv")

    @admin.action(description="Export selected as JSONL", permissions=["view"])
    def export_selected_jsonl(self, request, queryset):
        return export_response(queryset, "jsonl")


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
