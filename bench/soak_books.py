"""The soak's database and its books: a fresh PostgreSQL database of its own,
the tenant, key, channels and prices the soak's traffic is served with, and
what the database and Redis say once everything has ended.

Django is set up in the soak's own process (``setup_django``) on the soak's
database and Redis, reached directly; the gateways and the worker reach
Redis through the soak's proxy.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from urllib.parse import unquote, urlsplit, urlunsplit

from bench.soak_traffic import MODELS, Outcome

DATABASE_PREFIX = "hopbase_soak"
PROTOCOLS = ("openai", "anthropic", "gemini")
PROTOCOL_MODEL = {"openai": MODELS["chat"], "anthropic": MODELS["messages"], "gemini": MODELS["gemini"]}


# --------------------------------------------------------------------------- the database


def soak_database_url(url: str) -> str:
    """The soak's database on ``url``'s server: the database ``url`` names
    when its name starts with hopbase_soak, else one named hopbase_soak. It
    is made afresh and dropped at the end, so it is never anyone else's."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"the soak needs PostgreSQL, not {url!r}")
    name = unquote(parts.path.lstrip("/"))
    if not name.startswith(DATABASE_PREFIX):
        parts = parts._replace(path="/" + DATABASE_PREFIX)
    return urlunsplit(parts)


def database_name(url: str) -> str:
    return unquote(urlsplit(url).path.lstrip("/"))


def _maintenance(url: str):
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1", port=parts.port or 5432, user=unquote(parts.username or ""),
        password=unquote(parts.password or "") or None, dbname="postgres", autocommit=True, connect_timeout=10,
    )


