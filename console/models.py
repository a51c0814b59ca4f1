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

from tenants.models import Tenant


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


class InvitationQuerySet(models.QuerySet):
    def open(self) -> InvitationQuerySet:
        """Not accepted, not cancelled, not expired."""
        return self.filter(accepted_at__isnull=True, expires_at__gt=timezone.now())


class Invitation(models.Model):
    """A one-time link that makes its holder a person of the tenant (K1).
    Only a hash of the link's token is kept: a stolen table opens nothing."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invitations")
    email = models.CharField(max_length=150)
    role = models.CharField(max_length=8, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="invitations_sent")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()  # cancelling sets it to the moment of cancelling
    accepted_at = models.DateTimeField(null=True, blank=True)

    objects = InvitationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(role__in=Role.values), name="invitation_role_known"),
            models.CheckConstraint(condition=Q(token_hash__regex=r"^[0-9a-f]{64}$"), name="invitation_hash_is_sha256"),
        ]

    def __str__(self) -> str:
        return f"invitation of {self.email} as {self.role} of {self.tenant.name}"
