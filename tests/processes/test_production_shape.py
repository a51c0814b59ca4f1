"""The production shape without Docker: Debian's nginx on
the same deploy/nginx.conf that docker-compose.yml mounts (its marked lines
rewritten: tests/support/nginx_harness.py), in front of ``manage.py serve --workers 2``
(two gateway processes on one socket), with the test database, Redis, a
Celery worker and Celery beat, and the upstream simulator.

Through nginx: the official openai (chat and responses), anthropic and
google-genai clients, streaming and not, a failover, and an error in each
caller's format; streams unbuffered, shown by the order of events (the
simulator holds the second token until the client has received the first);
nginx's own errors in JSON; no query string (Gemini's ``?key=``) in its logs;
the client's address reaching the gateway only through X-Forwarded-For from
the trusted proxy; the worker settling and beat's sweep reaching it; the
containers' health checks; everything stopping cleanly.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import anthropic
import httpx
import openai
import pytest
from django.conf import settings
from google.genai import errors as genai_errors
from google.genai import types

from billing.models import RequestLog
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.nginx_harness import NGINX, TEMPLATE, Nginx, Process, answers, celery, serve
from tests.support.processes import ROOT
from tests.support.protocol_checks import (
    RequestIds,
    anthropic_client,
    check_log,
    check_stream_headers,
    genai_client,
    new_tag,
    openai_client,
    prompt,
    upstream_record,
    wait_for_log,
    words,
)

if not NGINX.exists() and os.environ.get("CI"):
    raise RuntimeError(f"{NGINX} is missing: .ci/run installs Debian's nginx")

pytestmark = [
    pytest.mark.gateway,
    pytest.mark.skipif(not NGINX.exists(), reason=f"needs Debian's nginx ({NGINX}): apt-get install -y nginx"),
]

TRUSTED_PROXIES = "127.0.0.1/32"  # nginx reaches the gateway from 127.0.0.1
WORKER_NODE = f"nginx-shape@{socket.gethostname()}"
HEALTHCHECK = [sys.executable, str(ROOT / "bin" / "healthcheck")]
METRICS_TOKEN = "metrics-token-for-the-test"
# The metrics docs/operations.md (Observability) names.
METRICS = (
    "hopbase_requests_total", "hopbase_upstream_attempts_total", "hopbase_time_to_first_token_seconds",
    "hopbase_request_duration_seconds", "hopbase_open_streams", "hopbase_channel_state",
    "hopbase_unsettled_requests", "hopbase_oldest_unsettled_seconds", "hopbase_dependency_up",
    "hopbase_limit_refusals_total", "hopbase_spool_bytes",
)


@dataclass
class Topology:
    nginx: Nginx
    gateway: Process
    gateway_address: str
    worker: Process
    beat: Process
    beat_schedule: Path

    @property
    def url(self) -> str:
        return self.nginx.url

    def stop(self) -> dict[str, int | None]:
        """Front to back, as `docker compose down` does."""
        return {p.name: p.stop() for p in (self.nginx, self.gateway, self.beat, self.worker)}


@pytest.fixture(scope="module")
def topology(world, tmp_path_factory) -> Iterator[Topology]:
    directory = tmp_path_factory.mktemp("production-shape")
    env = {
        **os.environ,
        **GATEWAY_TIMERS,
        "DATABASE_URL": database_url_for_subprocess(),
        # As the Celery worker tests do: CI's Redis, or the local one.
        "REDIS_URL": settings.REDIS_URL or "redis://127.0.0.1:6379/13",
        "HOPBASE_TRUSTED_PROXIES": TRUSTED_PROXIES,
        # Room for a slow machine between the first token and its release.
        "HOPBASE_STALL_TIMEOUT": "10",
        # Three failed keys from one client address, and it must wait. Only
        # the throttle test sends bad keys, each from a loopback address of
        # its own; the SDK traffic (from 127.0.0.1) never does.
        "HOPBASE_AUTH_FAILURES": "3",
        "HOPBASE_METRICS_TOKEN": METRICS_TOKEN,
    }
    started: list[Process] = []
    try:
        gateway, address = serve(env, directory, workers=2)
        started.append(gateway)
        worker = celery("worker", ["--pool=solo", "-n", WORKER_NODE, "--loglevel=INFO", "--without-gossip",
                                   "--without-mingle", "--without-heartbeat"], env, directory)
        started.append(worker)
        schedule = directory / "celerybeat-schedule"
        # A sweep every second, so that one reaches the worker during the test.
        beat = celery("beat", ["--loglevel=INFO", "--schedule", str(schedule)],
                      {**env, "HOPBASE_SWEEP_INTERVAL": "1"}, directory)
        started.append(beat)
        nginx = Nginx(directory / "nginx", [address])
        started.append(nginx)
        gateway.wait_until(answers(f"http://{address}/readyz"), 30, "200 on /readyz")
        worker.wait_until(lambda: " ready." in worker.output(), 30, "ready line")
        beat.wait_until(lambda: "beat: Starting" in beat.output(), 30, "start line")
        topology = Topology(nginx, gateway, address, worker, beat, schedule)
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    yield topology
    topology.stop()


@pytest.fixture
def through(topology, world) -> SimpleNamespace:
    """Each SDK, pointed at nginx, with the test key; ``ids`` collects the
    openai client's x-hopbase-request-id headers."""
    ids = RequestIds()
    hooked = openai.DefaultHttpxClient(event_hooks={"response": [ids]})
    return SimpleNamespace(
        url=topology.url,
        ids=ids,
        oai=openai_client(topology.nginx, world.key, http_client=hooked),
        claude=anthropic_client(topology.nginx, world.key),
        gem=genai_client(topology.url, world.key),
    )


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def gemini_request_id(response: types.GenerateContentResponse) -> str | None:
    headers = response.sdk_http_response.headers if response.sdk_http_response else {}
    return {k.lower(): v for k, v in (headers or {}).items()}.get("x-hopbase-request-id")


