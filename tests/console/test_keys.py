"""Keys from the console (console.keys, console.allowance; K3): an owner
creates a key with models, limits and budgets within the tenant's allowance
and sees its secret once, revokes it, rotates it with a grace period;
members read only; every change in the admin log with who made it, never
the secret."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.utils import timezone

from billing.models import Budget
from console import allowance as console_allowance
from tenants.models import ApiKey
from tests.support.console_cast import cast, fast_passwords, signed_in  # noqa: F401 (a fixture)
from tests.support.factories import make_channel, make_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    make_channel(served_models=["gpt-a", "gpt-b", "public=upstream-name"])
    make_channel(served_models=["gpt-off"], enabled=False)
    return cast()


@pytest.fixture
def granted(people):
    """The operator's key of tenant A, allowing every model, no limits."""
    make_key(people.tenant_a, label="from-the-operator")
    return people


def secret_in(page: str) -> str:
    return re.search(r"hb-[A-Za-z0-9_-]{40}", page).group(0)


def test_the_allowance_is_every_served_model_when_a_key_may_use_all(people):
    make_key(people.tenant_a, allowed_models=[])
    assert console_allowance.allowance(people.tenant_a).models == ["gpt-a", "gpt-b", "public"]


def test_the_allowance_is_what_the_operators_keys_allow_of_what_is_served(people):
    make_key(people.tenant_a, allowed_models=["gpt-a", "not-served"])
    make_key(people.tenant_a, allowed_models=["gpt-b"]).__getitem__(0).revoke()
    assert console_allowance.allowance(people.tenant_a) == console_allowance.Allowance(["gpt-a"], every_model=False)


def test_an_owner_creates_a_key_and_sees_its_secret_once(granted):
    people = granted
    client = signed_in(people.alice)
    response = client.post("/console/keys/", {"name": "billing", "models": "gpt-a, gpt-b"})
    assert response.status_code == 200 and response["Cache-Control"] == "private, no-store"
    secret = secret_in(response.content.decode())
    key = ApiKey.objects.authenticate(secret)
    assert key.tenant == people.tenant_a and key.label == "billing" and key.allowed_models == ["gpt-a", "gpt-b"]
    assert secret not in client.get("/console/keys/").content.decode()
    entry = LogEntry.objects.get(object_id=str(key.pk))
    assert entry.user_id == people.alice.user.pk and entry.action_flag == ADDITION and secret not in entry.change_message


def test_checkboxes_give_the_models_one_each(granted):
    people = granted
    signed_in(people.alice).post("/console/keys/", {"name": "x", "models": ["gpt-a", "public"]})
    assert ApiKey.objects.get(label="x").allowed_models == ["gpt-a", "public"]


def test_no_models_ticked_is_the_tenants_allowance_spelled_out(people):
    make_key(people.tenant_a, allowed_models=["gpt-b"])
    signed_in(people.alice).post("/console/keys/", {"name": "narrow", "models": ""})
    assert ApiKey.objects.get(label="narrow").allowed_models == ["gpt-b"]


@pytest.mark.parametrize(("models", "message"), [
    ("gpt-off", "Not a model this tenant may use: gpt-off."),
    ("gpt-a,upstream-name", "Not a model this tenant may use: upstream-name."),
])
def test_a_model_beyond_the_allowance_is_refused_and_nothing_made(granted, models, message):
    people = granted
    before = ApiKey.objects.count()
    response = signed_in(people.alice).post("/console/keys/", {"name": "x", "models": models})
    assert response.status_code == 400 and message in response.content.decode()
    assert ApiKey.objects.count() == before and not LogEntry.objects.exists()


def test_an_owner_revokes_a_key_and_the_gateway_refuses_it(people):
    key, secret = make_key(people.tenant_a)
    response = signed_in(people.alice).post(f"/console/keys/{key.pk}/revoke/")
    assert response.status_code == 302 and ApiKey.objects.authenticate(secret) is None
    entry = LogEntry.objects.get(object_id=str(key.pk))
    assert entry.user_id == people.alice.user.pk and entry.action_flag == CHANGE


