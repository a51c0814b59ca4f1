"""Real clients through the gateway, offline against the upstream simulator.

Claude Code (``claude -p``) and Codex CLI (``codex exec``), the npm packages
pinned in tests/clients (``npm ci --prefix tests/clients``; .ci/run does it,
and so does this module when they are missing), each run as a process with a
private home and only the settings docs/providers.md documents, plus those that
keep it offline: no login, no telemetry, no update check, no network but the
gateway's port. Each client is served by a channel of its own protocol
(pass-through) and by one of the other (translated, under a model alias):
Claude Code through an ``openai`` channel (Chat Completions upstream), Codex
through an ``anthropic`` one.

Each run is two turns, the second continuing the first's session
(``claude -p --continue``, ``codex exec resume --last``). On both the client
must print the simulator's answer; the simulator must have received every
upstream call in the channel's protocol, with the channel's secret and the
upstream model name; the thinking the first turn produced must come back on
the second as the channel's own state when the channel made it, and not at
all otherwise; and the gateway must have logged exactly one request per
upstream call, under the client's API, the public model name, the serving
channel and the simulator's exact usage.

Skipped only where node or npm is missing; in CI (``CI`` set) that is an
error instead, as CI installs both.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from simulator.requests import count_words, prompt_texts
from simulator.wire.common import THINKING_WORDS
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.processes import ROOT, Service, start_gateway
from tests.support.simulator_harness import expected_text

CLIENTS = ROOT / "tests" / "clients"
CLAUDE = CLIENTS / "node_modules" / ".bin" / "claude"
CODEX = CLIENTS / "node_modules" / ".bin" / "codex"
# Written after an install from the lock, and compared with it (.ci/run's check too).
STAMP = CLIENTS / "node_modules" / ".hopbase-lock"
NODE, NPM = shutil.which("node"), shutil.which("npm")
MISSING = "needs node and npm to install Claude Code and Codex CLI (tests/clients): apt-get install -y nodejs npm"

if os.environ.get("CI") and not (NODE and NPM):
    raise RuntimeError(f"CI must run the real-client tests, but this machine {MISSING}")

pytestmark = [
    pytest.mark.gateway,
    pytest.mark.skipif(not (NODE and NPM), reason=MISSING),
    pytest.mark.usefixtures("committed_db"),
]

CLIENT_TIMEOUT = 90  # seconds for one whole client run (a few seconds when all is well)
THINKING = 4  # thinking tokens the simulator answers with, before its text
ANSWER_TOKENS = 12  # the simulator's default answer: 12 words of TEXT_WORDS
ANSWER = expected_text(ANSWER_TOKENS)
THOUGHT = expected_text(THINKING, THINKING_WORDS)
# (channel protocol, client API) -> the path the simulator is called on, and its name for the protocol.
UPSTREAM = {
    ("anthropic", "messages"): ("/v1/messages", "anthropic"),
    ("anthropic", "responses"): ("/v1/messages", "anthropic"),
    # Chat Completions when translating, except for a Responses caller.
    ("openai", "messages"): ("/v1/chat/completions", "chat"),
    ("openai", "responses"): ("/v1/responses", "responses"),
}
# client -> (its API as RequestLog.protocol names it, its own channel protocol, the other one)
CLIENTS_APIS = {
    "claude-code": ("messages", "anthropic", "openai"),
    "codex": ("responses", "openai", "anthropic"),
}


def prompt(tag: str) -> str:
    return f"Say something cheerful [sim tag={tag} thinking={THINKING}]"


@dataclass(frozen=True)
class Route:
    """A model served to one client by one channel: the public name the
    client asks for, and the name the channel is sent (an alias when translated)."""

    client_api: str
    public_model: str
    upstream_model: str
    channel_protocol: str  # openai or anthropic
    channel_name: str
    channel_secret: str  # told apart in the simulator's records

    @property
    def models(self) -> str:
        # As `addchannel --models` takes them.
        if self.public_model == self.upstream_model:
            return self.public_model
        return f"{self.public_model}={self.upstream_model}"


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


@pytest.fixture(scope="module")
def rig(django_db_setup, django_db_blocker, simulator):
    from django.conf import settings
    from django.core.management import call_command

    from billing.ledger import top_up
    from billing.models import ModelPrice
    from tenants.models import Tenant

    install_clients()
    run = uuid.uuid4().hex[:8]
    routes: dict[tuple[str, str], Route] = {}
    for client, (api, own, other) in CLIENTS_APIS.items():
        for protocol in (own, other):
            public = f"{client}-via-{protocol}-{run}"
            # Translated: under an alias, as a provider of the channel's protocol would name its model.
            upstream = public if protocol == own else f"sim-{protocol}-for-{client}-{run}"
            routes[client, protocol] = Route(api, public, upstream, protocol, f"real-{public}", f"sk-real-{public}")
    with django_db_blocker.unblock():
        tenant = Tenant.objects.create(name=f"real-clients-{run}")
        top_up(tenant, Decimal(100))
        for each in routes.values():
            ModelPrice.objects.create(model=each.public_model, input_usd_per_mtok=Decimal(3),
                                      output_usd_per_mtok=Decimal(15))
            base_url = simulator.url + "/v1" if each.channel_protocol == "openai" else simulator.url
            call_command("addchannel", each.channel_name, protocol=each.channel_protocol, base_url=base_url,
                         api_key=each.channel_secret, models=each.models, stdout=io.StringIO())
    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess()}
    # Claude Code sends its whole tool catalogue with every request: far more
    # than the small body limit the other gateway tests use (the default then).
    del env["HOPBASE_MAX_BODY_BYTES"]
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    gateway = start_gateway(env)
    yield Rig(gateway, simulator, tenant.pk, routes)
    gateway.stop()


def new_key(rig: Rig) -> tuple[int, str]:
    from tenants.models import ApiKey, Tenant

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
        return (f"{' '.join(self.args[:3])} …: exit {self.returncode}\n--- stdout:\n{self.stdout}\n"
                f"--- stderr:\n{self.stderr[-6000:]}")


def run_client(args: list[str], env: dict[str, str], cwd: Path) -> Outcome:
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                              check=False, timeout=CLIENT_TIMEOUT)
    except subprocess.TimeoutExpired as expired:  # the child is killed by then
        out, err = (expired.stdout or b"").decode(errors="replace"), (expired.stderr or b"").decode(errors="replace")
        raise AssertionError(
            f"{args[0]} did not finish within {CLIENT_TIMEOUT} s\n--- stdout:\n{out}\n--- stderr:\n{err[-6000:]}"
        ) from None
    return Outcome(args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))


# --------------------------------------------------------------------------- what every run must show


def upstream_calls(rig: Rig, route: Route, since: float) -> list[dict]:
    records = httpx.get(f"{rig.simulator.url}/_sim/records", timeout=10).json()
    return [r for r in records if r["api_key"] == route.channel_secret and r["started_at"] >= since]


def sent_events(call: dict) -> Iterator[dict]:
    """The JSON of each SSE event the simulator sent for a call."""
    for line in base64.b64decode(call["sent_b64"]).decode(errors="replace").splitlines():
        if line.startswith("data:"):
            try:
                yield json.loads(line[5:])
            except ValueError:
                continue  # [DONE]


def check_turn(rig: Rig, route: Route, key: str, tag: str, since: float, outcome: Outcome) -> tuple[list[dict], dict]:
    """The client printed the answer; every upstream call it caused went in
    the channel's protocol, on its path, with its secret and the upstream
    model name. Returns them, and the one that carried this turn's prompt."""
    assert outcome.returncode == 0, str(outcome)
    assert outcome.stdout.strip() == ANSWER, str(outcome)
    calls = upstream_calls(rig, route, since)
    assert calls, f"nothing reached the simulator\n{outcome}"
    path, protocol = UPSTREAM[route.channel_protocol, route.client_api]
    for call in calls:
        summary = {k: call[k] for k in ("method", "path", "protocol", "model", "stream", "status", "tag")}
        assert (call["method"], call["path"], call["protocol"]) == ("POST", path, protocol), summary
        assert call["model"] == route.upstream_model, summary
        assert call["status"] == 200 and call["completed"] and call["stream"], summary
        headers = call["headers"]
        if route.channel_protocol == "openai":
            assert headers.get("authorization") == f"Bearer {route.channel_secret}" and "x-api-key" not in headers
        else:
            assert headers.get("x-api-key") == route.channel_secret and "authorization" not in headers
        assert key not in json.dumps(call), "the client's HopBase key went upstream"
    prompted = [call for call in calls if call["tag"] == tag]
    assert len(prompted) == 1, f"calls carrying [sim tag={tag}]: {[c['tag'] for c in calls]}\n{outcome}"
    return calls, prompted[0]