# --------------------------------------------------------------------------- streaming, unbuffered


def released_after_the_first(pieces: Iterator[str], simulator, tag: str) -> list[str]:
    """Read a stream's text; once the first piece is here, let the simulator
    send the second (``gate_at=1``). Had nginx (or anything on the way) held
    the first back, the simulator would still be waiting for the release,
    the gateway would end the stream as stalled, and the text would be short."""
    received: list[str] = []
    for piece in pieces:
        if not piece:
            continue
        received.append(piece)
        if len(received) == 1:
            httpx.post(f"{simulator.url}/_sim/release", params={"tag": tag}, timeout=5).raise_for_status()
    return received


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "gemini"])
def test_streams_pass_through_nginx_unbuffered(through, protocol, simulator, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, gate_at=1)
    request_id = None
    if protocol == "chat":
        stream = through.oai.chat.completions.create(model="sim-model", stream=True, messages=user(text))
        received = released_after_the_first(
            (chunk.choices[0].delta.content for chunk in stream if chunk.choices), simulator, tag)
        request_id = through.ids.ids[-1]
    elif protocol == "responses":
        with through.oai.responses.stream(model="sim-model", input=text) as stream:
            received = released_after_the_first(
                (event.delta for event in stream if event.type == "response.output_text.delta"), simulator, tag)
        request_id = through.ids.ids[-1]
    elif protocol == "messages":
        with through.claude.messages.stream(model="sim-model", max_tokens=100, messages=user(text)) as stream:
            check_stream_headers(stream.response.headers)  # text/event-stream, never compressed
            request_id = stream.response.headers.get("x-hopbase-request-id")
            received = released_after_the_first(stream.text_stream, simulator, tag)
    else:
        chunks: list[types.GenerateContentResponse] = []

        def texts():
            for chunk in through.gem.models.generate_content_stream(model="sim-model", contents=text):
                chunks.append(chunk)
                yield chunk.text

        received = released_after_the_first(texts(), simulator, tag)
        request_id = gemini_request_id(chunks[0])

    assert len("".join(received).split()) == 6, received  # every token, after the release
    record = upstream_record(sim_records, tag)
    assert record["released_at"] is not None and record["completed"]  # the gate was there, and opened
    check_log(world, request_id, protocol=protocol, stream=True, input_tokens=words(text), output_tokens=6)


# --------------------------------------------------------------------------- whole answers, failover, errors


