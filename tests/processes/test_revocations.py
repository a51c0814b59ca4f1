"""Key revocations told to every gateway process through Redis
(tenants.revocations): announced when the change commits, never
before and never for a change rolled back; the key's hash and a time go
out, never its secret; the earliest moment wins; each process's listener
marks the key refused in its cache the moment the message arrives, and
subscribes again after Redis was refused or went silent. The gateway
itself, through a database outage: tests/processes/test_revocations_gateway.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import timedelta
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
import redis as redis_lib
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from bench.tcp_proxy import TcpProxy
from gateway import auth
from gateway.auth import Caller
from tenants import revocations
from tenants.models import ApiKey, hash_secret
from tenants.revocations import MARKER_PREFIX, Refusal, Subscriber, channel_name
from tests.support.factories import make_key
from tests.support.outage_harness import through
from tests.support.processes import free_port

WAIT = 5.0  # every wait here is a hang detector


@pytest.fixture
def redis_url(settings) -> str:
    if not settings.REDIS_URL:
        pytest.skip("no REDIS_URL: revocations reach other processes through Redis only")
    return settings.REDIS_URL


@pytest.fixture
def store(redis_url) -> redis_lib.Redis:
    made = redis_lib.Redis.from_url(redis_url)
    yield made
    made.close()


@pytest.fixture
def listening(store, redis_url):
    """A subscription of the test's own on the revocation channel: what every
    gateway process hears."""
    pubsub = store.pubsub()
    pubsub.subscribe(channel_name(redis_url))

    def heard() -> list[list]:
        deadline = time.monotonic() + WAIT
        while (left := deadline - time.monotonic()) > 0:
            message = pubsub.get_message(timeout=left)
            if message is not None and message["type"] == "message":
                return json.loads(message["data"])
        raise AssertionError(f"nothing published within {WAIT} s")

    yield heard
    pubsub.close()


@pytest.fixture
def cached(monkeypatch):
    """This process's key cache, holding one live key (as a gateway does
    once it has served it), whose table never says it is revoked."""
    rows: dict[str, Caller] = {}

    def load(secret: str) -> Caller | None:
        return rows.get(secret)

    monkeypatch.setattr(auth.keys, "_load", load)
    auth.keys.clear()

    def hold(secret: str, key_id: int = 1) -> None:
        rows[secret] = Caller(key_id=key_id, key_prefix=secret[:11], tenant_id=1, tenant_name="acme",
                              allowed_models=frozenset(), rpm=None, concurrency=None, price_multiplier=Decimal(1))
        import asyncio

        assert asyncio.run(auth.keys.authenticate(secret)) is not None
        assert auth.keys.knows(secret)

    yield hold
    auth.keys.clear()


def marker(store: redis_lib.Redis, key: ApiKey) -> float | None:
    raw = store.get(MARKER_PREFIX + key.key_hash)
    return float(raw) if raw is not None else None


# -- announcing ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_revocation_is_published_when_it_commits_with_the_keys_hash_and_never_its_secret(
    store, listening, django_capture_on_commit_callbacks
):
    key, secret = make_key()
    with django_capture_on_commit_callbacks() as callbacks:
        key.revoke()
        assert marker(store, key) is None  # not before the commit
    assert len(callbacks) == 1
    callbacks[0]()
    heard = listening()
    assert heard == [[key.key_hash, key.revoked_at.timestamp()]]
    assert secret not in json.dumps(heard) and secret[len("hb-"):] not in json.dumps(heard)
    assert marker(store, key) == key.revoked_at.timestamp()
    # Kept as long as a process may serve a stale copy, and not for ever.
    assert settings.HOPBASE_STALE_MAX_AGE <= store.ttl(MARKER_PREFIX + key.key_hash) <= revocations.marker_ttl()


@pytest.mark.django_db
def test_a_revocation_rolled_back_is_never_announced(store, django_capture_on_commit_callbacks):
    key, _ = make_key()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            ApiKey.objects.get(pk=key.pk).revoke()
            raise RuntimeError("the change fails after the revocation")
    assert callbacks == []
    assert marker(store, key) is None


@pytest.mark.django_db
def test_the_admins_revoke_action_announces_every_key_it_revoked(admin_client, store, listening,
                                                                  django_capture_on_commit_callbacks):
    (first, _), (second, _), (kept, _) = make_key(), make_key(), make_key()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(reverse("admin:hopbase_apikey_changelist"),
                                     {"action": "revoke_keys", "_selected_action": [first.pk, second.pk]})
    assert response.status_code == 302
    first.refresh_from_db()
    second.refresh_from_db()
    assert sorted(listening()) == sorted([[k.key_hash, k.revoked_at.timestamp()] for k in (first, second)])
    assert marker(store, first) is not None and marker(store, second) is not None and marker(store, kept) is None


@pytest.mark.django_db
def test_a_revocation_from_the_tenant_console_is_announced(store, listening, settings,
                                                           django_capture_on_commit_callbacks):
    from console.keys import revoke_key
    from tests.support.console_cast import person

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # hashing at full cost is slow
    owner = person(make_key()[0].tenant, "owner", "owner")
    key, _ = make_key(owner.tenant)
    with django_capture_on_commit_callbacks(execute=True):
        revoke_key(owner, key.pk)
    key.refresh_from_db()
    assert listening() == [[key.key_hash, key.revoked_at.timestamp()]]


@pytest.mark.django_db
def test_a_rotation_announces_the_old_secret_refused_at_the_end_of_its_grace(
    store, listening, cached, django_capture_on_commit_callbacks
):
    key, old = make_key()
    old_hash = key.key_hash
    cached(old)
    with django_capture_on_commit_callbacks(execute=True):
        key.rotate(timedelta(hours=1))
    assert listening() == [[old_hash, key.previous_until.timestamp()]]
    assert auth.keys.knows(old)  # still within its grace in this process's cache
    with django_capture_on_commit_callbacks(execute=True):
        key.rotate(timedelta(hours=1))
    heard = listening() + listening()  # the new previous secret's end, and the earlier one's
    assert [old_hash, pytest.approx(time.time(), abs=5)] in heard  # no longer the previous secret: refused now
    assert not auth.keys.knows(old)


@pytest.mark.django_db
def test_an_expiry_is_announced_a_label_is_not(admin_client, store, listening, django_capture_on_commit_callbacks):
    key, _ = make_key()
    soon = timezone.now() + timedelta(minutes=5)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        key.label = "renamed"
        key.save(update_fields=["label"])
        assert callbacks == []
        response = admin_client.post(
            reverse("admin:hopbase_apikey_change", args=[key.pk]),
            {"label": "renamed", "allowed_models": "", "expires_at_0": soon.strftime("%Y-%m-%d"),
             "expires_at_1": soon.strftime("%H:%M:%S")},
        )
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.expires_at is not None
    assert listening() == [[key.key_hash, key.expires_at.timestamp()]]


@pytest.mark.django_db
def test_the_earliest_moment_wins_in_redis_and_in_the_cache(store, cached):
    key, secret = make_key()
    cached(secret)
    now = time.time()
    revocations.publish([Refusal(key.key_hash, now - 1)])
    revocations.publish([Refusal(key.key_hash, now + 3600)])  # a later expiry crossing it
    assert marker(store, key) == now - 1
    assert not auth.keys.knows(secret)


def test_without_redis_the_process_itself_still_learns_at_once(settings, cached):
    settings.REDIS_URL = None
    secret = "hb-" + "k" * 40
    cached(secret)
    assert revocations.publish([Refusal(hash_secret(secret), time.time())]) is False  # nobody else told
    assert not auth.keys.knows(secret)


def test_a_redis_that_refuses_costs_the_revoker_one_short_timeout_and_no_error(caplog, cached):
    secret = "hb-" + "r" * 40
    cached(secret)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hopbase.revocations"):
        refusals = [Refusal(hash_secret(f"hb-{i}"), time.time(), f"hb-{i}") for i in range(revocations.BATCH + 1)]
        assert revocations.publish([*refusals, Refusal(hash_secret(secret), time.time(), "hb-rrrrrrrr")],
                                   url=f"redis://127.0.0.1:{free_port()}/3") is False
    assert time.monotonic() - started < 2 * revocations.PUBLISH_TIMEOUT + 0.5  # one batch tried, not two
    assert not auth.keys.knows(secret)  # this process knows all the same
    warnings = [r.getMessage() for r in caplog.records if "could not tell the gateways" in r.getMessage()]
    assert len(warnings) == 1 and "502 key(s)" in warnings[0]


# -- listening -----------------------------------------------------------------------


class Told:
    """What a listener handed to the cache, one batch per message."""

    def __init__(self) -> None:
        self.batches: list[list[Refusal]] = []
        self._changed = threading.Condition()

    def __call__(self, refusals: list[Refusal]) -> None:
        revocations.refuse_here(refusals)
        with self._changed:
            self.batches.append(refusals)
            self._changed.notify_all()

    def wait(self, messages: int = 1) -> list[str]:
        """The key hashes of the first ``messages`` messages, once they are in."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.batches) >= messages, WAIT), \
                f"the listener was told {len(self.batches)} message(s) within {WAIT} s, not {messages}"
            return [r.key_hash for batch in self.batches[:messages] for r in batch]


