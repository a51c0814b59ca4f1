"""Real clients through the gateway, offline against the upstream simulator (issue 12).

Claude Code (``claude -p``) and Codex CLI (``codex exec``), the npm packages
pinned in tests/clients (``npm ci --prefix tests/clients``; .ci/run does it,
and so does this module when they are missing), each run as a process with a
private home and only the settings the README documents, plus those that
keep it offline: no login, no telemetry, no update check, no network but the
gateway's port. Each must print the simulator's answer; the simulator must
have received every upstream call in the serving channel's protocol, with the
channel's secret and the upstream model name; and the gateway must have
logged exactly one request per upstream call, under the client's API, the
public model name, the serving channel and the simulator's exact usage.

Skipped only where node or npm is missing; in CI (``CI`` set) that is an
error instead, as CI installs both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from channels_pool.simulator.requests import count_words, prompt_texts
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.processes import ROOT, Service, start_gateway
from tests.simulator_harness import expected_text

CLIENTS = ROOT / "tests" / "clients"
CLAUDE = CLIENTS / "node_modules" / ".bin" / "claude"
CODEX = CLIENTS / "node_modules" / ".bin" / "codex"
# Written after an install from the lock, and compared with it: .ci/run's check too.
STAMP = CLIENTS / "node_modules" / ".hopbase-lock"
NODE, NPM = shutil.which("node"), shutil.which("npm")
MISSING = "needs node and npm to install Claude Code and Codex CLI (tests/clients): apt-get install -y nodejs npm"

if os.environ.get("CI") and not (NODE and NPM):
    raise RuntimeError(f"CI must run the real-client tests, but this machine {MISSING[0].lower()}{MISSING[1:]}")

pytestmark = [
    pytest.mark.gateway,
    pytest.mark.skipif(not (NODE and NPM), reason=MISSING),
    pytest.mark.usefixtures("committed_db"),
]

CLIENT_TIMEOUT = 90  # seconds for one whole client run (a few seconds when all is well)
ANSWER = expected_text(12)  # the simulator's default answer: 12 words of TEXT_WORDS
ANSWER_TOKENS = 12
# Channel protocol -> (path the simulator is called on, the protocol its records name, auth header).
UPSTREAM = {
    ("anthropic", "messages"): ("/v1/messages", "anthropic"),
    ("anthropic", "responses"): ("/v1/messages", "anthropic"),
    # Chat Completions when translating, except for a Responses caller (issue 12).
    ("openai", "messages"): ("/v1/chat/completions", "chat"),
    ("openai", "responses"): ("/v1/responses", "responses"),
}


@dataclass(frozen=True)
class Route:
    """A model served to one client by one channel: the public name the
    client asks for, the name the channel is sent (an alias when they differ)."""

    public_model: str
    upstream_model: str
    channel_protocol: str  # openai or anthropic
    channel_name: str
    channel_secret: str  # told apart in the simulator's records

    def entry(self) -> str:
        # As `addchannel --models` and the admin write a channel's models.
        return self.public_model if self.public_model == self.upstream_model else f"{self.public_model}={self.upstream_model}"


@dataclass
class Rig:
    gateway: Service
    simulator: Service
    tenant_id: int
    routes: dict[tuple[str, str], Route]  # (client, channel protocol) -> route

    def route(self, client: str, channel_protocol: str) -> Route:
        return self.routes[client, channel_protocol]


def install_clients() -> None:
    """The pinned clients, installed from the lock unless they already are
    (bounded: a hung registry fails the run, never hangs it)."""
    lock = (CLIENTS / "package-lock.json").read_bytes()
    if CLAUDE.exists() and CODEX.exists() and STAMP.exists() and STAMP.read_bytes() == lock:
        return
    done = subprocess.run([NPM, "ci", "--prefix", str(CLIENTS), "--no-audit", "--no-fund", "--loglevel=error"],
                          check=False, capture_output=True, timeout=600)
    assert done.returncode == 0, f"npm ci --prefix tests/clients failed:\n{done.stderr.decode(errors='replace')}"
    STAMP.write_bytes(lock)


# Each client, through a channel of its own protocol (pass-through) and of the other (translated).
CLIENT_ROUTES = {
    # client: (its API as RequestLog.protocol names it, [channel protocols])
    "claude-code": ("messages", ["anthropic"]),
    "codex": ("responses", ["openai"]),
}


@pytest.fixture(scope="module")
def rig(django_db_setup, django_db_blocker, simulator):
    from django.conf import settings

    from billing.ledger import top_up
    from billing.models import ModelPrice
    from channels_pool.models import Channel
    from hopbase.models import Tenant

    install_clients()
    run = uuid.uuid4().hex[:8]
    routes: dict[tuple[str, str], Route] = {}
    for client, (_, protocols) in CLIENT_ROUTES.items():
        for protocol in protocols:
            public = f"{client}-via-{protocol}-{run}"
            # Translated routes use an alias: the upstream name is one its own provider would use.
            upstream = public if protocol == native_channel(client) else f"sim-{protocol}-{client}-{run}"
            routes[client, protocol] = Route(public, upstream, protocol, f"real-{public}", f"sk-real-{public}")
    with django_db_blocker.unblock():
        tenant = Tenant.objects.create(name=f"real-clients-{run}")
        top_up(tenant, Decimal(100))
        for each in routes.values():
            ModelPrice.objects.create(model=each.public_model, input_usd_per_mtok=Decimal(3),
                                      output_usd_per_mtok=Decimal(15))
            Channel.objects.create(
                name=each.channel_name, protocol=each.channel_protocol,
                base_url=simulator.url + "/v1" if each.channel_protocol == "openai" else simulator.url,
                secret=each.channel_secret, served_models=[each.entry()],
            )
    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess()}
    # Claude Code sends its whole tool catalogue with every request: far more
    # than the small body limit the other gateway tests use (the default then).
    del env["HOPBASE_MAX_BODY_BYTES"]
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    gateway = start_gateway(env)
    yield Rig(gateway, simulator, tenant.pk, routes)
    gateway.stop()


def native_channel(client: str) -> str:
    return "anthropic" if client == "claude-code" else "openai"


def new_key(rig: Rig) -> tuple[int, str]:
    from hopbase.models import ApiKey, Tenant

    row, key = ApiKey.objects.issue(Tenant.objects.get(pk=rig.tenant_id), label=f"real-client-{uuid.uuid4().hex[:6]}")
    return row.pk, key


def private_env(home: Path, **settings: str) -> dict[str, str]:
    """Nothing of this machine's environment but what a process needs: no
    stray provider key, proxy or configuration directory reaches a client."""
    for folder in (home, home / "tmp", home / ".config"):
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        **settings,
    }


@dataclass
class Outcome:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"{' '.join(self.args[:2])} …: exit {self.returncode}\n--- stdout:\n{self.stdout}\n--- stderr:\n{self.stderr[-6000:]}"


def run_client(args: list[str], env: dict[str, str], cwd: Path) -> Outcome:
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                              check=False, timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired as expired:  # the child is killed by then
        out, err = (expired.stdout or b"").decode(errors="replace"), (expired.stderr or b"").decode(errors="replace")
        raise AssertionError(f"{args[0]} did not finish within {CLIENT_TIMEOUT} s\n--- stdout:\n{out}\n--- stderr:\n{err[-6000:]}") from None
    return Outcome(args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


# --------------------------------------------------------------------------- what every run must show


def upstream_calls(rig: Rig, route: Route, since: float) -> list[dict]:
    records = httpx.get(f"{rig.simulator.url}/_sim/records", timeout=10).json()
    return [r for r in records if r["api_key"] == route.channel_secret and r["started_at"] >= since]


def logs_of(key_id: int, count: int, timeout: float = 10.0) -> list:
    """The key's request logs once there are ``count`` (a log is written a
    moment after its response ends), and a moment more to catch any extra."""
    from billing.models import RequestLog

    deadline = time.monotonic() + timeout
    while RequestLog.objects.filter(api_key_id=key_id).count() < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return list(RequestLog.objects.select_related("channel").filter(api_key_id=key_id).order_by("created_at"))


def check_upstream(rig: Rig, route: Route, client_api: str, key: str, tag: str, since: float, outcome: Outcome) -> list[dict]:
    """Every upstream call the client caused: in the channel's protocol, on
    its path, with its secret and the upstream model name; one carrying the prompt."""
    calls = upstream_calls(rig, route, since)
    assert calls, f"nothing reached the simulator\n{outcome}"
    path, protocol = UPSTREAM[route.channel_protocol, client_api]
    for call in calls:
        summary = {k: call[k] for k in ("method", "path", "protocol", "model", "stream", "status", "tag")}
        assert (call["method"], call["path"], call["protocol"]) == ("POST", path, protocol), summary
        assert call["model"] == route.upstream_model, summary
        assert call["status"] == 200 and call["completed"], summary
        headers = call["headers"]
        if route.channel_protocol == "openai":
            assert headers.get("authorization") == f"Bearer {route.channel_secret}" and "x-api-key" not in headers
        else:
            assert headers.get("x-api-key") == route.channel_secret and "authorization" not in headers
        assert key not in json.dumps(call), "the client's HopBase key went upstream"
    prompted = [call for call in calls if call["tag"] == tag]
    assert prompted, f"no upstream call carried the prompt [sim tag={tag}]: {[c['tag'] for c in calls]}"
    return calls


def check_logs(rig: Rig, route: Route, client_api: str, key_id: int, calls: list[dict]) -> None:
    """Exactly one request log per upstream call: the client's API, the
    public model, the serving channel, and the usage the simulator reported."""
    logs = logs_of(key_id, len(calls))
    described = [(row.request_id, row.protocol, row.model, row.status, row.channel_id, row.attempts) for row in logs]
    assert len(logs) == len(calls), f"{len(calls)} upstream calls, {len(logs)} request logs: {described}"
    expected_inputs = sorted(count_words(prompt_texts(call["protocol"], call["body"])) for call in calls)
    for row in logs:
        assert row.status == "completed", described
        assert row.protocol == client_api, described
        assert row.model == route.public_model, described
        assert row.channel is not None and row.channel.name == route.channel_name, described
        assert row.attempts == 1, described
        assert row.usage_estimated is False, described
        assert (row.output_tokens, row.cache_read_tokens, row.cache_write_tokens) == (ANSWER_TOKENS, 0, 0), described
        if hasattr(row, "upstream_model") and route.upstream_model != route.public_model:
            assert row.upstream_model == route.upstream_model, described
    assert sorted(row.input_tokens for row in logs) == expected_inputs, described
    assert sorted(row.stream for row in logs) == sorted(call["stream"] for call in calls), described


# --------------------------------------------------------------------------- Claude Code


def claude_env(rig: Rig, route: Route, key: str, home: Path) -> dict[str, str]:
    """The README's settings, and those that keep Claude Code offline."""
    return private_env(
        home,
        ANTHROPIC_BASE_URL=rig.gateway.url,
        ANTHROPIC_AUTH_TOKEN=key,  # sent as Authorization: Bearer; no login, no key approval in -p
        ANTHROPIC_MODEL=route.public_model,
        # Its small, fast model (background work): the same one, so every call is this route's.
        ANTHROPIC_DEFAULT_HAIKU_MODEL=route.public_model,
        ANTHROPIC_SMALL_FAST_MODEL=route.public_model,  # the older name of the same setting
        CLAUDE_CONFIG_DIR=str(home / ".claude"),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",  # telemetry, error reports, update checks
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        API_TIMEOUT_MS="30000",
        CLAUDE_CODE_MAX_RETRIES="0",  # one upstream call per request: a retry would hide a failure
    )