def check_thinking_came_back(route: Route, first: dict, second: dict) -> None:
    """The second turn hands back the first turn's thinking: as the
    channel's own state when the channel made it (pass-through, or sealed by
    the gateway on the way out and opened on the way back), not at all when
    the channel's protocol has no such thing (Chat Completions)."""
    body = second["body"]
    if second["protocol"] == "anthropic":
        signatures = [e["delta"]["signature"] for e in sent_events(first)
                      if e.get("type") == "content_block_delta" and e["delta"].get("type") == "signature_delta"]
        assert len(signatures) == 1, signatures
        blocks = [block for message in body["messages"] if message["role"] == "assistant"
                  and isinstance(message["content"], list) for block in message["content"]]
        thinking = [block for block in blocks if block.get("type") == "thinking"]
        assert thinking == [{"type": "thinking", "thinking": THOUGHT, "signature": signatures[0]}], blocks
    elif second["protocol"] == "responses":
        reasoning_ids = [e["item"]["id"] for e in sent_events(first)
                         if e.get("type") == "response.output_item.done" and e["item"]["type"] == "reasoning"]
        assert len(reasoning_ids) == 1, reasoning_ids
        handed_back = [item for item in body["input"] if item.get("type") == "reasoning"]
        assert [item["id"] for item in handed_back] == reasoning_ids, handed_back
        assert handed_back[0]["summary"] == [{"type": "summary_text", "text": THOUGHT}], handed_back
    else:  # chat: nothing to hand back, and nothing of another provider's state
        assistant = [message for message in body["messages"] if message["role"] == "assistant"]
        assert len(assistant) == 1, body["messages"]
        content = assistant[0]["content"]
        text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
        assert text == ANSWER, assistant
        sent = json.dumps(body)
        assert "signature" not in sent and "hb1." not in sent and THOUGHT not in sent, assistant


