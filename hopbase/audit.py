"""Who changed what: Django's admin log (LogEntry), read-only in the admin.

Every change made through the admin's forms is logged by Django itself with
the staff user who made it; the admin's own actions (a top-up, revoking
keys, enabling or disabling channels) log theirs with ``log_change``. Staff
with ``admin.view_logentry`` (operator and finance, tenants.roles) read it
here; nobody edits or deletes it through the admin.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.models import LogEntry

from billing.read_only_admin import ReadOnlyAdmin


@admin.register(LogEntry)
class LogEntryAdmin(ReadOnlyAdmin):
    list_display = ("action_time", "user", "content_type", "object_repr", "action", "change")
    list_filter = ("action_flag", ("user", admin.RelatedOnlyFieldListFilter), "content_type")
    list_select_related = ("user", "content_type")
    search_fields = ("object_repr", "change_message", "user__username")
    date_hierarchy = "action_time"
    ordering = ("-action_time", "-id")
    fields = ("action_time", "user", "content_type", "object_id", "object_repr", "action_flag", "change")
    readonly_fields = fields

    @admin.display(description="action", ordering="action_flag")
    def action(self, entry: LogEntry) -> str:
        return entry.get_action_flag_display()

    @admin.display(description="change")
    def change(self, entry: LogEntry) -> str:
        return entry.get_change_message()
