"""Shared fixtures.

Integration tests run the real thing: the upstream simulator and a Daphne
gateway as processes, on the test database (PostgreSQL in CI), with short
timers. Their data is created once per session and committed, so the gateway
process sees it; tests that run it are marked ``gateway`` and run last, so
their committed rows cannot surprise the unit tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal

import httpx
import pytest
from django.conf import settings

# Shared check modules: let pytest explain their failed asserts too.
pytest.register_assert_rewrite(
    "tests.support.protocol_checks", "tests.support.command_checks", "tests.support.settlement_checks", "tests.support.relay_checks", "tests.support.relay_fakes"
)

from serving import collector  # noqa: E402
from simulator import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY, vertex_service_account  # noqa: E402
from tests.support.processes import Service, start_gateway, start_simulator  # noqa: E402

# Requests served in this process (serving.handler's API handler, called directly)
# leave its garbage collector as Python sets it: settling is a gateway
# process's, tested on its own (tests/serving/test_collector.py).
collector.settled = True

pytest_plugins = ["tests.support.sdk_clients"]

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


# Models served through one protocol's channels only, under an alias:
# public model -> [(channel protocol, suffix, directives, priority, upstream name)].
# Every other client API reaches them translated.
TRANSLATED: dict[str, list[tuple[str, str, str, int, str]]] = {
    "via-openai": [("openai", "main", "ok", 0, "gpt-upstream")],
    "via-anthropic": [("anthropic", "main", "ok", 0, "claude-upstream")],
    "via-gemini": [("gemini", "main", "ok", 0, "gemini-upstream")],
    "via-failover": [("anthropic", "bad", "status=529", 10, "claude-upstream"),
                     ("gemini", "good", "ok", 0, "gemini-upstream")],
}


# Cloud channels (rules C1–C5) on the simulator, in TRANSLATED's shape:
# public model -> [(channel kind, suffix, directives, priority, upstream name)].
# A cloud channel's directives ride on its credential (cloud_secret), so
# each misbehaves in one way for every request; a vendor route beside one
# is a channel of that vendor's own API, for failover across kinds.
BEDROCK_CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"  # an inference profile, colon and all
VERTEX_GEMINI = "gemini-2.5-flash"
VERTEX_CLAUDE = "claude-sonnet-4-5@20250929"
AZURE_DEPLOYMENT = "gpt-4o-deployment"
CLOUD_SETTINGS = {"azure": {}, "bedrock": {"region": "us-east-1"},
                  "vertex": {"project": "hopbase-sim", "location": "us-east5"}}
CLOUDS: dict[str, list[tuple[str, str, str, int, str]]] = {
    "cloud-azure": [("azure", "main", "ok", 0, AZURE_DEPLOYMENT)],
    # A content-filter refusal is the request's fault: never the next channel's turn.
    "cloud-azure-filter": [("azure", "strict", "ok", 10, AZURE_DEPLOYMENT),
                           ("openai", "never", "ok", 0, "gpt-upstream")],
    # Fails after its filter-only chunk: that chunk must not have ended the hold.
    "cloud-azure-failover": [("azure", "bad", "error_after_preamble=overloaded", 10, AZURE_DEPLOYMENT),
                             ("openai", "good", "ok", 0, "gpt-upstream")],
    "cloud-bedrock": [("bedrock", "main", "ok", 0, BEDROCK_CLAUDE)],
    "cloud-bedrock-busy": [("bedrock", "bad", "status=429,reason=ThrottlingException", 10, BEDROCK_CLAUDE),
                           ("anthropic", "good", "ok", 0, "claude-upstream")],
    "cloud-bedrock-throttled": [("bedrock", "bad", "exception_after=0,exception=throttlingException", 10,
                                 BEDROCK_CLAUDE),
                                ("anthropic", "good", "ok", 0, "claude-upstream")],
    "cloud-vendor-then-bedrock": [("anthropic", "bad", "status=529", 10, "claude-upstream"),
                                  ("bedrock", "good", "ok", 0, BEDROCK_CLAUDE)],
    "cloud-vertex-gemini": [("vertex", "main", "ok", 0, VERTEX_GEMINI)],
    "cloud-vertex-claude": [("vertex", "main", "ok", 0, VERTEX_CLAUDE)],
    # A service account of its own, used by one test only: its exchanges are countable.
    "cloud-vertex-burst": [("vertex", "main", "account=burst", 0, VERTEX_GEMINI)],
    # Another account of its own, whose tokens a test makes short-lived.
    "cloud-vertex-expiring": [("vertex", "main", "account=expiring", 0, VERTEX_GEMINI)],
    # The token endpoint refuses the key (invalid_grant, as for a deleted or disabled key).
    "cloud-vertex-refused": [("vertex", "bad", "token_status=400", 10, VERTEX_GEMINI),
                             ("gemini", "good", "ok", 0, "gemini-upstream")],
    "cloud-vertex-refused-alone": [("vertex", "bad", "token_status=400", 0, VERTEX_GEMINI)],
    "cloud-vendor-then-vertex": [("gemini", "bad", "status=503", 10, "gemini-upstream"),
                                 ("vertex", "good", "ok", 0, VERTEX_GEMINI)],
    # A healthy Vertex channel first: one whose token the cloud stops taking fails over, then exchanges anew.
    "cloud-vertex-first": [("vertex", "main", "ok", 10, VERTEX_GEMINI), ("gemini", "good", "ok", 0, "gemini-upstream")],
    # Claude slow to start on a cloud, a fast vendor channel next: F3 abandons the first after its limit.
    "cloud-bedrock-slow": [("bedrock", "slow", "first_delay=2", 10, BEDROCK_CLAUDE),
                           ("anthropic", "fast", "ok", 0, "claude-upstream")],
    "cloud-vertex-slow": [("vertex", "slow", "first_delay=2", 10, VERTEX_CLAUDE),
                          ("anthropic", "fast", "ok", 0, "claude-upstream")],
    # A model Bedrock serves through Converse, translated for every client API.
    "via-converse": [("bedrock", "main", "ok", 0, "amazon.nova-pro-v1:0")],
}


def cloud_secret(kind: str, directives: str, simulator: Service) -> str:
    """A cloud channel's credential for the simulator, carrying its directives."""
    pairs = "" if directives == "ok" else directives
    if kind == "bedrock":  # a key pair, the directives in its session token
        return f"{SIM_AWS_ACCESS_KEY_ID}:{SIM_AWS_SECRET_ACCESS_KEY}" + (f":sim:{pairs}" if pairs else "")
    if kind == "vertex":  # a service-account key, the directives in its client_email
        return json.dumps(vertex_service_account(simulator.url, pairs))
    return f"sim:{pairs}" if pairs else "azure-upstream-secret"


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
    from tenants.models import ApiKey, Tenant

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
        for model, routes in CLOUDS.items():
            ModelPrice.objects.create(model=model, input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
                                      cache_read_usd_per_mtok=Decimal("0.3"), cache_write_usd_per_mtok=Decimal("3.75"))
            for kind, suffix, directives, priority, upstream in routes:
                name = f"{kind}-{model}-{suffix}"
                cloud = kind in CLOUD_SETTINGS
                channel = Channel(
                    name=name, protocol=kind, served_models=[f"{model}={upstream}"], priority=priority,
                    base_url=simulator.url if cloud else channel_base_url(kind, simulator, suffix),
                    secret=cloud_secret(kind, directives, simulator) if cloud else channel_secret(kind, directives),
                    **CLOUD_SETTINGS.get(kind, {}),
                )
                channel.full_clean()  # as an operator's channel is checked: its kind's settings and key
                channel.save()
                built.channels[name] = channel.pk
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


def session_gateway(server: str) -> Iterator[Service]:
    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess()}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    service = start_gateway(env, server)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def daphne_gateway(world) -> Iterator[Service]:
    """The contract's plain ``daphne``."""
    yield from session_gateway("daphne")


@pytest.fixture(scope="session")
def uvicorn_gateway(world) -> Iterator[Service]:
    """``manage.py serve``'s default: uvicorn, in one worker."""
    yield from session_gateway("uvicorn")


@pytest.fixture(scope="session")
def gateway(daphne_gateway) -> Service:
    """The gateway most tests use. A module whose tests must hold under both
    servers (protocols, failover, cancellation) overrides it with
    ``gateway = pytest.fixture(params=SERVERS)(each_server)``."""
    return daphne_gateway


def each_server(request: pytest.FixtureRequest) -> Service:
    """The session's gateway under the server ``request.param`` names."""
    return request.getfixturevalue(f"{request.param}_gateway")


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
