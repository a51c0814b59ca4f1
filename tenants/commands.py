"""A tenant named in an operator command's arguments (core.commands checks the rest)."""

from __future__ import annotations

from django.core.management.base import CommandError

from tenants.models import Tenant


def find_tenant(name: str, flag: str | None = None) -> Tenant:
    """The tenant named ``name``; the refusal names ``flag`` when the name came from one."""
    try:
        return Tenant.objects.get(name=name)
    except Tenant.DoesNotExist:
        raise CommandError(f"{flag + ': ' if flag else ''}unknown tenant {name!r}") from None
