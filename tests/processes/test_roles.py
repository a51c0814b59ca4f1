"""Staff roles (tenants.roles), through the admin as
a browser uses it (a real login, CSRF checks on): finance reads and exports
but changes nothing; the operator runs tenants, keys, channels, prices and
top-ups; a top-up form sent twice credits once; every change names its
staff user in the admin log, which finance reads."""

from __future__ import annotations

import subprocess
import sys
import warnings
from decimal import Decimal

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.core.management.base import CommandError
from django.urls import reverse

from billing import ledger
from billing.ledger import TopUpMismatch, post_entry, top_up_once
from billing.models import LedgerEntry, ModelPrice
from channels_pool.models import Channel
from core import audit
from tenants.models import Tenant
from tenants.roles import ROLES
from tests.support.factories import make_channel, make_key, make_log, make_price, make_tenant
from tests.support.staff_checks import PASSWORD, create_staff, form_token, log_in, post

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def rows():
    tenant = make_tenant("acme")
    key, _ = make_key(tenant, label="ci")
    channel = make_channel("up-1", base_url="http://upstream.example/v1")
    make_price()
    log = make_log(tenant, key, channel=channel, charge_usd=Decimal("0.01"))
    ledger.top_up(tenant, Decimal("5"))
    return tenant, key, channel, log


@pytest.fixture
def finance():
    create_staff("fiona", "finance")
    return log_in("fiona")


@pytest.fixture
def operator():
    create_staff("oscar", "operator")
    return log_in("oscar")


def body(response) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sync test client reads the async stream Daphne would send
        return b"".join(response).decode()


def permissions_of(group: Group) -> set[str]:
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}


# The roles and createstaff


def test_the_migration_made_both_roles_with_their_permissions():
    for role, names in ROLES.items():
        assert permissions_of(Group.objects.get(name=role)) == set(names)
    assert all(name.split(".")[1].startswith("view_") for name in ROLES["finance"])
    assert "hopbase.top_up_tenant" in ROLES["operator"]


def test_createstaff_makes_a_staff_user_in_the_role_with_the_first_line_as_password():
    out = create_staff("olga", "operator")
    assert "created staff user olga" in out and "operator" in out
    user = User.objects.get(username="olga")
    assert (user.is_staff, user.is_superuser, user.is_active) == (True, False, True)
    assert [g.name for g in user.groups.all()] == ["operator"]
    assert user.check_password(PASSWORD)
    assert user.has_perm("hopbase.top_up_tenant") and not user.has_perm("auth.change_user")


def test_createstaff_makes_a_missing_role_group_again():
    Group.objects.filter(name="finance").delete()
    create_staff("fred", "finance")
    assert permissions_of(User.objects.get(username="fred").groups.get()) == set(ROLES["finance"])


@pytest.mark.parametrize(
    ("password", "match"),
    [("short1", "too short"), ("password12345", "too common"), ("123456789012345", "entirely numeric"),
     ("", "no password")],
)
def test_createstaff_refuses_a_weak_password(password, match):
    with pytest.raises(CommandError, match=match) as caught:
        create_staff("weak", "finance", password=password)
    assert "\n" not in str(caught.value)
    assert not User.objects.filter(username="weak").exists()


def test_createstaff_refuses_an_existing_user_and_a_missing_password_flag():
    create_staff("dup", "finance")
    with pytest.raises(CommandError, match="already exists"):
        create_staff("dup", "operator")
    from django.core.management import call_command

    with pytest.raises(CommandError, match="--password-stdin"):
        call_command("createstaff", "nopass", "--role", "finance")


