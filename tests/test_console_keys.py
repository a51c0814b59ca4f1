"""Keys from the console (console.keys; K3): an owner creates a key with
models within the tenant's allowance and sees its secret once, revokes it;
members read only; every change in the admin log with who made it, never
the secret."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry

from console import keys as console_keys
from hopbase.models import ApiKey
from tests.console_cast import cast, fast_passwords, signed_in  # noqa: F401 (a fixture)
from tests.factories import make_channel, make_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    make_channel(served_models=["gpt-a", "gpt-b", "public=upstream-name"])
    make_channel(served_models=["gpt-off"], enabled=False)
    return cast()


def secret_in(page: str) -> str:
    return re.search(r"hb-[A-Za-z0-9_-]{40}", page).group(0)


def test_the_allowance_is_every_served_model_when_a_key_may_use_all(people):
    make_key(people.tenant_a, allowed_models=[])
    assert console_keys.allowance(people.tenant_a).models == ["gpt-a", "gpt-b", "public"]


def test_the_allowance_is_what_the_operators_keys_allow_of_what_is_served(people):
    make_key(people.tenant_a, allowed_models=["gpt-a", "not-served"])
    make_key(people.tenant_a, allowed_models=["gpt-b"]).__getitem__(0).revoke()
    assert console_keys.allowance(people.tenant_a) == console_keys.Allowance(["gpt-a"], every_model=False)


def test_an_owner_creates_a_key_and_sees_its_secret_once(people):
    client = signed_in(people.alice)
    response = client.post("/console/keys/", {"name": "billing", "models": "gpt-a, gpt-b"})
    assert response.status_code == 200 and response["Cache-Control"] == "private, no-store"
    secret = secret_in(response.content.decode())
    key = ApiKey.objects.authenticate(secret)
    assert key.tenant == people.tenant_a and key.label == "billing" and key.allowed_models == ["gpt-a", "gpt-b"]
    assert secret not in client.get("/console/keys/").content.decode()
    entry = LogEntry.objects.get(object_id=str(key.pk))
    assert entry.user_id == people.alice.user.pk and entry.action_flag == ADDITION and secret not in entry.change_message


def test_checkboxes_give_the_models_one_each(people):
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
def test_a_model_beyond_the_allowance_is_refused_and_nothing_made(people, models, message):
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
