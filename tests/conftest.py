"""Shared fixtures.

Integration tests run the real thing: the upstream simulator and a Daphne
gateway as processes, on the test database (PostgreSQL in CI), with short
timers. Their data is created once per session and committed, so the gateway
process sees it; tests that run it are marked ``gateway`` and run last, so
their committed rows cannot surprise the unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

import httpx
import pytest
from django.conf import settings

# Shared check modules: let pytest explain their failed asserts too.
pytest.register_assert_rewrite(
    "tests.protocol_checks", "tests.command_checks", "tests.settlement_checks", "tests.relay_checks", "tests.relay_fakes"
)

from hopbase import collector  # noqa: E402
from tests.processes import Service, start_gateway, start_simulator  # noqa: E402

# Requests served in this process (hopbase.asgi's handler, called directly)
# leave its garbage collector as Python sets it: settling is a gateway
# process's, tested on its own (tests/test_collector.py).
collector.settled = True

pytest_plugins = ["tests.sdk_clients"]

# Short timers so every failure rule can be exercised in about a second.
GATEWAY_TIMERS = {
    "HOPBASE_KEEPALIVE_INTERVAL": "0.4",
    "HOPBASE_STALL_TIMEOUT": "1.5",
    "HOPBASE_HOLD_MAX": "4",
    "HOPBASE_FIRST_TOKEN_TIMEOUT": "1",
    "HOPBASE_FIRST_TOKEN_PER_10K": "1",
    "HOPBASE_CONFIG_TTL": "0.5",
    "HOPBASE_LOG_FLUSH_INTERVAL": "0.05",
    "HOPBASE_MAX_BODY_BYTES": "65536",
    "HOPBASE_CAPACITY_WAIT": "1",
    # Scenario channels fail on every request; the breaker has its own test.
    "HOPBASE_BREAKER_FAILURES": "1000000",
    # Many tests send bad keys from 127.0.0.1; the throttle has its own gateway (test_auth_throttle).
    "HOPBASE_AUTH_FAILURES": "100000",
}

PROTOCOLS = ("openai", "anthropic", "gemini")

# model -> [(channel suffix, simulator directives in the channel key, priority)]
# The simulator reads `sim:k=v,...` keys as behaviour, so each channel below
# misbehaves in one way, always, for every request.
SCENARIOS: dict[str, list[tuple[str, str, int]]] = {
    "sim-model": [("main", "ok", 0)],
    "claude-sim": [("main", "ok", 0)],
    "failover-http": [("bad", "status=500", 10), ("good", "ok", 0)],
    "failover-busy": [("bad", "status=529", 10), ("good", "ok", 0)],
    "failover-event": [("bad", "error_after_preamble=overloaded", 10), ("good", "ok", 0)],
    "failover-key": [("bad", "status=401", 10), ("good", "ok", 0)],
    "failover-connect": [("dead", "ok", 10), ("good", "ok", 0)],
    "all-busy": [("busy1", "status=529", 10), ("busy2", "status=429", 0)],
    "all-down": [("down1", "status=500", 10), ("down2", "status=503", 0)],
    "claude-slow": [("slow", "first_delay=3", 10), ("fast", "ok", 0)],
    "claude-slow-alone": [("slow", "first_delay=1.5", 0)],
    "bad-request": [("strict", "status=400", 10), ("never", "ok", 0)],
    "affinity-model": [("a", "ok", 0), ("b", "ok-b", 0)],
}


@dataclass
class World:
    """The committed test data the gateway serves."""

    simulator: Service
    key: str  # tenant "acme", every model
    limited_key: str  # tenant "acme", sim-model only
    revoked_key: str
    other_key: str  # tenant "globex"
    one_at_a_time_key: str = ""  # concurrency 1
    two_a_minute_key: str = ""  # rpm 2
    broke_key: str = ""  # tenant "broke-gateway", balance 0
    tenant_id: int = 0
    other_tenant_id: int = 0
    channels: dict[str, int] = field(default_factory=dict)


# Models served through one protocol's channels only, under an alias (issue 12):
# public model -> [(channel protocol, suffix, directives, priority, upstream name)].
# Every other client API reaches them translated.
TRANSLATED: dict[str, list[tuple[str, str, str, int, str]]] = {
    "via-openai": [("openai", "main", "ok", 0, "gpt-upstream")],
    "via-anthropic": [("anthropic", "main", "ok", 0, "claude-upstream")],
    "via-gemini": [("gemini", "main", "ok", 0, "gemini-upstream")],
    "via-failover": [("anthropic", "bad", "status=529", 10, "claude-upstream"),
                     ("gemini", "good", "ok", 0, "gemini-upstream")],
}


def channel_secret(protocol: str, directives: str) -> str:
    if directives == "ok-b":
        return "sk-upstream-b"  # an account of its own, told apart in the simulator's records
    if protocol == "gemini" and directives == "status=401":
        # Gemini refuses a bad key with 400 API_KEY_INVALID (F2).
        directives = "status=400,reason=API_KEY_INVALID"
    return "sim:" + directives if directives != "ok" else "sk-upstream-secret"


def channel_base_url(protocol: str, simulator: Service, suffix: str) -> str:
    base = simulator.url if suffix != "dead" else "http://127.0.0.1:9"
    return base + "/v1" if protocol == "openai" else base


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("gateway") is not None)


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker, django_db_keepdb):
    """The test database, always: pytest-django creates it only for tests
    marked django_db, and the gateway tests read committed data instead."""
    from django.test.utils import setup_databases, teardown_databases

    (settings.BASE_DIR / "var").mkdir(exist_ok=True)
    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, keepdb=django_db_keepdb, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        teardown_databases(config, verbosity=0)


@pytest.fixture(scope="session", autouse=True)
def fresh_redis():
    """Limits count by key and channel ids, which a new test database hands
    out again: start every run with the test Redis database empty."""
    if settings.REDIS_URL:
        import redis

        redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(autouse=True)
def unthrottled_failures(settings):
    """Bad keys sent by one in-process test must not throttle the next
    (counts are shared through Redis); the throttle has tests of its own."""
    settings.HOPBASE_AUTH_FAILURES = int(GATEWAY_TIMERS["HOPBASE_AUTH_FAILURES"])


@pytest.fixture(scope="session", autouse=True)
def private_spool(tmp_path_factory):
    """This run's request spool, for the test process and every gateway it
    starts (they inherit the environment): never the project's var/spool,
    where a later gateway on another database would replay it."""
    import os

    directory = tmp_path_factory.mktemp("spool")
    os.environ["HOPBASE_SPOOL_DIR"] = str(directory)
    settings.HOPBASE_SPOOL_DIR = directory
    return directory


@pytest.fixture(scope="session")
def simulator():
    service = start_simulator()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def world(django_db_setup, django_db_blocker, simulator) -> World:
    from billing.ledger import top_up
    from billing.models import ModelPrice
    from channels_pool.models import Channel
    from hopbase.models import ApiKey, Tenant

    with django_db_blocker.unblock():
        acme = Tenant.objects.create(name="acme-gateway")
        globex = Tenant.objects.create(name="globex-gateway")
        broke = Tenant.objects.create(name="broke-gateway")
        top_up(acme, Decimal("1000"))
        top_up(globex, Decimal("1000"))
        _, key = ApiKey.objects.issue(acme, label="main")
        _, limited = ApiKey.objects.issue(acme, label="limited", allowed_models=["sim-model"])
        revoked_row, revoked = ApiKey.objects.issue(acme, label="revoked")
        revoked_row.revoke()
        _, other = ApiKey.objects.issue(globex, label="other")
        built = World(
            simulator=simulator,
            key=key,
            limited_key=limited,
            revoked_key=revoked,
            other_key=other,
            tenant_id=acme.pk,
            other_tenant_id=globex.pk,
        )
        built.one_at_a_time_key = ApiKey.objects.issue(acme, label="serial", concurrency=1)[1]
        built.two_a_minute_key = ApiKey.objects.issue(acme, label="slow", rpm=2)[1]
        built.broke_key = ApiKey.objects.issue(broke, label="broke")[1]
        for model, channels in SCENARIOS.items():
            ModelPrice.objects.create(
                model=model,
                input_usd_per_mtok=Decimal("3"),
                output_usd_per_mtok=Decimal("15"),
                cache_read_usd_per_mtok=Decimal("0.3"),
                cache_write_usd_per_mtok=Decimal("3.75"),
            )
            for protocol in PROTOCOLS:
                for suffix, directives, priority in channels:
                    name = f"{protocol}-{model}-{suffix}"
                    channel = Channel.objects.create(
                        name=name,
                        protocol=protocol,
                        base_url=channel_base_url(protocol, simulator, suffix),
                        secret=channel_secret(protocol, directives),
                        served_models=[model],
                        priority=priority,
                        # These scenarios are each protocol's own; via-* below cross.
                        cross_protocol=False,
                    )
                    built.channels[name] = channel.pk
        for model, routes in TRANSLATED.items():
            ModelPrice.objects.create(model=model, input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
                                      cache_read_usd_per_mtok=Decimal("0.3"), cache_write_usd_per_mtok=Decimal("3.75"))
            for protocol, suffix, directives, priority, upstream in routes:
                name = f"{protocol}-{model}-{suffix}"
                built.channels[name] = Channel.objects.create(
                    name=name, protocol=protocol, base_url=channel_base_url(protocol, simulator, suffix),
                    secret=channel_secret(protocol, directives), served_models=[f"{model}={upstream}"],
                    priority=priority,
                ).pk
        # One channel that takes one request at a time (F8).
        ModelPrice.objects.create(model="narrow-model", input_usd_per_mtok=Decimal("1"), output_usd_per_mtok=Decimal("1"))
        narrow = Channel.objects.create(
            name="openai-narrow-model",
            protocol="openai",
            base_url=simulator.url + "/v1",
            secret="sk-upstream-secret",
            served_models=["narrow-model"],
            max_concurrency=1,
        )
        built.channels[narrow.name] = narrow.pk
        # Served, but never priced: must never be served (issue: billing).
        for protocol in PROTOCOLS:
            Channel.objects.create(
                name=f"{protocol}-unpriced",
                protocol=protocol,
                base_url=channel_base_url(protocol, simulator, "main"),
                secret="sk-upstream-secret",
                served_models=["unpriced-model"],
            )
    return built


def database_url_for_subprocess() -> str:
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{credentials}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def gateway(world):
    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess()}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    service = start_gateway(env)
    yield service
    service.stop()


@pytest.fixture
def committed_db(django_db_setup, django_db_blocker):
    """Read what the gateway process committed, outside any test transaction."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def sim_records(simulator):
    def fetch(tag: str) -> list[dict]:
        return httpx.get(f"{simulator.url}/_sim/records", params={"tag": tag}).json()

    return fetch