def logs_of(key_id: int, count: int, timeout: float = 10.0) -> list:
    """The key's request logs once there are ``count`` (a log is written a
    moment after its response ends), and a moment more to catch any extra."""
    from billing.models import RequestLog

    deadline = time.monotonic() + timeout
    while RequestLog.objects.filter(api_key_id=key_id).count() < count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    return list(RequestLog.objects.select_related("channel").filter(api_key_id=key_id).order_by("created_at"))


def check_logs(route: Route, key_id: int, calls: list[dict]) -> None:
    """Exactly one request log per upstream call: the client's API, the
    public model (and the upstream one beside it when an alias made it
    another), the serving channel, and the usage the simulator reported."""
    logs = logs_of(key_id, len(calls))
    described = [(row.request_id, row.protocol, row.model, row.upstream_model, row.status, row.channel_id,
                  row.attempts, row.input_tokens, row.output_tokens, row.thinking_tokens) for row in logs]
    assert len(logs) == len(calls), f"{len(calls)} upstream calls, {len(logs)} request logs: {described}"
    aliased = route.upstream_model if route.upstream_model != route.public_model else ""
    # Thinking is inside the output either way; only OpenAI's usage counts it apart.
    thinking = THINKING if route.channel_protocol == "openai" else 0
    for row in logs:
        assert (row.status, row.protocol, row.model, row.upstream_model) == (
            "completed", route.client_api, route.public_model, aliased), described
        assert row.channel is not None and row.channel.name == route.channel_name, described
        assert row.attempts == 1 and row.stream is True and row.usage_estimated is False, described
        assert row.provider_request_id, described
        assert (row.output_tokens, row.thinking_tokens) == (ANSWER_TOKENS + THINKING, thinking), described
        assert (row.cache_read_tokens, row.cache_write_tokens) == (0, 0), described
    # The simulator counts one word of prompt text as one input token.
    expected_inputs = sorted(count_words(prompt_texts(call["protocol"], call["body"])) for call in calls)
    assert sorted(row.input_tokens for row in logs) == expected_inputs, described


# --------------------------------------------------------------------------- Claude Code


