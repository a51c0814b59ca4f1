"""Budget alerts in the admin (G4): each event as it was sent, and every
delivery attempt under it. Read-only for everyone: an alert is a record of
what HopBase did, never edited by hand. Operators and finance see them
(billing.view_budgetalert and billing.view_webhookattempt, tenants.roles).
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Count
from django.http import HttpRequest
from django.utils.html import format_html

from billing.models import BudgetAlert, WebhookAttempt
from billing.read_only_admin import ReadOnlyAdmin


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    fields = ("attempted_at", "answer", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("attempted_at", "id")  # in the order they were made

    def has_add_permission(self, request: HttpRequest, obj: BudgetAlert | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: BudgetAlert | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: BudgetAlert | None = None) -> bool:
        return False

    @admin.display(description="answer")
    def answer(self, attempt: WebhookAttempt) -> str:
        if attempt.status_code is not None:
            return f"HTTP {attempt.status_code}"
        return "in flight" if not attempt.error else "none"


class DeliveredFilter(admin.SimpleListFilter):
    title = "delivered"
    parameter_name = "delivered"

    def lookups(self, request, model_admin):
        return [("yes", "Delivered"), ("no", "Not (yet)"), ("none", "No webhook")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(delivered_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(delivered_at__isnull=True).exclude(budget__webhook_url="")
        if self.value() == "none":
            return queryset.filter(budget__webhook_url="")
        return queryset


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "type", "budget_name", "window_start", "delivery", "attempt_count")
    list_filter = ("type", DeliveredFilter, "created_at")
    list_select_related = ("budget__tenant", "budget__api_key")
    search_fields = ("=id", "budget__tenant__name", "=budget__api_key__prefix")
    search_help_text = "Exact event id, tenant name, or exact key prefix."
    date_hierarchy = "created_at"
    fields = ("id", "type", "budget", "window_start", "created_at", "delivered_at", "event")
    readonly_fields = fields
    inlines = (WebhookAttemptInline,)

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(attempt_total=Count("attempts"))

    @admin.display(description="budget", ordering="budget__tenant__name")
    def budget_name(self, alert: BudgetAlert) -> str:
        return str(alert.budget)

    @admin.display(description="delivered", ordering="delivered_at")
    def delivery(self, alert: BudgetAlert) -> str:
        if alert.delivered_at is not None:
            return f"{alert.delivered_at:%Y-%m-%d %H:%M:%S}"
        return "no webhook" if not alert.budget.webhook_url else "not yet"

    @admin.display(description="attempts", ordering="attempt_total")
    def attempt_count(self, alert: BudgetAlert) -> int:
        return alert.attempt_total

    @admin.display(description="event (as sent)")
    def event(self, alert: BudgetAlert) -> str:
        # The exact bytes sent and signed, not a re-encoding of them.
        return format_html("<pre>{}</pre>", alert.body)
