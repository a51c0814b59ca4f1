"""Operator admin for upstream channels.

The provider secret is write-only (channels_pool.forms.ChannelForm): no admin
page ever renders it, a blank field on edit keeps the stored one, and a new
base URL needs it typed again. The form shows the settings of the chosen
kind (its change form's script). Every change is in the admin log
(hopbase.audit), the actions' too.

"Test channel" (an action, and a button on a channel's page) sends the
channel one small request (channels_pool.probe) and tells the operator its
status, latency and the provider's error text; only staff who may change
channels may, since it spends the channel's credentials.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse

from channels_pool.forms import ChannelForm
from channels_pool.models import Channel, ChannelHealth
from channels_pool.probe import ProbeResult, probe_channels
from core.encryption import Unreadable


class ChannelHealthInline(admin.StackedInline):
    model = ChannelHealth
    can_delete = False
    extra = 0
    max_num = 1
    fields = readonly_fields = (
        "state", "recent_success_pct", "successes", "failures", "consecutive_failures", "last_error_kind",
        "last_error", "median_ttft_ms", "open_until", "changed_at",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # written by the relay, not by hand

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    form = ChannelForm
    change_form_template = "admin/channels_pool/channel/change_form.html"
    # Fits a laptop screen (1440 px, tests/processes/test_admin_browser.py): what a
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
    actions = ("enable_channels", "disable_channels", "test_channels")

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        # Nothing is stored yet to remove (ChannelForm drops the field too).
        return [f for f in fields if f != "clear_secret"] if obj is None else fields

    @admin.display(description="models")
    def models(self, channel: Channel) -> str:
        return ", ".join(channel.served_models)

    @admin.display(description="health")
    def health_state(self, channel: Channel) -> str:
        if isinstance(channel.secret, Unreadable):
            return "broken: secret unreadable (skipped; enter it again)"
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

    @admin.action(description="Test selected channels", permissions=["change"])
    def test_channels(self, request, queryset) -> None:
        self._report(request, probe_channels(list(queryset.select_related(None))))

    def get_urls(self):
        test = path(
            "<path:object_id>/test/", self.admin_site.admin_view(self.test_view), name="channels_pool_channel_test",
        )
        return [test, *super().get_urls()]

    def test_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The change page's "Test channel" button: a POST, as it sends a request on the channel's account."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        channel = self.get_object(request, unquote(object_id))
        if channel is None:
            raise Http404("No such channel")
        if not self.has_change_permission(request, channel):
            raise PermissionDenied
        self._report(request, probe_channels([channel]))
        return HttpResponseRedirect(reverse("admin:channels_pool_channel_change", args=[channel.pk]))

    @staticmethod
    def _report(request: HttpRequest, results: list[ProbeResult]) -> None:
        for result in results:
            (messages.success if result.ok else messages.error)(request, result.summary())

    def _switch(self, request, queryset, enabled: bool) -> int:
        """Switch the channels that are not so yet, each change in the admin log."""
        channels = list(queryset.exclude(enabled=enabled).select_related(None).only("pk", "name"))
        count = Channel.objects.filter(pk__in=[c.pk for c in channels]).update(enabled=enabled)
        for channel in channels:
            self.log_change(request, channel, "Enabled." if enabled else "Disabled.")
        return count