@pytest.fixture
def subscriber():
    started: list[Subscriber] = []

    def start(url: str, told: Told) -> Subscriber:
        started.append(Subscriber(url, told).start())
        assert started[-1].subscribed.wait(WAIT), "not subscribed"
        return started[-1]

    yield start
    for each in started:
        assert each.stop(WAIT), "the listener did not stop"


def announce_elsewhere(store: redis_lib.Redis, url: str, secret: str) -> None:
    """What another process's publish sends (this process's cache untouched)."""
    store.publish(channel_name(url), json.dumps([[hash_secret(secret), time.time()]]))


def test_the_listener_marks_a_cached_key_refused_the_moment_the_message_arrives(store, redis_url, cached,
                                                                                 subscriber):
    secret = "hb-" + "l" * 40
    cached(secret)
    told = Told()
    listener = subscriber(redis_url, told)
    announce_elsewhere(store, redis_url, secret)
    assert told.wait() == [hash_secret(secret)]
    assert not auth.keys.knows(secret)
    assert listener.received == 1


def test_a_message_that_is_not_ours_is_dropped_and_the_listener_goes_on(store, redis_url, cached, subscriber,
                                                                         caplog):
    secret = "hb-" + "m" * 40
    cached(secret)
    told = Told()
    subscriber(redis_url, told)
    with caplog.at_level(logging.WARNING, logger="hopbase.revocations"):
        store.publish(channel_name(redis_url), b'{"not": "ours"}')
        store.publish(channel_name(redis_url), json.dumps([["hb-a-secret-not-a-hash", 1.0]]))
        announce_elsewhere(store, redis_url, secret)
        assert told.wait(3) == [hash_secret(secret)]
    assert not auth.keys.knows(secret)
    assert sum("dropped a message" in r.message for r in caplog.records) == 2
    assert "hb-a-secret-not-a-hash" not in caplog.text


@pytest.mark.parametrize("outage", ["refuse", "silence"])
def test_the_listener_subscribes_again_after_redis_was_refused_or_went_silent(store, redis_url, cached, subscriber,
                                                                              monkeypatch, outage):
    monkeypatch.setattr(revocations, "QUIET", 0.2)  # a silent host is noticed by an unanswered PING
    monkeypatch.setattr(revocations, "PONG_TIMEOUT", 0.3)
    monkeypatch.setattr(revocations, "RETRY_LAST", 0.5)
    parts = urlsplit(redis_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
    try:
        through_proxy = through(redis_url, proxy)
        told = Told()
        listener = subscriber(through_proxy, told)
        getattr(proxy, outage)()
        assert listener.lost.wait(WAIT), "the lost subscription went unnoticed"
        assert not listener.subscribed.is_set()
        proxy.restore()
        assert listener.subscribed.wait(WAIT), "not subscribed again"
        secret = "hb-" + outage[0] * 40
        cached(secret)
        announce_elsewhere(store, redis_url, secret)
        assert told.wait() == [hash_secret(secret)]
        assert not auth.keys.knows(secret)
    finally:
        proxy.stop()
