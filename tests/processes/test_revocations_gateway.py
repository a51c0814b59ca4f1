"""A key revoked during a database outage, through a real gateway (D3): the
gateway cannot read the database (a loopback proxy the test controls refuses it), the test process revokes the key in the real database,
and the gateway refuses the key at once, in the caller's format, while the
database is still out of its reach: by the announcement it hears on Redis,
or, when it was cut off from Redis as the announcement went out, by the
marker the announcement left there, read on the stale path.

Before, the key was served from the gateway's cached copy for
HOPBASE_CONFIG_TTL (60 s for the first gateway here) and then, the database
still unreachable, for HOPBASE_STALE_MAX_AGE (600 s)."""

from __future__ import annotations

import time

import pytest

from tenants.models import ApiKey, Tenant
from tests.support.outage_harness import HANG, Rig, start_rig, wait_for_revocation_listener, warm_up

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

APIS = ("chat", "responses", "messages", "gemini")
# The refusal of an unknown or revoked key, in each API's own format (tests/processes/test_intake.py).
REFUSED = {
    "chat": (401, lambda body: body["error"]["code"] == "invalid_api_key"),
    "responses": (401, lambda body: body["error"]["code"] == "invalid_api_key"),
    "messages": (401, lambda body: body["error"]["type"] == "authentication_error"),
    "gemini": (400, lambda body: body["error"]["details"][0]["reason"] == "API_KEY_INVALID"),
}
# Far below what served the key before (the TTL, then the stale max age):
# the time for Redis to carry a message and the gateway to read it.
AT_ONCE = 1.0


def needs_outages(rig: Rig) -> None:
    if rig.database is None:
        pytest.skip("SQLite: a database file cannot be cut off")
    if rig.redis is None:
        pytest.skip("no REDIS_URL: revocations reach other processes through Redis only")


@pytest.fixture(scope="module")
def steady(world, django_db_blocker):
    """A gateway that trusts what it read of a key for a minute: within that
    only the announcement can refuse it."""
    with django_db_blocker.unblock():
        built = start_rig(world, {"HOPBASE_CONFIG_TTL": "60"})
    yield built
    built.stop()


@pytest.fixture(scope="module")
def stale(world, django_db_blocker):
    """A gateway that trusts a key for half a second: past that, with the
    database down, what it serves is its stale copy."""
    with django_db_blocker.unblock():
        built = start_rig(world)
    yield built
    built.stop()


def new_key(rig: Rig) -> tuple[ApiKey, str]:
    return ApiKey.objects.issue(Tenant.objects.get(pk=rig.tenant_id), label="revoked during an outage")


def refused_within(rig: Rig, secret: str, seconds: float) -> float:
    """Send until the key is refused; how long that took, asserted under
    ``seconds``. Each API's refusal is then checked in its own format."""
    started = time.monotonic()
    while (answer := rig.send("chat", "still? [sim tokens=1]", key=secret)).status == 200:
        assert time.monotonic() - started < seconds, f"the revoked key was still served after {seconds} s"
    took = time.monotonic() - started
    assert answer.status == 401, answer.body
    for api in APIS:
        answer = rig.send(api, "hi", key=secret)
        status, in_its_format = REFUSED[api]
        assert answer.status == status and in_its_format(answer.json()), (api, answer.status, answer.body)
    return took


def test_a_key_revoked_during_a_database_outage_is_refused_at_once_through_redis(steady):
    needs_outages(steady)
    row, secret = new_key(steady)
    warm_up(steady)
    warm_up(steady, secret)
    wait_for_revocation_listener(steady)
    steady.database.refuse()
    try:
        assert steady.send("chat", "served from the cache [sim tokens=1]", key=secret).status == 200
        ApiKey.objects.get(pk=row.pk).revoke()  # the test process reaches the real database
        refused_within(steady, secret, AT_ONCE)
        assert steady.send("chat", "the others are served [sim tokens=1]").status == 200
    finally:
        steady.database.restore()


def test_a_gateway_cut_off_from_redis_at_the_revocation_finds_it_on_the_stale_path(stale):
    needs_outages(stale)
    row, secret = new_key(stale)
    warm_up(stale)
    warm_up(stale, secret)
    wait_for_revocation_listener(stale)
    stale.redis.refuse()  # the announcement will not reach this gateway
    stale.database.refuse()
    try:
        ApiKey.objects.get(pk=row.pk).revoke()  # announced: a message it misses, a marker it can read
        stale.redis.restore()
        # Served (from its copy) until that copy is stale, then refused: the
        # database is still out of reach, so the marker is all that tells.
        refused_within(stale, secret, HANG)
        assert stale.send("chat", "the others are served [sim tokens=1]").status == 200
    finally:
        stale.redis.restore()
        stale.database.restore()