def test_an_unknown_role_exits_non_zero_with_one_line_on_stderr():
    done = subprocess.run(
        [sys.executable, "manage.py", "createstaff", "eve", "--role", "admin", "--password-stdin"],
        cwd=settings.BASE_DIR, input=PASSWORD + "\n", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["CommandError: --role: 'admin' is not one of operator, finance"]
    assert done.stdout == ""


# Finance: reads and exports, changes nothing


def test_finance_lists_and_exports_request_logs_and_reads_the_books(finance, rows):
    tenant, _key, _channel, log = rows
    pages = [
        reverse("admin:index"),
        reverse("admin:billing_requestlog_changelist"),
        reverse("admin:billing_requestlog_change", args=[log.pk]),
        reverse("admin:billing_ledgerentry_changelist"),
        reverse("admin:hopbase_tenant_changelist"),
        reverse("admin:billing_modelprice_changelist"),
        reverse("admin:admin_logentry_changelist"),
        reverse("billing_dashboard"),
    ]
    for url in pages:
        assert finance.get(url).status_code == 200, url
    assert log.request_id in finance.get(reverse("admin:billing_requestlog_changelist")).content.decode()
    for fmt in ("csv", "jsonl"):
        export = finance.get(reverse("admin:billing_requestlog_export", args=[fmt]))
        assert export.status_code == 200
        assert log.request_id in body(export)
    selected = post(finance, reverse("admin:billing_requestlog_changelist"),
                    {"action": "export_selected_csv", "_selected_action": [log.pk]})
    assert selected.status_code == 200 and log.request_id in body(selected)


def test_finance_sees_no_change_buttons_and_cannot_change_anything(finance, rows):
    tenant, key, channel, log = rows
    page = finance.get(reverse("admin:hopbase_tenant_change", args=[tenant.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'name="_save"' not in body
    assert reverse("admin:hopbase_tenant_topup", args=[tenant.pk]) not in body
    assert b"addlink" not in finance.get(reverse("admin:hopbase_tenant_changelist")).content
    change = post(finance, reverse("admin:hopbase_tenant_change", args=[tenant.pk]),
                  {"name": "acme", "price_multiplier": "0"})
    assert change.status_code == 403
    tenant.refresh_from_db()
    assert tenant.price_multiplier == Decimal("1")
    for url in (reverse("admin:hopbase_tenant_add"), reverse("admin:billing_modelprice_add"),
                reverse("admin:billing_requestlog_add")):
        assert finance.get(url).status_code == 403, url
    for url in (reverse("admin:channels_pool_channel_changelist"), reverse("admin:hopbase_apikey_changelist"),
                reverse("admin:channels_pool_channel_change", args=[channel.pk]),
                reverse("admin:auth_user_changelist")):
        assert finance.get(url).status_code == 403, url
    assert post(finance, reverse("admin:billing_modelprice_add"),
                {"model": "free", "input_usd_per_mtok": "0", "output_usd_per_mtok": "0"}).status_code == 403
    assert not ModelPrice.objects.filter(model="free").exists()


def test_finance_cannot_top_up(finance, rows):
    tenant, *_ = rows
    url = reverse("admin:hopbase_tenant_topup", args=[tenant.pk])
    assert finance.get(url).status_code == 403
    response = post(finance, url, {"amount_usd": "1000", "token": "x" * 32})
    assert response.status_code == 403
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 1  # the fixture's


# The operator: tenants, keys, channels, prices, top-ups


def test_the_operator_changes_channels_and_keys(operator, rows):
    tenant, key, channel, _log = rows
    form = {
        "name": "up-1", "protocol": "openai", "base_url": channel.base_url, "served_models": "gpt-a",
        "priority": "5", "weight": "1", "max_concurrency": "", "enabled": "on", "secret": "",
        "health-TOTAL_FORMS": "0", "health-INITIAL_FORMS": "0", "health-MIN_NUM_FORMS": "0",
        "health-MAX_NUM_FORMS": "1",
    }
    assert post(operator, reverse("admin:channels_pool_channel_change", args=[channel.pk]), form).status_code == 302
    channel.refresh_from_db()
    assert (channel.priority, channel.served_models) == (5, ["gpt-a"])
    assert post(operator, reverse("admin:channels_pool_channel_changelist"),
                {"action": "disable_channels", "_selected_action": [channel.pk]}).status_code == 302
    assert not Channel.objects.get(pk=channel.pk).enabled
    edited = post(operator, reverse("admin:hopbase_apikey_change", args=[key.pk]),
                  {"label": "renamed", "allowed_models": "", "rpm": "10"})
    assert edited.status_code == 302
    added = post(operator, reverse("admin:hopbase_apikey_add"), {"tenant": tenant.pk, "label": "new"})
    assert added.status_code == 200 and 'id="issued-secret"' in added.content.decode()
    revoked = post(operator, reverse("admin:hopbase_apikey_changelist"),
                   {"action": "revoke_keys", "_selected_action": [key.pk]})
    assert revoked.status_code == 302
    key.refresh_from_db()
    assert (key.label, key.rpm, key.revoked) == ("renamed", 10, True)
    price = post(operator, reverse("admin:billing_modelprice_add"),
                 {"model": "gpt-a", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2",
                  "cache_read_usd_per_mtok": "0", "cache_write_usd_per_mtok": "0",
                  "effective_from_0": "", "effective_from_1": ""})
    assert price.status_code == 302
    # Not what a superuser alone may do.
    assert operator.get(reverse("admin:auth_user_changelist")).status_code == 403


def test_the_operator_tops_up_and_a_double_submit_credits_once(operator, rows):
    tenant, *_ = rows
    change_page = operator.get(reverse("admin:hopbase_tenant_change", args=[tenant.pk])).content.decode()
    url = reverse("admin:hopbase_tenant_topup", args=[tenant.pk])
    assert url in change_page
    form = operator.get(url).content.decode()
    token = form_token(form)
    assert token != form_token(operator.get(url).content.decode())  # one per rendered form
    data = {"amount_usd": "25", "note": "invoice 9", "token": token}
    first, second = post(operator, url, data), post(operator, url, data)
    assert first.status_code == second.status_code == 302
    entries = LedgerEntry.objects.filter(tenant=tenant, note="invoice 9")
    assert entries.count() == 1 and entries.get().idempotency_key == token
    tenant.refresh_from_db()
    assert tenant.balance_usd == Decimal("30") == ledger.sum_of_entries(tenant)
    warned = operator.get(second["Location"]).content.decode()
    assert "already made" in warned
    # The same token for another amount is refused, not credited.
    again = post(operator, url, {**data, "amount_usd": "99"})
    assert again.status_code == 200 and "already used" in again.content.decode()
    # A form without its token is refused too.
    assert post(operator, url, {"amount_usd": "5"}).status_code == 200
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 2


def test_a_top_up_racing_its_twin_credits_once(monkeypatch):
    """Two requests with one token: the second passes the check before the
    first commits, and its insert hits the unique key."""
    tenant = make_tenant()
    real = ledger.post_entry

    def twin_commits_first(*args, **kwargs):
        monkeypatch.setattr(ledger, "post_entry", real)
        real(*args, **kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ledger, "post_entry", twin_commits_first)
    entry, created = top_up_once(tenant, Decimal("5"), "token-racing-0123456789")
    assert not created
    tenant.refresh_from_db()
    assert tenant.balance_usd == Decimal("5") and LedgerEntry.objects.filter(tenant=tenant).count() == 1
    with pytest.raises(TopUpMismatch):
        top_up_once(make_tenant(), Decimal("5"), "token-racing-0123456789")
    post_entry(tenant.pk, LedgerEntry.Kind.TOPUP, Decimal("1"))  # no token: as before
    assert LedgerEntry.objects.filter(tenant=tenant).count() == 2


# Audit: who changed what, read by finance


def test_every_change_names_its_staff_user_in_the_log_finance_reads(operator, rows):
    tenant, key, channel, _log = rows
    url = reverse("admin:hopbase_tenant_topup", args=[tenant.pk])
    post(operator, url, {"amount_usd": "7", "token": form_token(operator.get(url).content.decode())})
    post(operator, reverse("admin:hopbase_apikey_changelist"), {"action": "revoke_keys", "_selected_action": [key.pk]})
    post(operator, reverse("admin:channels_pool_channel_changelist"),
         {"action": "disable_channels", "_selected_action": [channel.pk]})
    post(operator, reverse("admin:hopbase_tenant_change", args=[tenant.pk]),
         {"name": "acme", "price_multiplier": "0.9"})
    post(operator, reverse("admin:billing_modelprice_add"),
         {"model": "gpt-b", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2", "cache_read_usd_per_mtok": "0",
          "cache_write_usd_per_mtok": "0", "effective_from_0": "", "effective_from_1": ""})
    oscar = User.objects.get(username="oscar")
    logged = {(e.content_type.model, e.object_repr, e.get_change_message())
              for e in LogEntry.objects.filter(user=oscar)}
    top_up_entry = LedgerEntry.objects.get(tenant=tenant, amount_usd=7)
    assert ("tenant", "acme", f"Topped up 7.00 USD (ledger entry #{top_up_entry.pk}).") in logged
    assert ("apikey", str(key), "Revoked.") in logged
    assert ("channel", "up-1", "Disabled.") in logged
    assert ("tenant", "acme", "Changed Price multiplier.") in logged
    assert any(model == "modelprice" and message == "Added." for model, _, message in logged)
    # The one other row: oscar made by createstaff, by the OS user (core.audit).
    assert [(e.user.username, e.object_repr) for e in LogEntry.objects.exclude(user=oscar)] == [
        (audit.ACTOR_PREFIX + audit.os_login(), "oscar")
    ]

    create_staff("fiona", "finance")
    finance = log_in("fiona")
    page = finance.get(reverse("admin:admin_logentry_changelist")).content.decode()
    assert "oscar" in page and "Topped up 7.00 USD" in page and "Revoked." in page
    entry = LogEntry.objects.filter(user=oscar).first()
    detail = finance.get(reverse("admin:admin_logentry_change", args=[entry.pk]))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert post(finance, reverse("admin:admin_logentry_delete", args=[entry.pk]), {"post": "yes"}).status_code == 403
    assert LogEntry.objects.filter(pk=entry.pk).exists()


def test_a_superuser_may_top_up_as_django_has_it(admin_client):
    tenant = make_tenant()
    url = reverse("admin:hopbase_tenant_topup", args=[tenant.pk])
    response = admin_client.post(url, {"amount_usd": "3", "token": form_token(admin_client.get(url).content.decode())})
    assert response.status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).balance_usd == Decimal("3")
