"""The console's pages (K1–K4): each view reads its request, calls one
function of a console module and renders. Every page but the sign-in is
behind ``console_login_required`` and gets the signed-in membership."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import logout
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from billing.exports import CONTENT_TYPES, streamed
from console import connect as connect_snippets
from console import invitations, passwords
from console import keys as key_actions
from console import logs as log_pages
from console import statement as statements
from console.access import console_login_required, owner_only
from console.allowance import allowance as allowance_of
from console.filters import FilterError
from console.mail import configured as mail_configured
from console.members import MemberError, remove_member
from console.models import TenantMembership
from console.overview import overview as overview_of
from console.signin import SignInForm, sign_in
from core.vocabulary import RequestStatus


@require_http_methods(["GET", "POST"])
def login(request: HttpRequest) -> HttpResponse:
    form = SignInForm(request, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        sign_in(request, form.user)
        target = request.POST.get("next", "")
        safe = url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure())
        return redirect(target if safe and target.startswith("/console/") else reverse("console:overview"))
    return render(request, "console/login.html", {"form": form, "next": request.GET.get("next", "")},
                  status=400 if form.is_bound else 200)


@require_POST
def logout_view(request: HttpRequest) -> HttpResponse:
    logout(request)
    return redirect("console:login")


@require_GET
@console_login_required
def overview(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    summary = overview_of(membership.tenant, timezone.now())
    return render(request, "console/overview.html", {"m": membership, "o": summary})


@require_GET
@console_login_required
def logs(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    page = log_pages.page(membership.tenant, request.GET)
    return render(request, "console/logs.html", {
        "m": membership, "page": page, "q": request.GET, "keys": log_pages.tenant_keys(membership.tenant),
        "statuses": RequestStatus.values,
    }, status=400 if page.error else 200)


@require_GET
@console_login_required
def log_detail(request: HttpRequest, membership: TenantMembership, request_id: str) -> HttpResponse:
    row = log_pages.detail(membership.tenant, request_id)
    if row is None:
        raise Http404("No such request")
    return render(request, "console/log_detail.html", {"m": membership, "row": row})


@require_GET
@console_login_required
def statement(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    page = statements.page(membership.tenant, request.GET)
    return render(request, "console/statement.html", {"m": membership, "page": page, "q": request.GET},
                  status=400 if page.error else 200)


@require_GET
@console_login_required
def statement_csv(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    try:
        lines = statements.csv_download(membership.tenant, request.GET)
    except FilterError as error:
        return HttpResponse(f"{error}\n", status=400, content_type="text/plain; charset=utf-8")
    response = StreamingHttpResponse(streamed(lines), content_type=CONTENT_TYPES["csv"])
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="statement-{membership.tenant.pk}-{stamp}.csv"'
    return response


@require_http_methods(["GET", "POST"])
@console_login_required
def keys(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    error = None
    if request.method == "POST":
        owner_only(membership)
        try:
            key, secret = key_actions.create_key(membership, key_actions.key_request(request.POST))
        except key_actions.KeyRefused as refused:
            error = str(refused)
        else:
            # The one response that carries the secret: rendered here, never stored, never redirected to.
            return render(request, "console/key_created.html", {"m": membership, "key": key, "secret": secret})
    return render(request, "console/keys.html", {
        "m": membership, "keys": key_actions.tenant_keys(membership.tenant),
        "allowance": allowance_of(membership.tenant), "error": error, "posted": request.POST,
        "posted_models": request.POST.getlist("models"), "graces": key_actions.GRACES,
        "periods": key_actions.BUDGET_PERIODS, "now": timezone.now(),
    }, status=400 if error else 200)


@require_POST
@console_login_required
def key_revoke(request: HttpRequest, membership: TenantMembership, key_id: int) -> HttpResponse:
    owner_only(membership)
    key = key_actions.revoke_key(membership, key_id)
    if key is None:
        raise Http404("No such key")
    messages.success(request, f"Key {key.prefix}… is revoked: requests with it are refused from now on.")
    return redirect("console:keys")


@require_POST
@console_login_required
def key_rotate(request: HttpRequest, membership: TenantMembership, key_id: int) -> HttpResponse:
    owner_only(membership)
    try:
        rotated = key_actions.rotate_key(membership, key_id, key_actions.grace_of(request.POST.get("grace", "")))
    except key_actions.KeyRefused as refused:
        messages.error(request, str(refused))
        return redirect("console:keys")
    if rotated is None:
        raise Http404("No such key")
    key, secret = rotated
    return render(request, "console/key_created.html",
                  {"m": membership, "key": key, "secret": secret, "rotated": True})


@require_GET
@console_login_required
def connect(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    models = allowance_of(membership.tenant).models
    snippets = connect_snippets.snippets(request.build_absolute_uri("/"), models[0] if models else "MODEL")
    return render(request, "console/connect.html", {"m": membership, "snippets": snippets, "models": models})


@require_http_methods(["GET", "POST"])
@console_login_required
def people(request: HttpRequest, membership: TenantMembership) -> HttpResponse:
    error = None
    if request.method == "POST":
        owner_only(membership)
        try:
            invitation, token = invitations.invite(membership.tenant, request.POST.get("email", ""),
                                                   request.POST.get("role", ""), membership.user)
        except invitations.InvitationRefused as refused:
            error = str(refused)
        else:
            link = request.build_absolute_uri(invitations.path_of(token))
            # Where mail is set up, the link goes to the invited address only: the owner
            # never sees it, so whoever accepts it reads that mailbox. Without mail, this
            # is the one response that carries it: rendered here, never stored.
            mail_set_up = invitations.mail_set_up()
            mailed = mail_set_up and invitations.mail(invitation, link)
            return render(request, "console/invitation_made.html", {
                "m": membership, "invitation": invitation, "link": None if mail_set_up else link, "mailed": mailed,
            })
    members, pending = invitations.people(membership.tenant)
    return render(request, "console/people.html", {
        "m": membership, "members": members, "pending": pending, "error": error, "posted": request.POST,
        "roles": TenantMembership.Role.values,
    }, status=400 if error else 200)


@require_POST
@console_login_required
def invitation_cancel(request: HttpRequest, membership: TenantMembership, invitation_id: int) -> HttpResponse:
    owner_only(membership)
    invitation = invitations.cancel(membership, invitation_id)
    if invitation is None:
        raise Http404("No such invitation")
    messages.success(request, f"The invitation of {invitation.email} is cancelled: its link no longer works.")
    return redirect("console:people")


@require_POST
@console_login_required
def member_remove(request: HttpRequest, membership: TenantMembership, membership_id: int) -> HttpResponse:
    owner_only(membership)
    try:
        removed = remove_member(membership, membership_id)
    except MemberError as refused:
        messages.error(request, f"Not removed: {refused.message}.")
        return redirect("console:people")
    if removed is None:
        raise Http404("No such person")
    if removed.pk == membership.pk:
        return redirect("console:login")  # they removed themselves: signed out with it
    messages.success(request, f"{removed.user.get_username()} is removed: they can no longer sign in.")
    return redirect("console:people")


@never_cache
@require_http_methods(["GET", "POST"])
def invite_accept(request: HttpRequest, token: str) -> HttpResponse:
    error = None
    try:
        invitation = invitations.usable(token)
        if request.method == "POST":
            if request.POST.get("password", "") != request.POST.get("password_again", ""):
                raise invitations.InvitationRefused("The two passwords differ.")
            membership = invitations.accept(token, request.POST.get("password", ""))
            sign_in(request, membership.user)
            messages.success(request, f"Welcome to the console of {membership.tenant.name}.")
            return redirect("console:overview")
    except invitations.InvitationRefused as refused:
        if refused.status != 400:
            return render(request, "console/link_refused.html", {"message": str(refused)}, status=refused.status)
        error = str(refused)
    return render(request, "console/invite_accept.html", {"invitation": invitation, "error": error},
                  status=400 if error else 200)


@require_http_methods(["GET", "POST"])
def password_forgot(request: HttpRequest) -> HttpResponse:
    asked = request.method == "POST" and mail_configured()
    if asked:
        passwords.mail_link(request.POST.get("email", ""), request.build_absolute_uri("/").rstrip("/"))
    return render(request, "console/password_forgot.html", {"asked": asked, "mail": mail_configured()})


@never_cache
@require_http_methods(["GET", "POST"])
def password_reset(request: HttpRequest, uidb64: str, token: str) -> HttpResponse:
    try:
        user = passwords.holder(uidb64, token)
    except passwords.ResetRefused:
        return render(request, "console/link_refused.html", {
            "message": "This password reset link has expired or has been used. Ask for a new one."}, status=410)
    error = None
    if request.method == "POST":
        try:
            passwords.reset(user, request.POST.get("password", ""), request.POST.get("password_again", ""))
        except ValidationError as invalid:
            error = " ".join(invalid.messages)
        else:
            messages.success(request, "Your password is changed: sign in with it.")
            return redirect("console:login")
    return render(request, "console/password_reset.html", {"email": user.get_username(), "error": error},
                  status=400 if error else 200)
