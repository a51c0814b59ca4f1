"""Keys through a database outage (D3): a key already known is served from
what was last learnt of it, up to HOPBASE_STALE_MAX_AGE; a key never seen
is "cannot check now" (503 in the caller's format, with retry-after), never
"no such key"."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import replace
from decimal import Decimal

import pytest
from django.db import OperationalError
from django.test import AsyncClient

from core import dependencies, snapshots
from core.dependencies import LoopRedis
from core.errors import DatabaseUnavailable
from gateway import auth
from gateway.auth import Caller, KeyCache
from tenants import revocations
from tenants.models import hash_secret

KNOWN = "hb-known-key"
OTHER = "hb-other-key"


@pytest.fixture(autouse=True)
def database_up():
    dependencies.database.reset()
    yield
    dependencies.database.reset()


@pytest.fixture
def quick(settings, monkeypatch):
    settings.HOPBASE_CONFIG_TTL = 0.05
    settings.HOPBASE_STALE_MAX_AGE = 60
    monkeypatch.setattr(snapshots, "DEADLINE", 0.3)
    monkeypatch.setattr(dependencies.database, "pause", 0.2)


def caller(key_id: int = 1) -> Caller:
    return Caller(
        key_id=key_id, key_prefix="hb-known", tenant_id=7, tenant_name="acme", allowed_models=frozenset(),
        rpm=None, concurrency=None, price_multiplier=Decimal("1"),
    )


class Keys:
    """The key table, behind a database that can go down."""

    def __init__(self) -> None:
        self.rows: dict[str, Caller] = {KNOWN: caller()}
        self.down = False
        self.calls: list[str] = []

    def __call__(self, secret: str) -> Caller | None:
        self.calls.append(secret)
        if self.down:
            raise OperationalError("could not connect to server: Connection refused")
        return self.rows.get(secret)


def test_a_known_key_is_served_from_the_last_state_while_the_database_is_down(quick):
    table = Keys()
    cache = KeyCache(table)

    async def scenario() -> None:
        assert await cache.authenticate(KNOWN) == caller()
        table.down = True
        await asyncio.sleep(0.06)  # past the TTL
        for _ in range(10):
            started = time.monotonic()
            assert await cache.authenticate(KNOWN) == caller()
            assert time.monotonic() - started < 0.1
        table.down = False
        table.rows.pop(KNOWN)  # revoked meanwhile
        await asyncio.sleep(0.25)  # the pause: the next request's refresh runs in the background
        deadline = time.monotonic() + 2
        while await cache.authenticate(KNOWN) is not None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    asyncio.run(scenario())


def test_a_key_never_seen_is_unavailable_not_unknown(quick):
    table = Keys()
    table.down = True
    cache = KeyCache(table)

    async def scenario() -> None:
        with pytest.raises(DatabaseUnavailable):
            await cache.authenticate(KNOWN)
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            await cache.authenticate(OTHER)  # the database is known to be down: at once
        assert time.monotonic() - started < 0.05

    asyncio.run(scenario())
    assert len(table.calls) == 1


def test_a_key_that_is_not_a_hopbase_key_needs_no_database(quick):
    table = Keys()
    table.down = True
    assert asyncio.run(KeyCache(table).authenticate("sk-not-ours")) is None
    assert table.calls == []


def test_a_known_key_is_served_up_to_the_stale_max_age_only(quick, settings):
    settings.HOPBASE_STALE_MAX_AGE = 0.3
    table = Keys()
    cache = KeyCache(table)

    async def scenario() -> None:
        await cache.authenticate(KNOWN)
        table.down = True
        await asyncio.sleep(0.1)
        assert await cache.authenticate(KNOWN) == caller()
        await asyncio.sleep(0.3)
        with pytest.raises(DatabaseUnavailable):
            await cache.authenticate(KNOWN)

    asyncio.run(scenario())


def test_a_flood_of_unknown_keys_does_not_push_out_the_known_ones(quick, monkeypatch):
    monkeypatch.setattr(auth, "MAX_UNKNOWN_KEYS", 10)
    table = Keys()
    cache = KeyCache(table)

    async def scenario() -> None:
        await cache.authenticate(KNOWN)
        for i in range(100):
            assert await cache.authenticate(f"hb-random-{i}") is None
        table.down = True
        await asyncio.sleep(0.06)
        assert await cache.authenticate(KNOWN) == caller()

    asyncio.run(scenario())
    assert len(cache._unknown) == 10


def test_a_silent_database_costs_a_new_key_the_deadline_at_most(quick):
    table = Keys()
    release = threading.Event()

    def hanging(secret: str) -> Caller | None:
        release.wait(10)
        return None

    cache = KeyCache(hanging)

    async def scenario() -> float:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            await cache.authenticate(OTHER)
        return time.monotonic() - started

    try:
        assert asyncio.run(scenario()) < 0.6
    finally:
        release.set()
    assert table.calls == []


@pytest.mark.parametrize(
    ("path", "headers", "status", "check"),
    [
        ("/v1/chat/completions", {"authorization": f"Bearer {OTHER}"}, 503,
         lambda body: body["error"]["type"] == "server_error"),
        ("/v1/messages", {"x-api-key": OTHER}, 503,
         lambda body: body == {"type": "error", "error": {"type": "api_error", "message": body["error"]["message"]}}),
        (f"/v1beta/models/sim-model:generateContent?key={OTHER}", {}, 503,
         lambda body: body["error"]["status"] == "UNAVAILABLE" and body["error"]["code"] == 503),
    ],
)
def test_the_caller_hears_503_in_its_own_format_with_retry_after(quick, monkeypatch, path, headers, status, check):
    table = Keys()
    table.down = True
    monkeypatch.setattr(auth.keys, "_load", table)
    auth.keys.clear()

    async def scenario():
        return await AsyncClient().post(path, data={"model": "sim-model"}, content_type="application/json", headers=headers)

    try:
        response = asyncio.run(scenario())
    finally:
        auth.keys.clear()
    assert response.status_code == status
    assert response["content-type"] == "application/json"
    assert int(response["retry-after"]) > 0
    assert "x-should-retry" not in response  # a retry is what mends it
    assert check(response.json())


# -- the caches let the least recently used go ------------------------


def test_the_key_cache_lets_the_least_recently_used_key_go_first(quick, monkeypatch):
    monkeypatch.setattr(auth, "MAX_CACHED_KEYS", 3)
    table = Keys()
    table.rows = {f"hb-key-{i}": caller(i) for i in range(5)}
    cache = KeyCache(table)

    async def scenario() -> None:
        for i in range(3):
            await cache.authenticate(f"hb-key-{i}")
        await cache.authenticate("hb-key-0")  # used again: now the most recent
        await cache.authenticate("hb-key-3")  # one too many: key 1, the least recent, goes

    asyncio.run(scenario())
    assert len(cache._known) == 3
    assert [cache.knows(f"hb-key-{i}") for i in range(4)] == [True, False, True, True]
    assert cache._known  # never wiped whole


def test_unknown_keys_too_let_the_least_recently_used_go_first(quick, monkeypatch, settings):
    monkeypatch.setattr(auth, "MAX_UNKNOWN_KEYS", 2)
    settings.HOPBASE_CONFIG_TTL = 60
    table = Keys()
    cache = KeyCache(table)

    async def scenario() -> None:
        await cache.authenticate("hb-nope-a")
        await cache.authenticate("hb-nope-b")
        await cache.authenticate("hb-nope-a")  # answered from the cache, and now the most recent
        await cache.authenticate("hb-nope-c")

    asyncio.run(scenario())
    assert list(cache._unknown) == [auth.hash_secret("hb-nope-a"), auth.hash_secret("hb-nope-c")]
    assert table.calls == ["hb-nope-a", "hb-nope-b", "hb-nope-c"]


# -- expiry (ApiKey.expires_at) ------------------------------------------------------


def test_a_cached_key_is_refused_from_the_moment_it_expires(quick, settings):
    settings.HOPBASE_CONFIG_TTL = 60  # the cached copy is fresh throughout
    table = Keys()
    table.rows[KNOWN] = replace(caller(), expires_at=time.time() + 0.2)
    cache = KeyCache(table)

    async def scenario() -> None:
        assert await cache.authenticate(KNOWN) is not None
        assert cache.knows(KNOWN)
        await asyncio.sleep(0.25)
        assert await cache.authenticate(KNOWN) is None
        assert not cache.knows(KNOWN)

    asyncio.run(scenario())
    assert table.calls == [KNOWN]  # no database needed to refuse it


@pytest.mark.django_db
def test_the_database_finds_no_expired_key():
    from datetime import timedelta

    from django.utils import timezone

    from tenants.models import ApiKey, Tenant

    tenant = Tenant.objects.create(name="expiring")
    _, past = ApiKey.objects.issue(tenant, expires_at=timezone.now() - timedelta(seconds=1))
    row, future = ApiKey.objects.issue(tenant, expires_at=timezone.now() + timedelta(days=1))
    _, never = ApiKey.objects.issue(tenant)
    assert ApiKey.objects.authenticate(past) is None
    assert ApiKey.objects.authenticate(future) == row
    assert ApiKey.objects.authenticate(never) is not None
    loaded = auth._load(future)
    assert loaded is not None and loaded.expires_at == pytest.approx(row.expires_at.timestamp())
    assert auth._load(past) is None


@pytest.mark.django_db
def test_a_rotated_keys_old_secret_is_loaded_with_its_own_prefix_and_the_grace_as_its_end():
    from datetime import timedelta

    from tenants.models import ApiKey, Tenant

    key, old = ApiKey.objects.issue(Tenant.objects.create(name="rotating"))
    new = key.rotate(timedelta(minutes=10))
    previous, current = auth._load(old), auth._load(new)
    assert previous.key_id == current.key_id == key.pk
    assert (previous.key_prefix, current.key_prefix) == (old[:11], new[:11])
    assert previous.expires_at == pytest.approx(key.previous_until.timestamp()) and current.expires_at is None


# -- revocations announced through Redis (tenants.revocations) -----------


class Markers:
    """What Redis remembers of keys refused lately, and how often it is asked."""

    def __init__(self) -> None:
        self.moments: dict[str, float] = {}
        self.asked = 0

    async def __call__(self, digest: str) -> float | None:
        self.asked += 1
        return self.moments.get(digest)


def test_a_key_revoked_while_the_database_is_down_is_refused_on_the_stale_path(quick):
    table = Keys()
    markers = Markers()
    cache = KeyCache(table, markers)

    async def scenario() -> None:
        assert await cache.authenticate(KNOWN) == caller()
        table.down = True
        await asyncio.sleep(0.06)  # past the TTL: what is served now is the stale copy
        assert await cache.authenticate(KNOWN) == caller()  # nothing remembered: served
        # Revoked, and announced while this process was cut off from Redis.
        markers.moments[hash_secret(KNOWN)] = time.time() - 1
        assert await cache.authenticate(KNOWN) is None
        assert not cache.knows(KNOWN)
        asked = markers.asked
        assert await cache.authenticate(KNOWN) is None
        assert markers.asked == asked  # known to be refused: Redis is not asked again

    asyncio.run(scenario())


def test_redis_is_never_asked_on_the_normal_path(quick):
    table = Keys()
    markers = Markers()
    markers.moments[hash_secret(KNOWN)] = time.time() - 1
    cache = KeyCache(table, markers)

    async def scenario() -> None:
        for _ in range(3):
            assert await cache.authenticate(KNOWN) == caller()  # loaded, then fresh
        await asyncio.sleep(0.06)
        assert await cache.authenticate(KNOWN) == caller()  # refreshed from a database that answers

    asyncio.run(scenario())
    assert markers.asked == 0
    assert len(table.calls) == 2


def test_an_announcement_only_ever_brings_a_refusal_earlier(quick):
    cache = KeyCache(Keys(), Markers())
    asyncio.run(cache.authenticate(KNOWN))
    digest, soon = hash_secret(KNOWN), time.time() + 60
    assert cache.refuse(digest, soon)
    assert not cache.refuse(digest, soon + 60)  # a later expiry crossing it changes nothing
    assert cache.knows(KNOWN)  # refused from ``soon`` on, not yet
    assert cache.refuse(digest, time.time() - 1)
    assert not cache.knows(KNOWN)
    assert not cache.refuse(hash_secret(OTHER), time.time())  # not held: the database is asked next time


def test_the_stale_path_reads_the_marker_a_revocation_left_in_redis(quick, settings, monkeypatch):
    if not settings.REDIS_URL:
        pytest.skip("no REDIS_URL")
    monkeypatch.setattr(revocations, "_redis", LoopRedis())  # clients of this test's own event loop
    dependencies.redis.reset()
    secret = f"hb-stale-{uuid.uuid4().hex}"
    table = Keys()
    table.rows[secret] = caller(2)
    cache = KeyCache(table)  # a process that heard nothing: only Redis's marker tells

    async def scenario() -> None:
        assert await cache.authenticate(secret) == caller(2)
        table.down = True
        await asyncio.sleep(0.06)
        assert await cache.authenticate(secret) == caller(2)
        revocations.publish([revocations.Refusal(hash_secret(secret), time.time())])
        assert await cache.authenticate(secret) is None

    asyncio.run(scenario())


def test_a_burst_of_requests_with_a_key_this_process_has_not_seen_looks_it_up_once(quick, monkeypatch):
    monkeypatch.setattr(snapshots, "DEADLINE", 5)  # the slow load below is not an outage
    # A process just started, or a key just made, under load: one query for
    # all of them, not one each (their queue would pass the deadline, and
    # trip the breaker for every other key too).
    table = Keys()
    slow = threading.Event()

    def slow_table(secret: str) -> Caller | None:
        slow.wait(0.1)
        return table(secret)

    cache = KeyCache(slow_table)

    async def scenario() -> list:
        waiting = [asyncio.ensure_future(cache.authenticate(KNOWN)) for _ in range(200)]
        await asyncio.sleep(0.01)
        waiting[0].cancel()  # one client gives up: the look-up goes on for the rest
        return await asyncio.gather(*waiting[1:])

    assert asyncio.run(scenario()) == [caller()] * 199
    assert table.calls == [KNOWN]


def test_while_one_request_refreshes_a_key_the_others_get_the_copy_at_once_even_in_the_same_pass(quick, monkeypatch):
    monkeypatch.setattr(snapshots, "DEADLINE", 5)  # the slow refresh below is not an outage
    table = Keys()
    slow = threading.Event()
    cache = KeyCache(lambda secret: (slow.wait(0.3) if table.calls else None, table(secret))[1])

    async def scenario() -> list[float]:
        assert await cache.authenticate(KNOWN) == caller()
        await asyncio.sleep(0.06)  # past the TTL

        async def timed() -> float:
            started = time.monotonic()
            assert await cache.authenticate(KNOWN) == caller()
            return time.monotonic() - started

        return await asyncio.gather(*(timed() for _ in range(10)))

    waits = asyncio.run(scenario())
    assert sum(waited < 0.1 for waited in waits) == 9  # only the refreshing one waits
    assert len(table.calls) == 2
