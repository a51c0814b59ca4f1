"""One tenant's console never shows another's (K4, B8): every console URL
walked with tenant B's ids by A's people is a 404 or 403 and carries none of
B's data; and the overview and logs pages cost a bounded number of queries
however many log rows the tenant has."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing.ledger import top_up
from billing.models import RequestLog
from tenants.models import ApiKey
from tests.support.console_cast import cast, fast_passwords, signed_in  # noqa: F401 (a fixture)
from tests.support.factories import make_key, make_log

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    people = cast()
    top_up(people.tenant_b, Decimal("777.77"))
    key_b, secret_b = make_key(people.tenant_b, label="b-private-key")
    log_b = make_log(people.tenant_b, key_b, model="b-private-model", charge_usd=Decimal("3.3333"))
    # A's own, which A's pages must show: a page that did not render would show neither.
    key_a, _ = make_key(people.tenant_a, label="a-own-key")
    make_log(people.tenant_a, key_a, model="a-own-model", charge_usd=Decimal("1.2345"))
    return people, key_b, secret_b, log_b


def test_another_tenants_log_is_a_404(world):
    people, _key, _secret, log_b = world
    for who in (people.alice, people.bob):
        response = signed_in(who).get(f"/console/logs/{log_b.request_id}/")
        assert response.status_code == 404 and b"b-private-model" not in response.content


def test_another_tenants_key_cannot_be_revoked_by_an_owner_404_or_a_member_403(world):
    people, key_b, secret_b, _log = world
    assert signed_in(people.alice).post(f"/console/keys/{key_b.pk}/revoke/").status_code == 404
    assert signed_in(people.bob).post(f"/console/keys/{key_b.pk}/revoke/").status_code == 403
    assert ApiKey.objects.authenticate(secret_b) is not None


# Each page as A's people see it: its status, and something of A's own it shows.
PAGES = {
    "/console/": (200, "a-own-model"),
    "/console/logs/": (200, "a-own-model"),
    "/console/statement/": (200, "Statement"),
    "/console/statement.csv": (200, "request_id"),
    "/console/keys/": (200, "a-own-key"),
    "/console/connect/": (200, "base_url"),
    "/console/people/": (200, "alice"),
}


@pytest.mark.parametrize("path", list(PAGES))
def test_no_page_shows_another_tenants_data_even_asked_by_its_ids(world, path):
    people, key_b, _secret, log_b = world
    status, own = PAGES[path]
    for who in (people.alice, people.bob):
        # B's ids, as the pages' filters take them.
        for query in (f"?key={key_b.pk}", f"?request_id={log_b.request_id}&model=b-private-model"):
            response = signed_in(who).get(path + query)
            body = b"".join(response) if response.streaming else response.content
            assert response.status_code == status, (path, query, response.status_code)
            if path == "/console/logs/":  # the filters apply to A's rows: none of them match B's ids
                assert b"No requests match." in body, (path, query)
            else:
                assert own.encode() in body, (path, query)  # the page rendered, with A's own
            shown = body
            for asked in re.findall(r"=([^&]+)", query):  # a filter's own field echoes what was asked
                shown = shown.replace(f'value="{asked}"'.encode(), b"")
            for secret_of_b in (log_b.request_id, "b-private-model", "b-private-key", key_b.prefix, "777.77",
                                "3.3333"):
                assert secret_of_b.encode() not in shown, (path, query, secret_of_b)


def test_searching_another_tenants_request_id_finds_nothing(world):
    people, _key, _secret, log_b = world
    page = signed_in(people.alice).get(f"/console/logs/?request_id={log_b.request_id}").content.decode()
    assert "No requests match." in page and f'href="/console/logs/{log_b.request_id}/"' not in page


def test_anonymous_visitors_are_sent_to_sign_in_from_every_page(world):
    _people, key_b, _secret, log_b = world
    client = Client()
    for path in ("/console/", "/console/logs/", f"/console/logs/{log_b.request_id}/", "/console/statement/",
                 "/console/statement.csv", "/console/keys/", "/console/connect/", "/console/people/"):
        assert client.get(path)["Location"].startswith("/console/login/?next=")
    for path in (f"/console/keys/{key_b.pk}/revoke/", f"/console/keys/{key_b.pk}/rotate/", "/console/people/",
                 f"/console/people/{_people.charlie.pk}/remove/"):
        assert client.post(path, {"grace": "0", "email": "x@example.com", "role": "owner"})["Location"].startswith(
            "/console/login/")
    assert ApiKey.objects.get(pk=key_b.pk).previous_hash is None


def test_another_tenants_key_cannot_be_rotated(world):
    people, key_b, secret_b, _log = world
    assert signed_in(people.alice).post(f"/console/keys/{key_b.pk}/rotate/", {"grace": "0"}).status_code == 404
    assert ApiKey.objects.authenticate(secret_b).previous_hash is None


def test_a_forged_csrf_token_on_a_key_change_is_403_and_nothing_changes(world):
    people, _key_b, _secret, _log = world
    key_a, secret_a = make_key(people.tenant_a)
    client = signed_in(people.alice, csrf_checks=True)
    assert client.post(f"/console/keys/{key_a.pk}/revoke/", {"csrfmiddlewaretoken": "f" * 64}).status_code == 403
    assert client.post("/console/keys/", {"name": "x", "csrfmiddlewaretoken": "f" * 64}).status_code == 403
    assert client.post(f"/console/keys/{key_a.pk}/rotate/",
                       {"grace": "0", "csrfmiddlewaretoken": "f" * 64}).status_code == 403
    assert client.post("/console/people/", {"email": "x@example.com", "role": "owner",
                                            "csrfmiddlewaretoken": "f" * 64}).status_code == 403
    assert ApiKey.objects.authenticate(secret_a) is not None and not ApiKey.objects.filter(label="x").exists()


def many_logs(tenant, keys, count: int, batch: str) -> None:
    now = timezone.now()
    RequestLog.objects.bulk_create(
        RequestLog(tenant=tenant, api_key=keys[n % len(keys)], request_id=f"bulk-{batch}-{n}",
                   created_at=now - dt.timedelta(minutes=n * 7), protocol="openai", model=f"m{n % 12}",
                   status="completed", input_tokens=n, output_tokens=1, charge_usd=Decimal("0.001"))
        for n in range(count)
    )


@pytest.mark.parametrize("path", ["/console/", "/console/logs/", "/console/logs/?before=2100-01-01T00:00:00%2B00:00,1",
                                  "/console/statement/", "/console/keys/", "/console/people/"])
def test_pages_cost_a_bounded_number_of_queries_whatever_the_rows(world, path, django_assert_max_num_queries):
    people = world[0]
    keys = [make_key(people.tenant_a)[0] for _ in range(12)]
    client = signed_in(people.alice)
    many_logs(people.tenant_a, keys, 30, "few")
    with django_assert_max_num_queries(12) as few:
        client.get(path)
    many_logs(people.tenant_a, keys, 3000, "many")
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(path).status_code == 200