@pytest.mark.parametrize("channel", CLIENT_ROUTES["claude-code"][1])
def test_claude_code_prints_the_answer(rig, tmp_path, channel):
    route = rig.route("claude-code", channel)
    key_id, key = new_key(rig)
    tag = "cc" + uuid.uuid4().hex[:10]
    since = time.time()
    outcome = run_client(
        [str(CLAUDE), "-p", f"Say something cheerful [sim tag={tag}]", "--output-format", "text"],
        claude_env(rig, route, key, tmp_path / "home"), tmp_path / "project",
    )
    assert outcome.returncode == 0, str(outcome)
    assert outcome.stdout.strip() == ANSWER, str(outcome)
    calls = check_upstream(rig, route, "messages", key, tag, since, outcome)
    check_logs(rig, route, "messages", key_id, calls)


# --------------------------------------------------------------------------- Codex CLI


def codex_config(rig: Rig, route: Route) -> str:
    """The README's ~/.codex/config.toml, on this gateway's port, and what
    keeps Codex offline: without the last two tables it calls ab.chatgpt.com
    (analytics), github.com, api.github.com and chatgpt.com (plugins)."""
    return (
        f'model = "{route.public_model}"\n'
        'model_provider = "hopbase"\n'
        "\n"
        "[model_providers.hopbase]\n"
        'name = "HopBase"\n'
        f'base_url = "{rig.gateway.url}/v1"\n'
        'env_key = "HOPBASE_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"  # one upstream call per request: a retry would hide a failure
        "stream_max_retries = 0\n"
        "\n"
        "[analytics]\n"
        "enabled = false\n"
        "\n"
        "[features]\n"
        "plugins = false\n"
    )


@pytest.mark.parametrize("channel", CLIENT_ROUTES["codex"][1])
def test_codex_exec_prints_the_answer(rig, tmp_path, channel):
    route = rig.route("codex", channel)
    key_id, key = new_key(rig)
    tag = "cx" + uuid.uuid4().hex[:10]
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(codex_config(rig, route))
    last = tmp_path / "last-message.txt"
    since = time.time()
    outcome = run_client(
        [str(CODEX), "exec", "--skip-git-repo-check", "--color", "never", "--output-last-message", str(last),
         f"Say something cheerful [sim tag={tag}]"],
        private_env(tmp_path / "home", CODEX_HOME=str(codex_home), HOPBASE_API_KEY=key),
        tmp_path / "project",
    )
    assert outcome.returncode == 0, str(outcome)
    assert outcome.stdout.strip() == ANSWER, str(outcome)  # exec prints only the final message on stdout
    assert last.read_text().strip() == ANSWER, str(outcome)
    calls = check_upstream(rig, route, "responses", key, tag, since, outcome)
    check_logs(rig, route, "responses", key_id, calls)