def test_whole_answers_come_through_nginx(through, world, committed_db):
    text = prompt(new_tag(), tokens=5)
    expected = {"input_tokens": words(text), "output_tokens": 5, "stream": False}

    chat = through.oai.chat.completions.with_raw_response.create(model="sim-model", messages=user(text))
    assert len(chat.parse().choices[0].message.content.split()) == 5
    check_log(world, chat.headers["x-hopbase-request-id"], protocol="chat", **expected)

    responses = through.oai.responses.with_raw_response.create(model="sim-model", input=text)
    assert len(responses.parse().output_text.split()) == 5
    check_log(world, responses.headers["x-hopbase-request-id"], protocol="responses", **expected)

    message = through.claude.messages.with_raw_response.create(model="sim-model", max_tokens=100,
                                                               messages=user(text))
    assert len(message.parse().content[0].text.split()) == 5
    check_log(world, message.headers["x-hopbase-request-id"], protocol="messages", **expected)

    answer = through.gem.models.generate_content(model="sim-model", contents=text)
    assert len(answer.text.split()) == 5
    check_log(world, gemini_request_id(answer), protocol="gemini", **expected)


def test_a_failover_stays_invisible_through_nginx(through, committed_db):
    raw = through.oai.chat.completions.with_raw_response.create(model="failover-http", messages=user("hi"))
    assert raw.parse().choices[0].message.content
    log = wait_for_log(raw.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts) == ("completed", 2)
    assert through.claude.messages.create(model="failover-busy", max_tokens=50, messages=user("hi")).content[0].text
    assert through.gem.models.generate_content(model="failover-event", contents="hi").text


def test_errors_come_through_nginx_in_each_callers_format(through, world):
    with pytest.raises(openai.RateLimitError) as raised:
        through.oai.chat.completions.create(model="all-busy", messages=user("hi"))
    assert raised.value.code == "rate_limit_exceeded"

    with pytest.raises(anthropic.OverloadedError) as overloaded:  # 529: not a status nginx knows
        through.claude.messages.create(model="all-busy", max_tokens=50, messages=user("hi"))
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"

    with pytest.raises(genai_errors.ServerError) as unavailable:
        through.gem.models.generate_content(model="all-down", contents="hi")
    assert (unavailable.value.code, unavailable.value.status) == (503, "UNAVAILABLE")

    # The gateway's own 413 (HOPBASE_MAX_BODY_BYTES is 64 KiB here) passes
    # through in the caller's format: nginx stops only bodies past its limit.
    big = httpx.post(f"{through.url}/v1/messages", headers={"x-api-key": world.key},
                     content=b"{" + b" " * 100_000 + b"}", timeout=10)
    assert big.status_code == 413
    assert big.json() == {"type": "error", "error": {"type": "request_too_large",
                                                      "message": "The request body exceeds 65536 bytes."}}
    assert big.headers["x-hopbase-request-id"]  # the gateway's answer, not nginx's


# --------------------------------------------------------------------------- nginx's own answers and logs


