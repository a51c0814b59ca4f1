"""A gateway whose PostgreSQL and Redis are reached through loopback proxies
the test controls (bench/tcp_proxy.py), for the outage tests (D3).

The gateway is a Daphne process on the session's test database and Redis,
started the contract's way; only its DATABASE_URL and REDIS_URL point at the
proxies. The test process itself reads the real servers directly, so it can
look at rows and counters while the gateway cannot reach them.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings
from django.db import connection

from bench.tcp_proxy import TcpProxy
from tests.conftest import GATEWAY_TIMERS, PROTOCOLS, World, channel_base_url, database_url_for_subprocess
from tests.support.processes import BIN, Service, free_port
from tests.support.simulator_harness import expected_text
from tests.support.wire import call

MODEL = "outage-model"
# Every deadline in these tests is a hang detector, not a measurement.
HANG = 5.0
WITHIN = 20.0
ERROR_CLASS = {
    "chat": lambda body: body["error"]["type"],
    "responses": lambda body: body["error"]["type"],
    "messages": lambda body: body["error"]["type"],
    "gemini": lambda body: body["error"]["status"],
}
UNAVAILABLE = {"chat": "server_error", "responses": "server_error", "messages": "api_error", "gemini": "UNAVAILABLE"}


@dataclass
class Answer:
    protocol: str
    status: int
    body: bytes
    headers: httpx.Headers
    took: float

    @property
    def request_id(self) -> str:
        return self.headers["x-hopbase-request-id"]

    def json(self):
        import json

        return json.loads(self.body)


@dataclass
class Rig:
    gateway: Service
    database: TcpProxy | None  # None on SQLite: a file cannot be put behind a proxy
    redis: TcpProxy | None  # None without REDIS_URL
    key: str  # limited: 2 open requests, 10,000 a minute
    key_id: int
    tenant_id: int
    channels: dict[str, int] = field(default_factory=dict)  # channel protocol -> id

    def send(self, protocol: str, prompt: str, key: str | None = None, stream: bool = False, timeout: float = WITHIN) -> Answer:
        request = call(protocol, key or self.key, MODEL, prompt, stream=stream)
        started = time.monotonic()
        response = httpx.post(self.gateway.url + request.path, json=request.body, headers=request.headers, timeout=timeout)
        return Answer(protocol, response.status_code, response.content, response.headers, time.monotonic() - started)

    def send_many(self, requests: list[tuple[str, str]], key: str | None = None) -> list[Answer]:
        """Several requests at once, each on its own connection."""
        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(lambda r: self.send(r[0], r[1], key), requests))

    def log_text(self) -> str:
        return self.gateway.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.gateway.stop()
        for proxy in (self.database, self.redis):
            if proxy is not None:
                proxy.stop()


def answered_text(answer: Answer) -> str:
    """The text of a whole (non-streamed) answer, in any of the four formats."""
    body = answer.json()
    if answer.protocol == "chat":
        return body["choices"][0]["message"]["content"]
    if answer.protocol == "responses":
        return "".join(part["text"] for item in body["output"] if item["type"] == "message" for part in item["content"])
    if answer.protocol == "messages":
        return "".join(block["text"] for block in body["content"] if block["type"] == "text")
    return "".join(part.get("text", "") for part in body["candidates"][0]["content"]["parts"])


def expected(tokens: int) -> str:
    return expected_text(tokens)


def through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = netloc[0] + "@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))


def make_data(world: World) -> tuple[str, int, dict[str, int]]:
    """A key with limits and a model whose channels have a maximum
    concurrency, so that both kinds of counters live in Redis."""
    from billing.models import ModelPrice
    from channels_pool.models import Channel
    from tenants.models import ApiKey, Tenant

    ModelPrice.objects.get_or_create(
        model=MODEL, defaults={"input_usd_per_mtok": Decimal("3"), "output_usd_per_mtok": Decimal("15")}
    )
    channels = {}
    for protocol in PROTOCOLS:
        channel = Channel.objects.create(
            name=f"{protocol}-{MODEL}-{uuid.uuid4().hex[:6]}",
            protocol=protocol,
            base_url=channel_base_url(protocol, world.simulator, "main"),
            secret="sk-upstream-secret",
            served_models=[MODEL],
            max_concurrency=2,
        )
        channels[protocol] = channel.pk
    row, secret = ApiKey.objects.issue(Tenant.objects.get(pk=world.tenant_id), label="outages", concurrency=2, rpm=10_000)
    return secret, row.pk, channels


def start_rig(world: World, timers: dict[str, str] | None = None) -> Rig:
    """``timers`` over the tests' GATEWAY_TIMERS (a longer HOPBASE_CONFIG_TTL, say)."""
    secret, key_id, channels = make_data(world)
    database = redis = None
    database_url = database_url_for_subprocess()
    if connection.vendor == "postgresql":
        db = connection.settings_dict
        database = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).start()
        database_url = through(database_url, database)
    env = {**GATEWAY_TIMERS, **(timers or {}), "DATABASE_URL": database_url}
    if settings.REDIS_URL:
        parts = urlsplit(settings.REDIS_URL)
        redis = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379).start()
        env["REDIS_URL"] = through(settings.REDIS_URL, redis)
    port = free_port()
    import os

    gateway = Service(
        "outage-gateway",
        [str(BIN / "daphne"), "-v", "0", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=4096", "hopbase.asgi:application"],
        {**os.environ, **env},
        "/healthz",
        port,
    )
    return Rig(gateway, database, redis, secret, key_id, world.tenant_id, channels)


def warm_up(rig: Rig, key: str | None = None) -> None:
    """Every protocol once, so the gateway knows the key, the channels, the
    prices and the balances (what it rides an outage out with)."""
    for protocol in ("chat", "responses", "messages", "gemini"):
        answer = rig.send(protocol, "warm [sim tokens=1]", key)
        assert answer.status == 200, answer.body


def wait_until(check, within: float = WITHIN, every: float = 0.1, message: str = "") -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, message or "still not so after the wait"
        time.sleep(every)


def slot_counts(rig: Rig) -> dict[str, int]:
    """The open-slot counts in Redis of the rig's key and channels (lapsed
    leases left out), read straight from Redis."""
    import redis as redis_lib

    from gateway.governance.limits import SLOTS_PREFIX

    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    now_ms = int(client.time()[0] * 1000)
    names = [f"key:{rig.key_id}"] + [f"channel:{cid}" for cid in rig.channels.values()]
    return {name: client.zcount(SLOTS_PREFIX + name, now_ms, "+inf") for name in names}


def wait_for_revocation_listener(rig: Rig, within: float = HANG) -> None:
    """Until the gateway's revocation listener is subscribed (its Redis
    connection is named after its process: tenants.revocations)."""
    import redis as redis_lib

    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    name = f"hopbase-revocations-{rig.gateway.process.pid}"

    def subscribed() -> bool:
        return any(c["name"] == name and c["sub"] == "1" for c in client.client_list(_type="pubsub"))

    wait_until(subscribed, within=within, every=0.05, message=f"no Redis connection named {name} is subscribed")