def claude_env(rig: Rig, route: Route, key: str, home: Path) -> dict[str, str]:
    """The settings docs/providers.md gives, and those that keep Claude Code offline."""
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


@pytest.mark.parametrize("channel", ["anthropic", "openai"])
def test_claude_code_answers_and_continues(rig, tmp_path, channel):
    route = rig.route("claude-code", channel)
    key_id, key = new_key(rig)
    env, project = claude_env(rig, route, key, tmp_path / "home"), tmp_path / "project"
    first_tag, second_tag = ("cc" + uuid.uuid4().hex[:10] for _ in range(2))

    since = time.time()
    outcome = run_client([str(CLAUDE), "-p", prompt(first_tag), "--output-format", "text"], env, project)
    first_calls, first = check_turn(rig, route, key, first_tag, since, outcome)

    since = time.time()
    outcome = run_client([str(CLAUDE), "-p", "--continue", prompt(second_tag), "--output-format", "text"], env, project)
    second_calls, second = check_turn(rig, route, key, second_tag, since, outcome)

    check_thinking_came_back(route, first, second)
    check_logs(route, key_id, first_calls + second_calls)


# --------------------------------------------------------------------------- Codex CLI


def codex_config(rig: Rig, route: Route, default_tools: bool = False, websockets: bool = False) -> str:
    """The ~/.codex/config.toml of docs/providers.md, on this gateway's port, and what
    keeps Codex offline: without the last two tables it calls ab.chatgpt.com
    (analytics), github.com, api.github.com and chatgpt.com (plugins)."""
    top = ""
    agents = ""
    if route.channel_protocol != "openai" and not default_tools:
        # Tools only OpenAI's Responses API knows (a hosted web search, a
        # `namespace` of sub-agent tools) are refused for an Anthropic
        # channel: off, as docs/providers.md says for Codex on a Claude channel.
        top = 'web_search = "disabled"\n'
        agents = "\n[agents]\nenabled = false\n"
    # Offered WebSockets, Codex retries a refused socket stream_max_retries
    # times before it falls back to HTTP, unless the refusal is a 426.
    streams = "supports_websockets = true\nstream_max_retries = 5\n" if websockets else "stream_max_retries = 0\n"
    return (
        f'model = "{route.public_model}"\n'
        'model_provider = "hopbase"\n'
        f"{top}"
        "\n"
        "[model_providers.hopbase]\n"
        'name = "HopBase"\n'
        f'base_url = "{rig.gateway.url}/v1"\n'
        'env_key = "HOPBASE_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"  # one upstream call per request: a retry would hide a failure
        f"{streams}"
        "\n"
        "[analytics]\n"
        "enabled = false\n"
        "\n"
        "[features]\n"
        "plugins = false\n"
        f"{agents}"
    )


def codex_exec(rig: Rig, route: Route, key: str, tmp_path: Path, *args: str, default_tools: bool = False,
               websockets: bool = False) -> Outcome:
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(rig, route, default_tools, websockets))
    last = tmp_path / "last-message.txt"
    last.unlink(missing_ok=True)
    outcome = run_client(
        [str(CODEX), "exec", "--skip-git-repo-check", "--color", "never", "--output-last-message", str(last), *args],
        private_env(tmp_path / "home", CODEX_HOME=str(codex_home), HOPBASE_API_KEY=key),
        tmp_path / "project",
    )
    if outcome.returncode == 0:  # stdout holds the final message only; the file must agree
        assert last.read_text().strip() == ANSWER, str(outcome)
    return outcome


@pytest.mark.parametrize("channel", ["openai", "anthropic"])
def test_codex_exec_answers_and_resumes(rig, tmp_path, channel):
    route = rig.route("codex", channel)
    key_id, key = new_key(rig)
    first_tag, second_tag = ("cx" + uuid.uuid4().hex[:10] for _ in range(2))

    since = time.time()
    outcome = codex_exec(rig, route, key, tmp_path, prompt(first_tag))
    first_calls, first = check_turn(rig, route, key, first_tag, since, outcome)

    since = time.time()
    outcome = codex_exec(rig, route, key, tmp_path, "resume", "--last", prompt(second_tag))
    second_calls, second = check_turn(rig, route, key, second_tag, since, outcome)

    check_thinking_came_back(route, first, second)
    check_logs(route, key_id, first_calls + second_calls)