def raw_request(url: str, head: str, timeout: float = 5) -> tuple[int, dict[str, str], bytes]:
    """One request written by hand (a Content-Length nginx refuses before any
    body is sent); its status, headers and body, read up to its Content-Length
    (nginx keeps the connection open a while after a 413, for the body)."""
    parts = httpx.URL(url)
    with socket.create_connection((parts.host, parts.port), timeout=timeout) as sock:
        sock.sendall(head.encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
        head_bytes, _, body = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", 0)) and (chunk := sock.recv(65536)):
            body += chunk
    return int(lines[0].split()[1]), headers, body


def test_nginx_refuses_an_oversized_body_in_json(topology, world):
    status, headers, body = raw_request(
        topology.url,
        f"POST /v1beta/models/sim-model:generateContent?key={world.key} HTTP/1.1\r\nHost: hopbase\r\n"
        f"Content-Type: application/json\r\nContent-Length: {30 * 1024 * 1024}\r\nConnection: close\r\n\r\n",
    )
    assert status == 413
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert (error["code"], error["type"], error["status"]) == (413, "request_too_large", "INVALID_ARGUMENT")


def test_every_nginx_error_page_is_json():
    """Each error_page names a location whose answer is JSON with its own code."""
    config = TEMPLATE.read_text()
    pages = dict(re.findall(r"^\s*error_page (\d{3}) (@\w+);", config, flags=re.MULTILINE))
    assert {"413", "500", "502", "503", "504"} <= set(pages)
    for code, location in pages.items():
        block = re.search(rf"location {location} \{{(.*?)\}}\n", config, flags=re.DOTALL)
        assert block, location
        returned = re.search(r"return (\d{3}) '(.*)';", block.group(1))
        assert returned and returned.group(1) == code, location
        error = json.loads(returned.group(2).replace("\\n", ""))["error"]
        assert error["code"] == int(code) and error["message"] and error["type"] and error["status"]
    assert re.search(r"^\s*proxy_intercept_errors off;", config, flags=re.MULTILINE)  # the gateway's pass


def test_the_logs_keep_no_query_string(topology, world, committed_db):
    response = httpx.post(
        f"{topology.url}/v1beta/models/sim-model:generateContent",
        params={"key": world.key},
        json={"contents": [{"role": "user", "parts": [{"text": prompt(new_tag(), tokens=3)}]}]},
        timeout=20,
    )
    assert response.status_code == 200, response.text
    httpx.get(f"{topology.url}/v1beta/models/nope?key={world.key}", timeout=10)  # a 404
    raw_request(topology.url, f"POST /v1/messages?key={world.key} HTTP/1.1\r\nHost: hopbase\r\n"
                              f"Content-Length: {30 * 1024 * 1024}\r\nConnection: close\r\n\r\n")  # nginx's 413

    lines = [json.loads(line) for line in topology.nginx.access_log.read_text().splitlines()]
    mine = [line for line in lines if line["request_id"] == response.headers["x-hopbase-request-id"]]
    assert len(mine) == 1
    assert mine[0]["path"] == "/v1beta/models/sim-model:generateContent" and mine[0]["status"] == 200
    assert {"/v1beta/models/nope", "/v1/messages"} <= {line["path"] for line in lines}
    for log in (topology.nginx.access_log, topology.nginx.error_log):
        text = log.read_text() if log.exists() else ""
        assert world.key not in text and "key=" not in text, log.name


# --------------------------------------------------------------------------- the client's address


class Echo(BaseHTTPRequestHandler):
    """What nginx sends upstream: its address and the headers, as JSON; or,
    on /hang-up, a connection closed with no answer."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/hang-up"):
            self.close_connection = True
            return
        body = json.dumps({"peer": self.client_address[0], "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def echo_behind_nginx(tmp_path) -> Iterator[Nginx]:
    """A second nginx from the same template, in front of ``Echo``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    nginx = Nginx(tmp_path / "nginx", [f"127.0.0.1:{server.server_address[1]}"])
    try:
        yield nginx
    finally:
        nginx.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_nginx_answers_a_dead_upstream_in_json(echo_behind_nginx):
    response = httpx.get(f"{echo_behind_nginx.url}/hang-up", timeout=10)
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["status"] == "UNAVAILABLE"


def test_nginx_appends_the_address_it_saw_to_x_forwarded_for(echo_behind_nginx):
    client_address = pytest.importorskip("core.client_address")
    # The client on a loopback address of its own, forging a hop.
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10) as client:
        seen = client.get(f"{echo_behind_nginx.url}/v1/models", headers={"X-Forwarded-For": "203.0.113.7"}).json()
    forwarded = {k.lower(): v for k, v in seen["headers"].items()}["x-forwarded-for"]
    assert seen["peer"] == "127.0.0.1"  # the gateway's peer is nginx
    assert forwarded == "203.0.113.7, 127.0.0.2"  # what the client sent, then what nginx saw
    # Read with HOPBASE_TRUSTED_PROXIES as the topology's gateways have it:
    # the client, not the forged hop; without that trust, nginx itself.
    trusted = client_address.parse_networks(TRUSTED_PROXIES.split(","))
    assert client_address.resolve(seen["peer"], forwarded, trusted) == "127.0.0.2"
    assert client_address.resolve(seen["peer"], forwarded, ()) == "127.0.0.1"


