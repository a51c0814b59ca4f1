"""``GET /metrics`` (Prometheus text): counted exactly after known traffic,
behind its token when one is set, totals over every process of
``manage.py serve``, and well-formed for ``promtool``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.processes import ROOT, SERVERS, Service, free_port, start_gateway
from tests.support.wire import call

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


def samples(url: str, token: str | None = None) -> dict[tuple, float]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(found: dict, name: str, **labels) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def send(url: str, key: str, model: str, prompt: str, stream: bool = False) -> httpx.Response:
    request = call("chat", key, model, prompt, stream=stream)
    return httpx.post(url + request.path, json=request.body, headers=request.headers, timeout=30)


def test_known_traffic_is_counted_exactly(gateway, world):
    before = samples(gateway.url)
    assert send(gateway.url, world.key, "sim-model", "hi [sim tokens=3]").status_code == 200
    assert send(gateway.url, world.key, "failover-http", "hi [sim tokens=2]").status_code == 200
    assert send(gateway.url, world.key, "all-down", "hi").status_code == 500
    assert send(gateway.url, world.key, "no-such-model", "hi").status_code == 404
    after = samples(gateway.url)

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("hopbase_requests_total", protocol="chat", model="sim-model", status="completed") == 1
    assert grew("hopbase_requests_total", protocol="chat", model="failover-http", status="completed") == 1
    assert grew("hopbase_requests_total", protocol="chat", model="all-down", status="failed") == 1
    # A name nobody priced never becomes a label of its own.
    assert grew("hopbase_requests_total", protocol="chat", model="other", status="rejected") == 1
    assert not any("no-such-model" in str(key) for key in after)
    assert grew("hopbase_upstream_attempts_total", channel="openai-failover-http-bad", outcome="http_500") == 1
    assert grew("hopbase_upstream_attempts_total", channel="openai-failover-http-good", outcome="ok") == 1
    assert grew("hopbase_upstream_attempts_total", channel="openai-all-down-down1", outcome="http_500") == 1
    assert grew("hopbase_upstream_attempts_total", channel="openai-all-down-down2", outcome="http_503") == 1
    assert grew("hopbase_time_to_first_token_seconds_count", protocol="chat", model="sim-model") == 1
    assert grew("hopbase_request_duration_seconds_count", protocol="chat", model="all-down") == 1
    assert value(after, "hopbase_dependency_up", dependency="database") == 1
    assert ("hopbase_unsettled_requests", ()) in after and ("hopbase_spool_bytes", ()) in after
    assert value(after, "hopbase_channel_state", channel="openai-sim-model-main", state="closed") in (0, 1)


def test_open_streams_are_counted_while_they_run(gateway, world):
    request = call("chat", world.key, "sim-model", "count [sim tokens=40 pace=0.05]", stream=True)
    with httpx.stream("POST", gateway.url + request.path, json=request.body, headers=request.headers, timeout=30) as response:
        chunks = response.iter_raw()  # kept: a dropped iterator closes the response
        next(chunks)
        assert value(samples(gateway.url), "hopbase_open_streams") >= 1
    deadline = time.monotonic() + 5
    while value(samples(gateway.url), "hopbase_open_streams") != 0:
        assert time.monotonic() < deadline, "the stream never counted as closed"
        time.sleep(0.05)


def gateway_env(**extra: str) -> dict[str, str]:
    from django.conf import settings

    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess(), **extra}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    return env


def test_a_metrics_token_is_required_when_set(world):
    gateway = start_gateway(gateway_env(HOPBASE_METRICS_TOKEN="s3cret-scrape"))
    try:
        assert httpx.get(gateway.url + "/metrics").status_code == 401
        wrong = httpx.get(gateway.url + "/metrics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "hopbase_requests_total" in httpx.get(gateway.url + "/metrics", headers={"authorization": "Bearer s3cret-scrape"}).text
    finally:
        gateway.stop()


@pytest.mark.parametrize("server", SERVERS)
def test_every_process_of_serve_reports_the_totals_of_all(world, server):
    port = free_port()
    env = {**os.environ, **gateway_env()}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    command = [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2", "--server", server]
    served = Service("serve", command, env, "/healthz", port)
    try:
        for _ in range(12):  # new connections: the kernel spreads them over both workers
            with httpx.Client() as client:
                assert client.post(served.url + "/v1/chat/completions", json=call("chat", world.key, "sim-model", "hi [sim tokens=1]", stream=False).body,
                                   headers=call("chat", world.key, "sim-model", "hi", stream=False).headers).status_code == 200
        counts = set()
        for _ in range(8):
            with httpx.Client() as client:
                found = samples_via(client, served.url)
            counts.add(value(found, "hopbase_requests_total", protocol="chat", model="sim-model", status="completed"))
        assert counts == {12}
    finally:
        served.stop()


def samples_via(client: httpx.Client, url: str) -> dict[tuple, float]:
    text = client.get(url + "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) is installed by .ci/run")
def test_promtool_finds_the_output_well_formed(gateway, world):
    send(gateway.url, world.key, "sim-model", "hi [sim tokens=1]")
    text = httpx.get(gateway.url + "/metrics").content
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, cwd=ROOT, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
