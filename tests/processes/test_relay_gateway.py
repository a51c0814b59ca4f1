"""The relay, byte for byte, through a running gateway and the simulator:
pass-through and keep-alive (P6, S1, S2), the hold and failover (F1–F7).
What follows the commit is in test_run_gateway.py.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.relay_checks import (
    TERMINALS,
    client_events,
    new_tag,
    post,
    stream,
)
from tests.support.wire import (
    PROTOCOLS,
    call,
    channel_protocol,
    open_raw,
    read_until_closed,
    sent_bytes,
    strip_keepalives,
    wait_for_log,
    wait_for_records,
)

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)


# -- pass-through (P6, S1) --------------------------------------------------


@pytest.mark.parametrize("protocol", ["responses", "messages", "gemini"])
def test_the_client_gets_the_channels_bytes_with_only_keepalives_added(gateway, world, protocol):
    tag = new_tag()
    # Seeded random chunk splits (inside events, inside UTF-8, between CR and
    # LF) and a pause inside an event longer than the keep-alive interval.
    prompt = f"hello [sim tag={tag} tokens=9 split=7 crlf=1 pause_mid_event=1.0 pause_at=3]"
    response = stream(gateway, protocol, world.key, "sim-model", prompt)
    assert response.status_code == 200
    (record,) = wait_for_records(world.simulator.url, tag)
    body, keepalives = strip_keepalives(protocol, response.content)
    assert body == sent_bytes(record)
    assert keepalives >= 1
    assert "gzip" not in response.headers.get("content-encoding", "")


def test_chat_passes_bytes_through_when_the_client_asked_for_usage(gateway, world):
    tag = new_tag()
    prompt = f"hi [sim tag={tag} tokens=6 split=3 crlf=1 pause_mid_event=1.0 pause_at=2]"
    response = stream(gateway, "chat", world.key, "sim-model", prompt)
    (record,) = wait_for_records(world.simulator.url, tag)
    body, keepalives = strip_keepalives("chat", response.content)
    assert body == sent_bytes(record)
    assert keepalives >= 1


def test_chat_drops_only_the_usage_chunk_the_client_did_not_ask_for(gateway, world):
    tag = new_tag()
    response = stream(gateway, "chat", world.key, "sim-model", f"hi [sim tag={tag} tokens=4]", chat_usage=False)
    (record,) = wait_for_records(world.simulator.url, tag)
    upstream = client_events(sent_bytes(record))
    usage_chunks = [e for e in upstream if b'"choices":[]' in e]
    assert len(usage_chunks) == 1
    assert record["body"]["stream_options"] == {"include_usage": True}
    assert client_events(response.content) == [e for e in upstream if e not in usage_chunks]
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    usage = json.loads(usage_chunks[0][len(b"data: ") :])["usage"]
    assert (log.input_tokens, log.output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert log.usage_estimated is False


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_keepalives_sit_between_events_and_never_after_the_terminal_event(gateway, world, protocol):
    tag = new_tag()
    prompt = f"hi [sim tag={tag} tokens=4 pace=0.5 split=5]"
    response = stream(gateway, protocol, world.key, "sim-model", prompt)
    keepalive = b"\n" if protocol == "gemini" else b": hopbase-keepalive\n\n"
    body = response.content
    positions = [i for i in range(len(body)) if body.startswith(keepalive, i)]
    if protocol == "gemini":
        positions = [i for i in positions if body[i - 1 : i] != b"\r"]
    assert positions, "a 0.5 s gap between tokens exceeds the 0.4 s keep-alive interval"
    for i in positions:
        assert body[:i].endswith((b"\n\n", b"\r\n\r\n")), body[max(0, i - 40) : i + 20]
    terminal_at = body.rindex(TERMINALS[protocol])
    assert all(i < terminal_at for i in positions)


def test_streams_are_never_compressed_and_close_after_the_terminal_event(gateway, world):
    request = call("messages", world.key, "sim-model", "hi [sim tokens=3]")
    headers = {**request.headers, "accept-encoding": "gzip, deflate"}
    started = time.monotonic()
    response = httpx.post(gateway.url + request.path, json=request.body, headers=headers, timeout=10)
    assert time.monotonic() - started < 2
    assert "content-encoding" not in response.headers
    assert response.content.rstrip().endswith(b'data: {"type":"message_stop"}')


# -- the hold (F1, F5) ------------------------------------------------------


def test_no_byte_reaches_the_client_before_the_first_content_token(gateway, world):
    tag = new_tag()
    request = call("messages", world.key, "sim-model", f"hi [sim tag={tag} tokens=3 first_delay=1]")
    with open_raw(gateway.port, request) as sock:
        first = sock.recv(65536)
        first_byte_at = time.time()
        received = first + read_until_closed(sock)
    (record,) = wait_for_records(world.simulator.url, tag)
    # The simulator sent its preamble at once and the first token a second later.
    assert record["first_token_at"] - record["started_at"] >= 0.9
    assert first_byte_at >= record["first_token_at"]
    assert first.startswith(b"HTTP/1.1 200")
    assert b"hopbase-keepalive" not in received
    assert received.index(b"event: message_start") < received.index(b"text_delta")


# -- failover before the first token (F2, F4, F6) ----------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["failover-http", "failover-busy", "failover-event", "failover-key"])
def test_an_early_failure_moves_to_the_next_channel_invisibly(gateway, world, protocol, model):
    tag = new_tag()
    response = stream(gateway, protocol, world.key, model, f"hi [sim tag={tag} tokens=5]")
    assert response.status_code == 200
    bad, good = wait_for_records(world.simulator.url, tag, count=2)
    assert response.content.replace(b": hopbase-keepalive\n\n", b"") == sent_bytes(good)
    assert bad["completed"] is False
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts) == ("completed", 2)
    assert log.channel_id == world.channels[f"{channel_protocol(protocol)}-{model}-good"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_unreachable_channel_is_skipped(gateway, world, protocol):
    tag = new_tag()
    response = stream(gateway, protocol, world.key, "failover-connect", f"hi [sim tag={tag} tokens=5]")
    assert response.status_code == 200
    (good,) = wait_for_records(world.simulator.url, tag)
    assert response.content == sent_bytes(good)
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.attempts == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_non_streaming_request_fails_over_too(gateway, world, protocol):
    tag = new_tag()
    response = post(gateway, protocol, world.key, "failover-event", f"hi [sim tag={tag} tokens=5]")
    assert response.status_code == 200
    assert len(wait_for_records(world.simulator.url, tag, count=2)) == 2
    assert "héllo" in response.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_non_streaming_body_is_the_providers_own(gateway, world, protocol):
    """F4: the channel is called in streaming mode, and the body assembled
    from its events equals what the provider's non-streaming endpoint returns."""
    fixed = f"[sim id=fixed{protocol} created=1700000000 tokens=6 thinking=2 tool=1 cached=1]"
    via_gateway = post(gateway, protocol, world.key, "sim-model", f"hi {fixed}")
    request = call(protocol, "sk-upstream-secret", "sim-model", f"hi {fixed}", stream=False)
    base = world.simulator.url + ("/v1" if protocol in ("chat", "responses") else "")
    path = request.path.removeprefix("/v1") if protocol in ("chat", "responses") else request.path
    direct = httpx.post(base + path, json=request.body, headers=request.headers)
    assert via_gateway.status_code == direct.status_code == 200
    assert via_gateway.json() == direct.json()