def test_the_gateway_tells_clients_apart_behind_nginx(topology):
    """The gateway counts failed keys by client address (gateway.auth_throttle):
    behind nginx that address comes from X-Forwarded-For, believed only from
    the trusted proxy."""
    pytest.importorskip("gateway.auth_throttle")
    a, b, c = (f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{n}" for n in (11, 12, 13))

    def bad_key(source: str, url: str, forged: str | None = None) -> int:
        headers = {"Authorization": f"Bearer hb-{uuid.uuid4().hex}"}
        if forged:
            headers["X-Forwarded-For"] = forged
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
            return client.post(f"{url}/v1/chat/completions", headers=headers,
                               json={"model": "sim-model", "messages": user("hi")}).status_code

    def until_throttled(source: str, url: str) -> list[int]:
        # Three failures, and one more per other process that has not yet seen them.
        statuses = [bad_key(source, url)]
        while statuses[-1] != 429 and len(statuses) < 8:
            statuses.append(bad_key(source, url))
        return statuses

    statuses = until_throttled(a, topology.url)
    assert statuses[-1] == 429 and set(statuses[:-1]) == {401}, statuses
    assert bad_key(b, topology.url) == 401  # another client, behind the same nginx
    assert bad_key(b, topology.url, forged=a) == 401  # who cannot pass for the first
    direct = f"http://{topology.gateway_address}"
    assert bad_key(c, direct, forged=a) == 401  # nor can anyone reaching the gateway past nginx
    assert until_throttled(a, direct)[-1] == 429  # where the peer is the client


# --------------------------------------------------------------------------- worker, beat, health, stop


def test_the_worker_settles_and_beat_sweeps(through, topology, committed_db):
    from tests.support.settlement_checks import wait_for

    raw = through.oai.chat.completions.with_raw_response.create(model="sim-model", messages=user("settle me"))
    log = wait_for_log(raw.headers["x-hopbase-request-id"])
    wait_for(lambda: RequestLog.objects.filter(pk=log.pk, settled_at__isnull=False).exists(), 20,
             "the worker to settle the request")
    wait_for(lambda: re.search(r"Task billing\.tasks\.sweep_unsettled\[\S+\] succeeded", topology.worker.output()),
             20, "a sweep sent by beat to run on the worker")


def test_the_containers_health_checks_pass(topology):
    checks = {
        "image (/healthz)": ["http", f"http://{topology.gateway_address}/healthz"],
        "gateway (/readyz)": ["http", f"http://{topology.gateway_address}/readyz"],
        "worker": ["worker", WORKER_NODE],
        "beat": ["beat", str(topology.beat_schedule), "600"],
    }
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(),
           "REDIS_URL": settings.REDIS_URL or "redis://127.0.0.1:6379/13"}
    for name, args in checks.items():
        result = subprocess.run([*HEALTHCHECK, *args], env=env, capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 0, f"{name}: {result.stderr}"
    stale = subprocess.run([*HEALTHCHECK, "beat", str(topology.beat_schedule), "0"], capture_output=True, timeout=10, check=False)
    assert stale.returncode == 1


def test_prometheus_and_grafana_read_what_the_gateway_serves(topology, world, tmp_path):
    """deploy/prometheus.yml scrapes with the bearer token; every metric the
    Grafana dashboard charts is one the gateway serves, and every metric
    docs/operations.md names is charted."""
    token_file = tmp_path / "hopbase_metrics_token"
    token_file.write_text(METRICS_TOKEN)
    config = (ROOT / "deploy" / "prometheus.yml").read_text()
    assert "credentials_file: /etc/prometheus/hopbase_metrics_token" in config
    assert 'targets: ["gateway:8000"]' in config
    rendered = tmp_path / "prometheus.yml"
    rendered.write_text(config.replace("/etc/prometheus/hopbase_metrics_token", str(token_file))
                        .replace("gateway:8000", topology.gateway_address))
    if shutil.which("promtool"):
        checked = subprocess.run(["promtool", "check", "config", str(rendered)], capture_output=True, text=True,
                                 timeout=30, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr

    # A refusal, so that every family has a sample (multiprocess mode shows
    # only what some process has counted).
    refused = httpx.post(f"{topology.url}/v1/chat/completions", headers={"Authorization": f"Bearer {world.broke_key}"},
                         json={"model": "sim-model", "messages": user("hi")}, timeout=10)
    assert refused.json()["error"]["code"] == "insufficient_quota", refused.text
    metrics = f"http://{topology.gateway_address}/metrics"
    assert httpx.get(metrics, timeout=10).status_code in (401, 403)
    scraped = httpx.get(metrics, headers={"Authorization": f"Bearer {token_file.read_text()}"}, timeout=10)
    assert scraped.status_code == 200
    served = set(re.findall(r"^(hopbase_\w+?)(?:_bucket|_sum|_count|_created)?[{ ]", scraped.text, flags=re.MULTILINE))
    assert set(METRICS) <= served, set(METRICS) - served
    assert httpx.get(f"{topology.url}/metrics", timeout=10).status_code == 404  # not published through nginx

    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    charted = {re.sub(r"_bucket$", "", name) for query in queries for name in re.findall(r"hopbase_\w+", query)}
    assert charted == set(METRICS)


def test_everything_stops_cleanly(topology):
    """Last: SIGTERM ends each process, the gateway's workers drained, exit 0."""
    assert topology.stop() == {"nginx": 0, "gateway": 0, "beat": 0, "worker": 0}