def create_database(url: str) -> None:
    """A fresh, empty database (a leftover of an earlier soak of that name is dropped)."""
    name = database_name(url)
    assert name.startswith(DATABASE_PREFIX), name
    with _maintenance(url) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    from django.db import connections

    connections.close_all()
    name = database_name(url)
    assert name.startswith(DATABASE_PREFIX), name
    with _maintenance(url) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(database_url: str, redis_url: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ["REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "hopbase.settings"
    import django

    django.setup()


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# --------------------------------------------------------------------------- what is served


@dataclass
class World:
    tenant_id: int
    key: str
    key_id: int
    key_concurrency: int
    # channel name -> (id, max_concurrency or None)
    channels: dict[str, tuple[int, int | None]] = field(default_factory=dict)

    def slot_names(self) -> list[str]:
        """The names of the sorted sets of leases the limits keep in Redis."""
        return [f"key:{self.key_id}"] + [f"channel:{cid}" for cid, _ in self.channels.values()]


def make_world(simulator_url: str, key_concurrency: int, channel_concurrency: int) -> World:
    """A tenant with money, a key with a concurrency limit (and a generous
    rate limit, so both of its counters live in Redis), two channels per
    protocol (one limited to ``channel_concurrency`` open requests), and
    prices. The key's and channels' ids are drawn at random, far above what a
    database hands out, so their counters in Redis are this soak's alone even
    in a Redis database something else uses too."""
    from billing.ledger import top_up
    from billing.models import ModelPrice
    from channels_pool.models import Channel
    from tenants.models import ApiKey, Tenant

    base = random.SystemRandom().randrange(10**12, 2 * 10**12, 100)
    tenant = Tenant.objects.create(name=f"soak-{base}")
    top_up(tenant, Decimal("1000000"), note="soak credit")
    key_row, secret = ApiKey.objects.issue(tenant, id=base, label="soak", concurrency=key_concurrency, rpm=1_000_000)
    world = World(tenant.pk, secret, key_row.pk, key_concurrency)
    for number, protocol in enumerate(PROTOCOLS):
        model = PROTOCOL_MODEL[protocol]
        ModelPrice.objects.create(model=model, input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
                                  cache_read_usd_per_mtok=Decimal("0.3"), cache_write_usd_per_mtok=Decimal("3.75"))
        base_url = simulator_url + "/v1" if protocol == "openai" else simulator_url
        for suffix, limit in (("limited", channel_concurrency), ("open", None)):
            channel = Channel.objects.create(
                id=base + 1 + 2 * number + (limit is None), name=f"soak-{protocol}-{suffix}", protocol=protocol,
                base_url=base_url, secret="sk-soak", served_models=[model], max_concurrency=limit,
            )
            world.channels[channel.name] = (channel.pk, limit)
    return world


# --------------------------------------------------------------------------- the books


def refused_before_the_key(outcome: Outcome) -> bool:
    """Answers given before the key was read, or without a key the gateway
    could check: they carry a request id but leave no request log (docs/operations.md:
    Failure handling, Outages)."""
    from core.errors import DatabaseUnavailable
    from serving.admission import DRAINING, FULL

    if outcome.status == 401:
        return True
    if outcome.status in (429, 503, 529) and outcome.connection_close and outcome.error_message in (DRAINING, FULL):
        return True
    return outcome.status == 503 and outcome.error_message == DatabaseUnavailable().message


@dataclass
class Books:
    requests_sent: int
    with_request_id: int
    refused_before_key: int
    without_request_id: int
    rows: int
    rows_missing: list[str]
    rows_unseen_by_client: int
    double_charges: int
    unsettled: int
    charges: int
    charged_usd: Decimal
    row_statuses: Counter
    client_statuses: Counter
    client_endings: Counter
    scenarios: Counter


def books(world: World, outcomes: list[Outcome]) -> Books:
    from django.db.models import Count, Sum

    from billing.models import LedgerEntry, RequestLog

    expected = {o.request_id for o in outcomes if o.request_id and not refused_before_the_key(o)}
    seen = {o.request_id for o in outcomes if o.request_id}
    logs = RequestLog.objects.filter(tenant_id=world.tenant_id)
    row_ids = set(logs.values_list("request_id", flat=True))
    charges = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.CHARGE, request_log__tenant_id=world.tenant_id)
    doubled = charges.values("request_log").annotate(n=Count("id")).filter(n__gt=1).count()
    return Books(
        requests_sent=len(outcomes),
        with_request_id=len(seen),
        refused_before_key=sum(1 for o in outcomes if o.request_id and refused_before_the_key(o)),
        without_request_id=sum(1 for o in outcomes if not o.request_id),
        rows=logs.count(),
        rows_missing=sorted(expected - row_ids),
        rows_unseen_by_client=len(row_ids - seen),
        double_charges=doubled,
        unsettled=logs.filter(settled_at__isnull=True).count(),
        charges=charges.count(),
        charged_usd=-(charges.aggregate(total=Sum("amount_usd"))["total"] or Decimal("0")),
        row_statuses=Counter(logs.values_list("status", flat=True)),
        client_statuses=Counter(str(o.status) if o.status is not None else "none" for o in outcomes),
        client_endings=Counter(o.ended for o in outcomes),
        scenarios=Counter(o.scenario for o in outcomes),
    )


# --------------------------------------------------------------------------- Redis


def live_leases(redis_url: str, world: World) -> dict[str, int]:
    """Open slots of the soak's key and channels that Redis still counts
    (leases not yet lapsed), read as ``gateway.governance.limits`` keeps them."""
    import redis

    from gateway.governance.limits import SLOTS_PREFIX

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        return {name: client.zcount(SLOTS_PREFIX + name, f"({now_ms}", "+inf") for name in world.slot_names()}
    finally:
        client.close()


def redis_now(redis_url: str) -> float:
    """Redis's clock, in seconds: what lease scores are measured by."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        seconds, micros = client.time()
        return seconds + micros / 1e6
    finally:
        client.close()


def live_lease_times(redis_url: str, world: World) -> list[tuple[str, str, float]]:
    """Each live lease of the soak's key and channels (the slot's name, the
    lease's own id), with when it was taken (Redis's clock, seconds): its
    lapse moment less the lease time."""
    import redis

    from gateway.governance.limits import LEASE_SECONDS, SLOTS_PREFIX

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        now_ms = redis_now(redis_url) * 1000
        found = []
        for name in world.slot_names():
            for lease, score in client.zrangebyscore(SLOTS_PREFIX + name, f"({now_ms}", "+inf", withscores=True):
                found.append((name, lease.decode(), score / 1000 - LEASE_SECONDS))
        return sorted(found, key=lambda item: item[2])
    finally:
        client.close()


def forget_counters(redis_url: str, world: World) -> None:
    """Remove the soak's own counters from Redis (nothing else's)."""
    import redis

    from gateway.governance.limits import SLOTS_PREFIX

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        names = [SLOTS_PREFIX + name for name in world.slot_names()]
        names += list(client.scan_iter(match=f"hopbase:rpm:key:{world.key_id}:*", count=1000))
        client.delete(*names)
    finally:
        client.close()
