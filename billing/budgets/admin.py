"""The admin's budgets (rule G6): each budget's current window, what it has
spent and what requests in flight hold reserved in it, against its limit,
with a bar. Operators add, change and delete budgets; finance reads them
(tenants.roles).

A budget's scope and period are fixed once it exists (another scope or
period is another budget). Its webhook, and the signing secret that goes
with it, are set by ``setbudget … --webhook URL``, which shows the secret
once: the admin shows neither the secret nor a way to set one, since a page
or a message cookie would keep it.

The list computes spend for the whole page in one query
(billing.budgets.status), so its query count does not grow with its rows.
"""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.utils import timezone
from django.utils.html import format_html

from billing.budgets.status import Standing, standings
from billing.budgets.windows import BadPeriod, Window, parse_period
from billing.models import Budget
from core.money import usd_text

# Where the bar turns from green to amber when the budget has no alert threshold of its own.
DEFAULT_WARNING_PCT = 80


class BudgetForm(forms.ModelForm):
    limit_usd = forms.DecimalField(label="Limit (USD)", max_digits=20, decimal_places=10, min_value=Decimal(0),
                                   help_text="Per window. A request that does not fit is refused (429).")
    alert_at_pct = forms.IntegerField(label="Alert at (%)", min_value=1, max_value=100, required=False,
                                      help_text="Alert when this percent of the limit is spent; empty: no threshold.")

    class Meta:
        model = Budget
        fields = ["tenant", "api_key", "period", "limit_usd", "alert_at_pct"]

    def clean_period(self) -> str:
        try:
            return parse_period(self.cleaned_data["period"])
        except BadPeriod as error:
            raise forms.ValidationError(str(error)) from None

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.instance.pk is not None:
            return cleaned  # scope and period are read-only once the budget exists
        tenant, key, period = cleaned.get("tenant"), cleaned.get("api_key"), cleaned.get("period")
        if tenant is not None and key is not None and key.tenant_id != tenant.pk:
            self.add_error("api_key", f"Key {key.prefix} is not one of {tenant.name}'s.")
        elif tenant is not None and period and Budget.objects.filter(tenant=tenant, api_key=key,
                                                                    period=period).exists():
            scope = f"Key {key.prefix}" if key is not None else f"Tenant {tenant.name}"
            self.add_error("period", f"{scope} already has a {period} budget: change that one.")
        return cleaned


class StandingChangeList(ChangeList):
    """The page's budgets with their standings, computed together."""

    def get_results(self, request) -> None:
        super().get_results(request)
        page = list(self.result_list)
        for standing in standings(page, timezone.now()):
            standing.budget.standing = standing
        self.result_list = page


class ScopeFilter(admin.SimpleListFilter):
    title = "scope"
    parameter_name = "scope"

    def lookups(self, request, model_admin):
        return [("tenant", "Tenant"), ("key", "Key")]

    def queryset(self, request, queryset):
        if self.value() in ("tenant", "key"):
            return queryset.filter(api_key__isnull=self.value() == "tenant")
        return queryset


def standing_of(budget: Budget) -> Standing:
    """The standing the list computed, or, on the budget's own page, its own."""
    found = getattr(budget, "standing", None)
    if found is None:
        found = budget.standing = next(standings([budget], timezone.now()))
    return found


def window_text(window: Window) -> str:
    if window.end is None:
        return "all time (total)"
    # Seconds only where a window in seconds needs them.
    moment = "%Y-%m-%d %H:%M:%S" if window.start.second or window.end.second else "%Y-%m-%d %H:%M"
    return f"{window.start:{moment}} → {window.end:{moment}} UTC"


def percent_of(amount: Decimal, limit: Decimal) -> Decimal:
    if limit <= 0:
        return Decimal(100) if amount > 0 else Decimal(0)
    return min(Decimal(100), amount * 100 / limit)


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    form = BudgetForm
    list_display = ("scope_label", "tenant", "key", "period", "window", "spent", "reserved", "limit", "bar")
    list_display_links = ("scope_label",)
    list_filter = (ScopeFilter, "period")
    list_select_related = ("tenant", "api_key")
    search_fields = ("tenant__name", "api_key__prefix")
    search_help_text = "Tenant name or key prefix."
    autocomplete_fields = ("tenant", "api_key")
    # A page's spend is one query (StandingChangeList): "show all" stays one page of it.
    list_per_page = list_max_show_all = 100
    show_full_result_count = False

    def get_queryset(self, request):
        # The webhook's secret is neither shown nor decrypted here.
        return super().get_queryset(request).defer("webhook_secret")

    def get_changelist(self, request, **kwargs):
        return StandingChangeList

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant", "api_key", "period", "limit_usd", "alert_at_pct")
        return ("tenant", "api_key", "period", "limit_usd", "alert_at_pct", "webhook", "window", "spent",
                "reserved", "bar", "updated_at")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("tenant", "api_key", "period", "webhook", "window", "spent", "reserved", "bar", "updated_at")

    def save_model(self, request, obj: Budget, form, change: bool) -> None:
        if change:
            # Only what the form edits: the webhook's secret is setbudget's.
            obj.save(update_fields=["limit_usd", "alert_at_pct", "updated_at"])
        else:
            super().save_model(request, obj, form, change)

    @admin.display(description="scope", ordering="api_key")
    def scope_label(self, budget: Budget) -> str:
        return budget.scope

    @admin.display(description="key", ordering="api_key__prefix")
    def key(self, budget: Budget) -> str:
        return budget.api_key.prefix if budget.api_key_id is not None else "-"

    @admin.display(description="current window")
    def window(self, budget: Budget) -> str:
        return window_text(standing_of(budget).window)

    @admin.display(description="spent (USD)")
    def spent(self, budget: Budget) -> str:
        return usd_text(standing_of(budget).spent_usd)

    @admin.display(description="reserved (USD)")
    def reserved(self, budget: Budget) -> str:
        reserved = standing_of(budget).reserved_usd
        return usd_text(reserved) if reserved is not None else "unknown (Redis did not answer)"

    @admin.display(description="limit (USD)", ordering="limit_usd")
    def limit(self, budget: Budget) -> str:
        return usd_text(budget.limit_usd)

    @admin.display(description="webhook")
    def webhook(self, budget: Budget) -> str:
        if not budget.webhook_url:
            return "none: alerts are recorded, not posted (setbudget … --webhook URL sets one)"
        return f"{budget.webhook_url} (signed; setbudget … --webhook URL makes a new secret)"

    @admin.display(description="used")
    def bar(self, budget: Budget) -> str:
        """Spent, then reserved, as parts of the limit: green, amber from the
        alert threshold, red when full."""
        standing = standing_of(budget)
        spent = percent_of(standing.spent_usd, budget.limit_usd)
        reserved = min(100 - spent, percent_of(standing.reserved_usd or Decimal(0), budget.limit_usd))
        warning = budget.alert_at_pct or DEFAULT_WARNING_PCT
        colour = "#ba2121" if spent + reserved >= 100 else "#d08a00" if spent >= warning else "#417900"
        return format_html(
            '<span class="budget-bar" title="{}% spent, {}% reserved" style="display:inline-flex;width:8em;'
            'height:0.8em;vertical-align:middle;background:#ddd;border-radius:2px;overflow:hidden">'
            '<span style="width:{}%;background:{}"></span><span style="width:{}%;background:#9bb7d4"></span>'
            "</span> {}%",
            f"{spent:.1f}", f"{reserved:.1f}", f"{spent:.2f}", colour, f"{reserved:.2f}", f"{spent + reserved:.0f}",
        )
