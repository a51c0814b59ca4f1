"""Who may see a console page (K1, K3, K4).

``console_login_required`` sends anonymous visitors to the sign-in page and
gives a signed-in user without a membership (a staff user, say) a 404: the
console has nothing of theirs. The view receives the membership, so every
query it makes starts from ``membership.tenant`` and another tenant's id
finds nothing (a 404), never that tenant's row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse

from console.models import TenantMembership

P = ParamSpec("P")
View = Callable[Concatenate[HttpRequest, TenantMembership, P], HttpResponse]


def membership_of(request: HttpRequest) -> TenantMembership | None:
    if not request.user.is_authenticated or not request.user.is_active:
        return None
    return TenantMembership.objects.select_related("tenant", "user").filter(user_id=request.user.pk).first()


def console_login_required(view: View[P]) -> Callable[Concatenate[HttpRequest, P], HttpResponse]:
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("console:login"))
        membership = membership_of(request)
        if membership is None:
            raise Http404("No console account")
        response = view(request, membership, *args, **kwargs)
        # Pages of one tenant's money and keys: never kept by a shared cache or the browser's history.
        response.setdefault("Cache-Control", "private, no-store")
        return response

    return wrapped


def owner_only(membership: TenantMembership) -> None:
    """A member's (crafted) POST to an owner's action is refused before anything is looked up."""
    if not membership.is_owner:
        raise PermissionDenied("Only the tenant's owners may change keys.")