def test_codex_offered_websockets_falls_back_to_http_at_once(rig, tmp_path):
    """With supports_websockets on, Codex opens a WebSocket first; the 426
    (docs/websockets.md) sends it to HTTP with no retry, and the turn is
    served there."""
    route = rig.route("codex", "openai")
    _, key = new_key(rig)
    tag = "cx" + uuid.uuid4().hex[:10]
    since = time.time()
    outcome = codex_exec(rig, route, key, tmp_path, prompt(tag), websockets=True)
    check_turn(rig, route, key, tag, since, outcome)
    assert "Reconnecting" not in outcome.stdout + outcome.stderr, str(outcome)


def test_codex_exec_with_its_default_tools_through_an_anthropic_channel(rig, tmp_path):
    """Codex's default tools include a namespace of sub-agent functions and
    web search: the first are offered flat, the second dropped."""
    route = rig.route("codex", "anthropic")
    _, key = new_key(rig)
    tag = "cx" + uuid.uuid4().hex[:10]
    since = time.time()
    outcome = codex_exec(rig, route, key, tmp_path, prompt(tag), default_tools=True)
    check_turn(rig, route, key, tag, since, outcome)


# --------------------------------------------------------------------------- Codex moving to an OpenAI channel

CONFIG_SETTLE = 1.5  # seconds for the gateway to read channels again (HOPBASE_CONFIG_TTL is 0.5 in tests)


@pytest.mark.parametrize("first", ["anthropic", "gemini"])
def test_codex_resumes_on_an_openai_channel_after_another_protocol(rig, tmp_path, first):
    """One model served by a channel of another protocol
    (tried first) and by an OpenAI one. Codex's first turn is translated:
    its thinking becomes a reasoning item, sealed with Claude's signature,
    or, from Gemini (no thoughtSignature), with no state at all. That
    channel is then switched off and the resumed session passes through to
    the OpenAI channel, which refuses a reasoning item it cannot use and
    never stored (Codex sends store false: "Item with id 'rs_…' not found"):
    none reaches it, the first turn's answer does."""
    from django.core.management import call_command

    from billing.models import ModelPrice
    from channels_pool.models import Channel

    run = uuid.uuid4().hex[:8]
    public = f"codex-after-{first}-{run}"
    before = Route("responses", public, f"sim-{first}-for-codex-{run}", first, f"real-{public}-{first}",
                   f"sk-real-{public}-{first}")
    after = Route("responses", public, public, "openai", f"real-{public}-openai", f"sk-real-{public}-openai")
    ModelPrice.objects.create(model=public, input_usd_per_mtok=Decimal(3), output_usd_per_mtok=Decimal(15))
    for route, priority in ((before, "10"), (after, "0")):
        base_url = rig.simulator.url + "/v1" if route.channel_protocol == "openai" else rig.simulator.url
        call_command("addchannel", route.channel_name, protocol=route.channel_protocol, base_url=base_url,
                     api_key=route.channel_secret, models=route.models, priority=priority, stdout=io.StringIO())
    _, key = new_key(rig)
    first_tag, second_tag = ("cx" + uuid.uuid4().hex[:10] for _ in range(2))
    time.sleep(CONFIG_SETTLE)

    since = time.time()
    outcome = codex_exec(rig, before, key, tmp_path, prompt(first_tag))
    assert outcome.returncode == 0 and outcome.stdout.strip() == ANSWER, str(outcome)
    calls = upstream_calls(rig, before, since)
    assert [call["protocol"] for call in calls if call["tag"] == first_tag] == [first], calls

    Channel.objects.filter(name=before.channel_name).update(enabled=False)
    time.sleep(CONFIG_SETTLE)
    since = time.time()
    # The first turn's route for Codex's settings: its tools stay as they were.
    outcome = codex_exec(rig, before, key, tmp_path, "resume", "--last", prompt(second_tag))
    _, second = check_turn(rig, after, key, second_tag, since, outcome)

    items = second["body"]["input"]
    assert [item for item in items if item.get("type") == "reasoning"] == [], items
    answers = [part["text"] for item in items if item.get("role") == "assistant" for part in item["content"]]
    assert answers == [ANSWER], items
    assert "hb1." not in json.dumps(second["body"])
