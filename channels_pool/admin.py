"""Operator admin for upstream channels.

The provider secret is write-only (channels_pool.forms.ChannelForm): no admin
page ever renders it, a blank field on edit keeps the stored one, and a new
base URL needs it typed again. Every change is in the admin log
(hopbase.audit), the actions' too.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import ObjectDoesNotExist

from channels_pool.forms import ChannelForm
from channels_pool.models import Channel, ChannelHealth


class ChannelHealthInline(admin.StackedInline):
    model = ChannelHealth
    can_delete = False
    extra = 0
    max_num = 1
    fields = readonly_fields = (
        "state", "recent_success_pct", "successes", "failures", "consecutive_failures", "last_error_kind",
        "median_ttft_ms", "open_until", "changed_at",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # written by the relay, not by hand

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    form = ChannelForm
    # Fits a laptop screen (1440 px, tests/test_admin_browser.py): what a
    # channel serves and how it is doing; its address, weight and limits
    # are on its page.
    list_display = (
        "name", "protocol", "models", "priority", "enabled", "health_state", "success_rate", "median_ttft",
        "last_error",
    )
    list_filter = ("protocol", "enabled")
    list_select_related = ("health",)
    search_fields = ("name", "base_url")
    readonly_fields = ("created_at",)
    inlines = (ChannelHealthInline,)
    actions = ("enable_channels", "disable_channels")

    @admin.display(description="models")
    def models(self, channel: Channel) -> str:
        return ", ".join(channel.served_models)

    @admin.display(description="health")
    def health_state(self, channel: Channel) -> str:
        health = self._health(channel)
        return health.get_state_display() if health is not None else "no record yet"

    @staticmethod
    def _health(channel: Channel) -> ChannelHealth | None:
        try:
            return channel.health
        except ObjectDoesNotExist:
            return None

    @admin.display(description="recent success")
    def success_rate(self, channel: Channel) -> str:
        health = self._health(channel)
        return "–" if health is None or health.recent_success_pct is None else f"{health.recent_success_pct}%"

    @admin.display(description="median TTFT")
    def median_ttft(self, channel: Channel) -> str:
        health = self._health(channel)
        return "–" if health is None or health.median_ttft_ms is None else f"{health.median_ttft_ms} ms"

    @admin.display(description="last error")
    def last_error(self, channel: Channel) -> str:
        health = self._health(channel)
        return health.last_error_kind if health is not None and health.last_error_kind else "–"

    @admin.action(description="Enable selected channels", permissions=["change"])
    def enable_channels(self, request, queryset) -> None:
        count = self._switch(request, queryset, enabled=True)
        messages.success(request, f"Enabled {count} channel(s).")

    @admin.action(description="Disable selected channels", permissions=["change"])
    def disable_channels(self, request, queryset) -> None:
        count = self._switch(request, queryset, enabled=False)
        messages.success(request, f"Disabled {count} channel(s).")

    def _switch(self, request, queryset, enabled: bool) -> int:
        """Switch the channels that are not so yet, each change in the admin log."""
        channels = list(queryset.exclude(enabled=enabled).select_related(None).only("pk", "name"))
        count = Channel.objects.filter(pk__in=[c.pk for c in channels]).update(enabled=enabled)
        for channel in channels:
            self.log_change(request, channel, "Enabled." if enabled else "Disabled.")
        return count
