"""Keys an owner manages from the console (K3): create within what the
operator allowed the tenant, show the secret once, revoke. Each change is
written with its audit row (Django's admin log, which operators read in the
admin as hopbase.audit) in one transaction, naming the console user; never
the secret.

What the tenant may use: the models some enabled channel serves that the
tenant's live keys may use. The operator gives a tenant its models through
the keys they issue it; a live key allowing every model (an empty list)
allows the tenant every served model. A key made here can only narrow that,
so making keys never widens it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from channels_pool.models import Channel
from console.models import TenantMembership
from hopbase.models import ApiKey, Tenant

LABEL_MAX_LENGTH = ApiKey._meta.get_field("label").max_length


class KeyRefused(ValueError):
    """A key the owner may not make, with the message the page shows."""


@dataclass(frozen=True)
class Allowance:
    models: list[str]  # sorted
    every_model: bool  # some live key of the tenant may use every served model


def allowance(tenant: Tenant) -> Allowance:
    served: set[str] = set()
    for channel in Channel.objects.enabled().only("served_models"):
        served.update(channel.model_map())
    lists = list(ApiKey.objects.filter(tenant=tenant).active().unexpired().values_list("allowed_models", flat=True))
    if not lists or any(not allowed for allowed in lists):
        return Allowance(sorted(served), every_model=True)
    allowed = {model for models in lists for model in models}
    return Allowance(sorted(served & allowed), every_model=False)


def requested_models(values: list[str]) -> list[str]:
    """The form's ``models``: a comma list, or one value per checkbox, or both."""
    seen: dict[str, None] = {}
    for value in values:
        for name in value.split(","):
            if name.strip():
                seen[name.strip()] = None
    return list(seen)


def create_key(membership: TenantMembership, label: str, models: list[str]) -> tuple[ApiKey, str]:
    """A new key of the owner's tenant and its secret (returned once, never stored)."""
    label = label.strip()
    if len(label) > LABEL_MAX_LENGTH:
        raise KeyRefused(f"The name is longer than {LABEL_MAX_LENGTH} characters.")
    allowed = allowance(membership.tenant)
    beyond = [model for model in models if model not in allowed.models]
    if beyond:
        raise KeyRefused(f"Not a model this tenant may use: {', '.join(beyond)}.")
    if not models and not allowed.every_model:
        # "All" for this tenant is its allowance, spelled out, never the gateway's every model.
        models = allowed.models
        if not models:
            raise KeyRefused("This tenant may use no model yet; ask your operator.")
    with transaction.atomic():
        key, secret = ApiKey.objects.issue(membership.tenant, label=label, allowed_models=models)
        audit(membership.user, key, ADDITION,
              f"Created from the tenant console; models: {', '.join(models) or 'all the tenant may use'}.")
    return key, secret


def revoke_key(membership: TenantMembership, key_id: int) -> ApiKey | None:
    """Revoke one of the tenant's keys; None if the tenant has no such key."""
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().filter(tenant=membership.tenant, pk=key_id).first()
        if key is None:
            return None
        if not key.revoked:
            key.revoke()
            audit(membership.user, key, CHANGE, "Revoked from the tenant console.")
    return key


def audit(user: AbstractBaseUser, key: ApiKey, flag: int, message: str) -> None:
    LogEntry.objects.log_actions(user.pk, [key], flag, message, single_object=True)


def tenant_keys(tenant: Tenant) -> list[ApiKey]:
    return list(ApiKey.objects.filter(tenant=tenant).order_by("revoked_at", "-created_at", "-id"))