EXPECTED_ALL_FAILED = {
    "all-busy": {
        "chat": (429, ("error", "code"), "rate_limit_exceeded"),
        "responses": (429, ("error", "code"), "rate_limit_exceeded"),
        "messages": (529, ("error", "type"), "overloaded_error"),
        "gemini": (429, ("error", "status"), "RESOURCE_EXHAUSTED"),
    },
    "all-down": {
        "chat": (500, ("error", "type"), "server_error"),
        "responses": (500, ("error", "type"), "server_error"),
        "messages": (500, ("error", "type"), "api_error"),
        "gemini": (503, ("error", "status"), "UNAVAILABLE"),
    },
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["all-busy", "all-down"])
@pytest.mark.parametrize("streaming", [True, False])
def test_when_every_channel_fails_the_client_gets_an_ordinary_error(gateway, world, protocol, model, streaming):
    tag = new_tag()
    response = post(gateway, protocol, world.key, model, f"hi [sim tag={tag}]", stream=streaming)
    status, (outer, inner), value = EXPECTED_ALL_FAILED[model][protocol]
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.json()[outer][inner] == value
    assert "simulated" not in response.text
    if model == "all-busy":
        assert 0 < int(response.headers["retry-after"]) <= 60
    assert len(wait_for_records(world.simulator.url, tag, count=2)) == 2
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts, log.output_tokens) == ("failed", 2, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_the_provider_calls_invalid_is_not_retried(gateway, world, protocol):
    tag = new_tag()
    response = post(gateway, protocol, world.key, "bad-request", f"hi [sim tag={tag}]", stream=True)
    assert response.status_code == 400
    assert "simulated" not in response.text
    assert len(wait_for_records(world.simulator.url, tag)) == 1


# -- slow start (F3) and the hold cap (F7) -----------------------------------


def test_a_slow_claude_channel_is_abandoned_for_the_next(gateway, world):
    tag = new_tag()
    started = time.monotonic()
    response = stream(gateway, "messages", world.key, "claude-slow", f"hi [sim tag={tag} tokens=3]")
    assert response.status_code == 200
    slow, fast = wait_for_records(world.simulator.url, tag, count=2)
    assert slow["client_closed_at"] is not None and slow["tokens_sent"] == 0
    assert response.content == sent_bytes(fast)
    assert time.monotonic() - started < 2.5


def test_a_claude_request_with_thinking_waits_for_the_slow_channel(gateway, world):
    tag = new_tag()
    response = stream(
        gateway,
        "messages",
        world.key,
        "claude-slow",
        f"hi [sim tag={tag} tokens=3 thinking=2]",
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    (slow,) = wait_for_records(world.simulator.url, tag)
    assert slow["completed"] is True
    assert response.content == sent_bytes(slow)


def test_the_last_channel_is_never_abandoned_for_slowness(gateway, world):
    tag = new_tag()
    response = stream(gateway, "chat", world.key, "claude-slow-alone", f"hi [sim tag={tag} tokens=3]")
    (only,) = wait_for_records(world.simulator.url, tag)
    assert only["completed"] is True
    assert response.status_code == 200


def test_after_the_hold_cap_the_stream_starts_and_is_committed(gateway, world):
    tag = new_tag()
    prompt = f"hi [sim tag={tag} tokens=3 first_delay=4.6 error_after=1]"
    request = call("messages", world.key, "claude-sim", prompt, thinking={"type": "enabled", "budget_tokens": 1024})
    with httpx.stream("POST", gateway.url + request.path, json=request.body, headers=request.headers, timeout=30) as r:
        headers_at = time.time()
        body = r.read()
    (record,) = wait_for_records(world.simulator.url, tag)
    assert r.status_code == 200
    assert headers_at < record["first_token_at"]
    assert body.startswith(b"event: message_start")
    assert b'"overloaded_error"' not in body
    assert json.loads(body.rsplit(b"data: ", 1)[1])["error"]["type"] == "api_error"
    log = wait_for_log(r.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts) == ("interrupted", 1)