def test_a_member_reads_keys_but_a_crafted_post_is_403_and_changes_nothing(people):
    key, secret = make_key(people.tenant_a, label="theirs")
    client = signed_in(people.bob)
    page = client.get("/console/keys/").content.decode()
    assert key.prefix in page and "Create key" not in page and "Revoke" not in page
    assert client.post("/console/keys/", {"name": "sneaky"}).status_code == 403
    assert client.post(f"/console/keys/{key.pk}/revoke/").status_code == 403
    assert ApiKey.objects.authenticate(secret) is not None and not ApiKey.objects.filter(label="sneaky").exists()
    assert not LogEntry.objects.exists()


def test_limits_left_empty_are_the_loosest_the_operator_gave_the_tenant(people):
    make_key(people.tenant_a, rpm=60, tpm=10_000, concurrency=4)
    make_key(people.tenant_a, rpm=120, tpm=5_000, concurrency=None)
    signed_in(people.alice).post("/console/keys/", {"name": "roomy"})
    key = ApiKey.objects.get(label="roomy")
    assert (key.rpm, key.tpm, key.concurrency) == (120, 10_000, None)


def test_tighter_limits_are_kept(people):
    make_key(people.tenant_a, rpm=60)
    signed_in(people.alice).post("/console/keys/", {"name": "tight", "rpm": "10", "tpm": "500", "concurrency": "2"})
    key = ApiKey.objects.get(label="tight")
    assert (key.rpm, key.tpm, key.concurrency) == (10, 500, 2)
    assert "RPM 10; TPM 500; Concurrency 2" in LogEntry.objects.get(object_id=str(key.pk)).change_message


@pytest.mark.parametrize(("form", "message"), [
    ({"rpm": "61"}, "RPM 61 is above this tenant&#x27;s limit of 60."),
    ({"rpm": "0"}, "RPM must be a whole number from 1 (or empty)."),
    ({"tpm": "ten"}, "TPM must be a whole number from 1 (or empty)."),
    ({"budget_usd": "5.01", "budget_period": "1mo"}, "A 1mo budget of 5.01 USD is above this tenant&#x27;s 1mo limit"),
    ({"budget_usd": "lots"}, "Budget: &#x27;lots&#x27; is not an amount of USD."),
    ({"budget_usd": "1", "budget_period": "fortnight"}, "Budget period:"),
])
def test_limits_beyond_the_allowance_or_malformed_are_refused_and_nothing_made(people, form, message):
    make_key(people.tenant_a, rpm=60)
    Budget.objects.create(tenant=people.tenant_a, period="1mo", limit_usd=Decimal("5"))
    before = ApiKey.objects.count()
    response = signed_in(people.alice).post("/console/keys/", {"name": "greedy", **form})
    assert response.status_code == 400 and message in response.content.decode()
    assert ApiKey.objects.count() == before and not LogEntry.objects.exists()


def test_a_budget_period_every_operator_key_has_is_given_to_the_new_key_too(people):
    for limit in ("3", "7"):
        key, _ = make_key(people.tenant_a)
        Budget.objects.create(tenant=people.tenant_a, api_key=key, period="1d", limit_usd=Decimal(limit))
    signed_in(people.alice).post("/console/keys/", {"name": "budgeted", "budget_usd": "20", "budget_period": "1mo"})
    budgets = dict(Budget.objects.filter(api_key__label="budgeted").values_list("period", "limit_usd"))
    assert budgets == {"1d": Decimal("7"), "1mo": Decimal("20")}


def test_rotation_keeps_the_key_and_accepts_the_old_secret_for_the_grace(people):
    key, old = make_key(people.tenant_a, label="svc", rpm=5)
    response = signed_in(people.alice).post(f"/console/keys/{key.pk}/rotate/", {"grace": "3600"})
    assert response.status_code == 200
    new = secret_in(response.content.decode())
    assert new != old and ApiKey.objects.authenticate(new).pk == key.pk == ApiKey.objects.authenticate(old).pk
    key.refresh_from_db()
    assert key.rpm == 5 and key.previous_prefix == old[:11] and key.prefix == new[:11]
    assert timedelta(minutes=59) < key.previous_until - timezone.now() <= timedelta(hours=1)
    page = signed_in(people.alice).get("/console/keys/").content.decode()
    assert new not in page and old not in page and f"old secret <code>{old[:11]}…" in page
    entry = LogEntry.objects.get(object_id=str(key.pk))
    assert entry.user_id == people.alice.user.pk and "Rotated" in entry.change_message
    assert new not in entry.change_message and old not in entry.change_message


