"""People of a tenant (rule K1): a Django user who signs in to the console
at ``/console/`` as an ``owner`` or a ``member`` of exactly one tenant.

The user's username is their email, lower-cased (console.members), so
Django's own unique username makes an email sign in to one person only.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from hopbase.models import Tenant


class Role(models.TextChoices):
    OWNER = "owner"  # manages the tenant's keys
    MEMBER = "member"  # reads everything, changes nothing


class TenantMembership(models.Model):
    Role = Role

    # One tenant per person: a page never has to ask which tenant it shows.
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="memberships")
    role = models.CharField(max_length=8, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["tenant__name", "user__username"]
        constraints = [
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_known"),
        ]

    def __str__(self) -> str:
        return f"{self.user.get_username()} ({self.role} of {self.tenant.name})"

    @property
    def is_owner(self) -> bool:
        return self.role == Role.OWNER
