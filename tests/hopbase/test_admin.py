"""The operator admin: who may see it, and the money and secrets rules it keeps."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.db import connection
from django.urls import reverse

from billing.ledger import post_entry, sum_of_entries, top_up
from billing.models import Budget, LedgerEntry, ModelPrice, RequestLog
from billing.read_only_admin import EstimatedCountPaginator
from channels_pool.models import Channel, ChannelHealth
from tenants.models import ApiKey, Tenant, hash_secret
from tests.support.factories import make_channel, make_key, make_log, make_price, make_tenant

pytestmark = pytest.mark.django_db

MODELS = ("hopbase_tenant", "hopbase_apikey", "channels_pool_channel", "billing_modelprice",
          "billing_requestlog", "billing_ledgerentry", "billing_budget")
ADDABLE = ("hopbase_tenant", "hopbase_apikey", "channels_pool_channel", "billing_modelprice", "billing_budget")


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    # admin_client creates a superuser per test; the default hasher is slow on purpose.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def some_rows():
    tenant = make_tenant("acme")
    key, _secret = make_key(tenant, label="ci")
    channel = make_channel("up-1")
    ChannelHealth.objects.create(channel=channel, state=ChannelHealth.State.OPEN)
    make_channel("up-2")
    make_price()
    log = make_log(tenant, key, channel=channel, charge_usd=Decimal("0.01"))
    top_up(tenant, Decimal("5"))
    post_entry(tenant.pk, LedgerEntry.Kind.CHARGE, Decimal("-0.01"), request_log=log)
    return tenant, key, channel, log


@pytest.mark.parametrize("model", MODELS)
def test_it_lists_every_model_for_staff(admin_client, some_rows, model):
    response = admin_client.get(reverse(f"admin:{model}_changelist"))
    assert response.status_code == 200


@pytest.mark.parametrize("model", ADDABLE)
def test_it_offers_add_pages(admin_client, model):
    assert admin_client.get(reverse(f"admin:{model}_add")).status_code == 200


@pytest.mark.parametrize("model", ("billing_requestlog", "billing_ledgerentry"))
def test_logs_and_ledger_are_view_only(admin_client, some_rows, model):
    _tenant, _key, _channel, log = some_rows
    assert admin_client.get(reverse(f"admin:{model}_add")).status_code == 403
    obj = log if model == "billing_requestlog" else LedgerEntry.objects.first()
    change = admin_client.get(reverse(f"admin:{model}_change", args=[obj.pk]))
    assert change.status_code == 200
    assert b'name="_save"' not in change.content
    assert admin_client.post(reverse(f"admin:{model}_delete", args=[obj.pk]), {"post": "yes"}).status_code == 403


def test_it_renders_change_pages(admin_client, some_rows):
    tenant, key, channel, _log = some_rows
    for name, obj in [("hopbase_tenant", tenant), ("hopbase_apikey", key), ("channels_pool_channel", channel),
                      ("billing_modelprice", ModelPrice.objects.get())]:
        assert admin_client.get(reverse(f"admin:{name}_change", args=[obj.pk])).status_code == 200


@pytest.mark.parametrize("model", MODELS)
def test_it_sends_anonymous_visitors_to_login(client, model):
    for page in ("changelist", "add"):
        response = client.get(reverse(f"admin:{model}_{page}"))
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_it_shows_the_request_log_list_with_filters_and_search(admin_client, some_rows):
    _tenant, key, _channel, log = some_rows
    url = reverse("admin:billing_requestlog_changelist")
    response = admin_client.get(url, {"q": log.request_id, "status__exact": "completed"})
    assert response.status_code == 200
    assert log.request_id in response.content.decode()
    assert key.prefix in response.content.decode()
    assert log.request_id not in admin_client.get(url, {"q": "nothing-like-it"}).content.decode()


# Tenants


def test_a_tenant_balance_cannot_be_edited(admin_client, some_rows):
    tenant, *_ = some_rows
    url = reverse("admin:hopbase_tenant_change", args=[tenant.pk])
    response = admin_client.post(url, {"name": "acme", "balance_usd": "1000000", "price_multiplier": "1"})
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert tenant.balance_usd == Decimal("4.99") == sum_of_entries(tenant)


def test_it_tops_up_a_tenant_through_the_ledger(admin_client):
    tenant = make_tenant("acme")
    change_page = admin_client.get(reverse("admin:hopbase_tenant_change", args=[tenant.pk])).content.decode()
    url = reverse("admin:hopbase_tenant_topup", args=[tenant.pk])
    assert url in change_page
    form_page = admin_client.get(url)
    assert form_page.status_code == 200
    token = re.search(r'name="token" value="([^"]+)"', form_page.content.decode())[1]
    response = admin_client.post(url, {"amount_usd": "25.125", "note": "invoice 17", "token": token})
    assert response.status_code == 302
    entry = LedgerEntry.objects.get(tenant=tenant)
    assert (entry.kind, entry.amount_usd, entry.note) == ("topup", Decimal("25.125"), "invoice 17")
    tenant.refresh_from_db()
    assert tenant.balance_usd == Decimal("25.125") == sum_of_entries(tenant)


@pytest.mark.parametrize("amount", ["0", "-5", "abc", "0.00000000001"])
def test_it_refuses_a_bad_top_up(admin_client, amount):
    tenant = make_tenant("acme")
    response = admin_client.post(reverse("admin:hopbase_tenant_topup", args=[tenant.pk]), {"amount_usd": amount})
    assert response.status_code == 200  # the form again, with its error
    assert not LedgerEntry.objects.exists()


def test_top_up_needs_staff(client):
    tenant = make_tenant("acme")
    response = client.post(reverse("admin:hopbase_tenant_topup", args=[tenant.pk]), {"amount_usd": "5"})
    assert response.status_code == 302
    assert not LedgerEntry.objects.exists()


# API keys


def test_it_shows_a_new_key_secret_once_and_stores_its_hash(admin_client):
    tenant = make_tenant("acme")
    response = admin_client.post(
        reverse("admin:hopbase_apikey_add"),
        {"tenant": tenant.pk, "label": "ci", "allowed_models": "gpt-a, gpt-b", "rpm": "60", "concurrency": ""},
    )
    assert response.status_code == 200
    page = response.content.decode()
    secret = re.search(r'value="(hb-[^"]+)" id="issued-secret"', page)[1]
    assert page.count(secret) == 1
    key = ApiKey.objects.get()
    assert ApiKey.objects.authenticate(secret) == key
    assert key.key_hash == hash_secret(secret)
    assert (key.label, key.allowed_models, key.rpm, key.concurrency) == ("ci", ["gpt-a", "gpt-b"], 60, None)
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    assert all(secret not in str(value) for value in row.values())
    # Once: nowhere afterwards.
    for url in (reverse("admin:hopbase_apikey_changelist"), reverse("admin:hopbase_apikey_change", args=[key.pk]),
                reverse("admin:index"), reverse("admin:hopbase_apikey_history", args=[key.pk])):
        later = admin_client.get(url).content.decode()
        assert secret not in later
        assert key.key_hash not in later


def test_it_refuses_a_bad_key_form(admin_client):
    tenant = make_tenant("acme")
    response = admin_client.post(reverse("admin:hopbase_apikey_add"), {"tenant": tenant.pk, "rpm": "0"})
    assert response.status_code == 200
    assert not ApiKey.objects.exists()


def test_it_edits_a_key_but_not_its_tenant(admin_client):
    key, _secret = make_key(make_tenant("acme"))
    other = make_tenant("other")
    url = reverse("admin:hopbase_apikey_change", args=[key.pk])
    response = admin_client.post(url, {"tenant": other.pk, "label": "renamed", "allowed_models": "m1", "rpm": "5"})
    assert response.status_code == 302
    key.refresh_from_db()
    assert (key.tenant.name, key.label, key.allowed_models, key.rpm) == ("acme", "renamed", ["m1"], 5)


def test_it_revokes_selected_keys(admin_client):
    tenant = make_tenant("acme")
    (first, first_secret), (second, _), (kept, kept_secret) = make_key(tenant), make_key(tenant), make_key(tenant)
    response = admin_client.post(
        reverse("admin:hopbase_apikey_changelist"),
        {"action": "revoke_keys", "_selected_action": [first.pk, second.pk]},
    )
    assert response.status_code == 302
    assert ApiKey.objects.authenticate(first_secret) is None
    assert set(ApiKey.objects.filter(revoked_at__isnull=False)) == {first, second}
    assert ApiKey.objects.authenticate(kept_secret) == kept


def test_a_key_has_a_tpm_limit_and_its_page_lists_its_budgets(admin_client):
    tenant = make_tenant("acme")
    response = admin_client.post(reverse("admin:hopbase_apikey_add"), {"tenant": tenant.pk, "tpm": "30000"})
    assert response.status_code == 200
    key = ApiKey.objects.get()
    assert key.tpm == 30000
    url = reverse("admin:hopbase_apikey_change", args=[key.pk])
    add_budget = f"{reverse('admin:billing_budget_add')}?tenant={tenant.pk}&amp;api_key={key.pk}"
    page = admin_client.get(url).content.decode()
    assert "None of its own." in page and add_budget in page
    budget = Budget.objects.create(tenant=tenant, api_key=key, period="1mo", limit_usd=Decimal("7.5"))
    Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal(99))  # the tenant's: on the budgets list
    make_log(tenant, key, charge_usd=Decimal("0.25"))
    page = admin_client.get(url).content.decode()
    link = reverse("admin:billing_budget_change", args=[budget.pk])
    assert f'<a href="{link}">1mo</a>: 0.25 of 7.50 USD spent this window, 0.00 reserved' in page
    assert "99.00" not in page
    assert admin_client.post(url, {"label": "x", "tpm": "0"}).status_code == 200  # refused, with its error
    assert admin_client.post(url, {"label": "x", "tpm": "100"}).status_code == 302
    key.refresh_from_db()
    assert key.tpm == 100


def test_keys_cannot_be_deleted(admin_client):
    key, _secret = make_key()
    assert admin_client.post(reverse("admin:hopbase_apikey_delete", args=[key.pk]), {"post": "yes"}).status_code == 403
    assert ApiKey.objects.filter(pk=key.pk).exists()


# Channels

CHANNEL_FORM = {
    "name": "up-1", "protocol": "openai", "base_url": "http://simulator:9000/v1", "served_models": "gpt-a, gpt-b",
    "priority": "3", "weight": "2", "max_concurrency": "", "enabled": "on",
    "health-TOTAL_FORMS": "0", "health-INITIAL_FORMS": "0", "health-MIN_NUM_FORMS": "0", "health-MAX_NUM_FORMS": "1",
}


def test_it_adds_a_channel_with_a_write_only_secret(admin_client):
    url = reverse("admin:channels_pool_channel_add")
    response = admin_client.post(url, {**CHANNEL_FORM, "secret": "sk-top-secret"})
    assert response.status_code == 302
    channel = Channel.objects.get()
    assert channel.secret == "sk-top-secret"
    assert channel.served_models == ["gpt-a", "gpt-b"]
    assert channel.base_url == "http://simulator:9000/v1"


def test_a_new_channel_needs_a_secret(admin_client):
    response = admin_client.post(reverse("admin:channels_pool_channel_add"), {**CHANNEL_FORM, "secret": ""})
    assert response.status_code == 200
    assert not Channel.objects.exists()


def test_the_channel_secret_never_appears_in_admin_pages(admin_client):
    channel = make_channel("up-1", secret="sk-never-shown-1234")
    ChannelHealth.objects.create(channel=channel)
    for url in (reverse("admin:channels_pool_channel_change", args=[channel.pk]),
                reverse("admin:channels_pool_channel_changelist"),
                reverse("admin:channels_pool_channel_history", args=[channel.pk]),
                reverse("admin:channels_pool_channel_delete", args=[channel.pk])):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert "sk-never-shown-1234" not in page.content.decode()
    # A form sent back with an error does not echo a typed secret either.
    response = admin_client.post(
        reverse("admin:channels_pool_channel_change", args=[channel.pk]),
        {**CHANNEL_FORM, "name": "up-1", "weight": "0", "secret": "sk-typed-but-bad",
         "health-TOTAL_FORMS": "1", "health-INITIAL_FORMS": "1", "health-0-channel": channel.pk},
    )
    assert response.status_code == 200
    assert "sk-typed-but-bad" not in response.content.decode()
    assert "sk-never-shown-1234" not in response.content.decode()


def test_a_blank_secret_on_edit_keeps_the_old_one(admin_client):
    channel = make_channel("up-1", secret="sk-keep-me", base_url=CHANNEL_FORM["base_url"])
    url = reverse("admin:channels_pool_channel_change", args=[channel.pk])
    response = admin_client.post(url, {**CHANNEL_FORM, "secret": "", "priority": "9"})
    assert response.status_code == 302
    channel.refresh_from_db()
    assert (channel.secret, channel.priority) == ("sk-keep-me", 9)
    admin_client.post(url, {**CHANNEL_FORM, "secret": "sk-new-one"})
    channel.refresh_from_db()
    assert channel.secret == "sk-new-one"


@pytest.mark.parametrize(
    "bad", [{"base_url": "ftp://x/v1"}, {"base_url": "http:///v1"}, {"served_models": " , "}, {"weight": "0"},
            {"protocol": "grpc"}],
)
def test_it_refuses_a_bad_channel_form(admin_client, bad):
    response = admin_client.post(reverse("admin:channels_pool_channel_add"), {**CHANNEL_FORM, "secret": "k", **bad})
    assert response.status_code == 200
    assert not Channel.objects.exists()


def test_the_channel_list_shows_health(admin_client, some_rows):
    page = admin_client.get(reverse("admin:channels_pool_channel_changelist")).content.decode()
    assert "Open (skipped)" in page
    assert "no record yet" in page


# Prices


def test_it_adds_a_price_effective_now(admin_client):
    response = admin_client.post(
        reverse("admin:billing_modelprice_add"),
        {"model": "gpt-a", "input_usd_per_mtok": "2.5", "output_usd_per_mtok": "10",
         "cache_read_usd_per_mtok": "0", "cache_write_usd_per_mtok": "0",
         "effective_from_0": "", "effective_from_1": ""},
    )
    assert response.status_code == 302
    assert ModelPrice.objects.in_force()["gpt-a"].input_usd_per_mtok == Decimal("2.5")


def test_it_refuses_a_price_from_the_past(admin_client):
    response = admin_client.post(
        reverse("admin:billing_modelprice_add"),
        {"model": "gpt-a", "input_usd_per_mtok": "2.5", "output_usd_per_mtok": "10",
         "cache_read_usd_per_mtok": "0", "cache_write_usd_per_mtok": "0",
         "effective_from_0": "2020-01-01", "effective_from_1": "00:00:00"},
    )
    assert response.status_code == 200
    assert not ModelPrice.objects.exists()


def test_a_saved_price_cannot_be_edited_or_deleted(admin_client):
    price = make_price("gpt-a")
    url = reverse("admin:billing_modelprice_change", args=[price.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    assert b'name="input_usd_per_mtok"' not in page.content
    response = admin_client.post(url, {"model": "gpt-a", "input_usd_per_mtok": "99", "output_usd_per_mtok": "99",
                                       "cache_read_usd_per_mtok": "0", "cache_write_usd_per_mtok": "0"})
    assert response.status_code == 403
    price.refresh_from_db()
    assert price.input_usd_per_mtok == Decimal("1")
    delete = admin_client.post(reverse("admin:billing_modelprice_delete", args=[price.pk]), {"post": "yes"})
    assert delete.status_code == 403
    assert ModelPrice.objects.filter(pk=price.pk).exists()


def test_tenant_delete_page_renders(admin_client):
    tenant = make_tenant("acme")
    assert admin_client.get(reverse("admin:hopbase_tenant_delete", args=[tenant.pk])).status_code == 200
    assert Tenant.objects.filter(pk=tenant.pk).exists()


def test_big_unfiltered_lists_use_the_planners_estimate(some_rows, monkeypatch):
    for _ in range(3):
        make_log()
    if connection.vendor != "postgresql":
        assert EstimatedCountPaginator(RequestLog.objects.all(), 10).count == 4
        return
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_requestlog")
    make_log(status="failed")  # after ANALYZE: the estimate does not know it
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_above", 0)
    assert EstimatedCountPaginator(RequestLog.objects.all(), 10).count == 4  # from pg_class
    assert EstimatedCountPaginator(RequestLog.objects.filter(status="failed"), 10).count == 1  # exact


@pytest.mark.django_db
def test_saving_a_tenant_in_the_admin_never_writes_its_balance_back():
    from django.contrib.admin.sites import site

    from billing.ledger import sum_of_entries, top_up
    from tenants.models import Tenant

    tenant = Tenant.objects.create(name="racing")
    stale = Tenant.objects.get(pk=tenant.pk)  # what the admin read at the start of its request
    top_up(tenant, Decimal("7"))  # a ledger entry lands meanwhile
    stale.name = "renamed"
    site._registry[Tenant].save_model(None, stale, None, change=True)
    tenant.refresh_from_db()
    assert (tenant.name, tenant.balance_usd) == ("renamed", Decimal("7"))
    assert tenant.balance_usd == sum_of_entries(tenant)


# -- key expiry ------------------------------------------------------------


def test_a_key_is_issued_with_an_expiry_and_the_list_shows_it(admin_client):
    from datetime import datetime, timezone

    tenant = make_tenant("acme")
    response = admin_client.post(
        reverse("admin:hopbase_apikey_add"),
        {"tenant": tenant.pk, "label": "temp", "allowed_models": "",
         "expires_at_0": "2031-05-01", "expires_at_1": "12:00:00"},
    )
    assert response.status_code == 200
    key = ApiKey.objects.get()
    assert key.expires_at == datetime(2031, 5, 1, 12, tzinfo=timezone.utc)
    listing = admin_client.get(reverse("admin:hopbase_apikey_changelist")).content.decode()
    assert "2031" in listing and "expires at" in listing.lower()


def test_an_expiry_is_edited_and_an_expired_key_is_refused(admin_client):
    key, secret = make_key(make_tenant("acme"), label="ci")
    url = reverse("admin:hopbase_apikey_change", args=[key.pk])
    assert "expires_at_0" in admin_client.get(url).content.decode()
    response = admin_client.post(
        url, {"label": "ci", "allowed_models": "", "expires_at_0": "2020-01-01", "expires_at_1": "00:00:00"}
    )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.expired
    assert ApiKey.objects.authenticate(secret) is None
    expired = admin_client.get(reverse("admin:hopbase_apikey_changelist"), {"state": "expired"}).content.decode()
    active = admin_client.get(reverse("admin:hopbase_apikey_changelist"), {"state": "active"}).content.decode()
    assert key.prefix in expired and key.prefix not in active
    admin_client.post(url, {"label": "ci", "allowed_models": "", "expires_at_0": "", "expires_at_1": ""})
    key.refresh_from_db()
    assert key.expires_at is None and ApiKey.objects.authenticate(secret) == key