def test_rotation_without_grace_refuses_the_old_secret_at_once(people):
    key, old = make_key(people.tenant_a)
    new = secret_in(signed_in(people.alice).post(f"/console/keys/{key.pk}/rotate/", {"grace": "0"}).content.decode())
    assert ApiKey.objects.authenticate(old) is None and ApiKey.objects.authenticate(new).pk == key.pk


def test_a_second_rotation_refuses_the_first_old_secret(people):
    key, first = make_key(people.tenant_a)
    client = signed_in(people.alice)
    second = secret_in(client.post(f"/console/keys/{key.pk}/rotate/", {"grace": "86400"}).content.decode())
    third = secret_in(client.post(f"/console/keys/{key.pk}/rotate/", {"grace": "86400"}).content.decode())
    assert ApiKey.objects.authenticate(first) is None
    assert ApiKey.objects.authenticate(second).pk == ApiKey.objects.authenticate(third).pk == key.pk


def test_revoking_a_rotated_key_refuses_both_secrets(people):
    key, old = make_key(people.tenant_a)
    client = signed_in(people.alice)
    new = secret_in(client.post(f"/console/keys/{key.pk}/rotate/", {"grace": "86400"}).content.decode())
    client.post(f"/console/keys/{key.pk}/revoke/")
    assert ApiKey.objects.authenticate(old) is None and ApiKey.objects.authenticate(new) is None


@pytest.mark.parametrize("grace", ["", "60", "-1", "soon"])
def test_a_grace_not_in_the_list_is_refused_and_nothing_changes(people, grace):
    key, old = make_key(people.tenant_a)
    response = signed_in(people.alice).post(f"/console/keys/{key.pk}/rotate/", {"grace": grace}, follow=True)
    assert "Pick a grace period from the list." in response.content.decode()
    assert ApiKey.objects.authenticate(old).pk == key.pk and not LogEntry.objects.exists()


def test_a_revoked_key_is_not_rotated(people):
    key, _ = make_key(people.tenant_a)
    key.revoke()
    response = signed_in(people.alice).post(f"/console/keys/{key.pk}/rotate/", {"grace": "0"}, follow=True)
    assert "is revoked or expired" in response.content.decode()
    key.refresh_from_db()
    assert key.previous_hash is None


def test_a_member_cannot_rotate(people):
    key, old = make_key(people.tenant_a)
    assert signed_in(people.bob).post(f"/console/keys/{key.pk}/rotate/", {"grace": "0"}).status_code == 403
    assert ApiKey.objects.authenticate(old).pk == key.pk


def test_keys_made_in_the_console_never_widen_the_allowance_nor_outlive_the_operators(people):
    """Revoking the operator's narrow key leaves nothing to make keys within
    (not everything); a key made here does not count; none outlives the
    operator's keys. (A tenant the operator issued no key at all is bounded
    by its budgets alone: test_the_allowance_is_every_served_model_without_operator_keys.)"""
    soon = timezone.now() + timedelta(hours=2)
    operators, _ = make_key(people.tenant_a, allowed_models=["gpt-a"], rpm=10, expires_at=soon)
    client = signed_in(people.alice)
    assert client.post("/console/keys/", {"name": "mine", "models": "gpt-a"}).status_code == 200
    mine = ApiKey.objects.get(label="mine")
    assert mine.made_in_console and mine.expires_at == soon and mine.rpm == 10
    client.post(f"/console/keys/{operators.pk}/revoke/")
    response = client.post("/console/keys/", {"name": "wide"})
    assert response.status_code == 400 and "Every key your operator issued" in response.content.decode()
    assert not ApiKey.objects.filter(label="wide").exists()
    assert console_allowance.allowance(people.tenant_a).granted is False  # "mine" is live, and counts for nothing


def test_the_allowance_is_every_served_model_without_operator_keys(people):
    """The operator has narrowed nothing (no key issued): every served model, no limits."""
    allowed = console_allowance.allowance(people.tenant_a)
    assert allowed.granted and allowed.every_model and allowed.models == ["gpt-a", "gpt-b", "public"]
    assert (allowed.rpm, allowed.expires_at, allowed.budgets_required) == (None, None, frozenset())
    assert signed_in(people.alice).post("/console/keys/", {"name": "first"}).status_code == 200
