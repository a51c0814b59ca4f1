"""The relay, byte for byte, through a running gateway and the simulator:
pass-through and keep-alive (P6, S1, S2), the hold and failover (F1–F7),
stalls, mid-stream errors and cuts (M2–M6), cancellation (B1), affinity (P9).
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.utils import timezone

from billing.models import RequestLog
from tests.wire import (
    PROTOCOLS,
    call,
    channel_protocol,
    open_raw,
    sent_bytes,
    strip_keepalives,
    wait_for_log,
    wait_for_records,
)

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

GENERIC_ERROR = "The model provider returned an error. Please retry."
STALLED = "Upstream stopped responding mid-stream"
INTERRUPTED = "Response stream interrupted, please retry"
TERMINALS = {
    "chat": b"data: [DONE]",
    "responses": b"event: response.completed",
    "messages": b"event: message_stop",
    "gemini": b'"finishReason"',
}


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def stream(gateway, protocol: str, key: str, model: str, prompt: str, **extra) -> httpx.Response:
    request = call(protocol, key, model, prompt, stream=True, **extra)
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        response = client.post(request.path, json=request.body, headers=request.headers)
    return response


def post(gateway, protocol: str, key: str, model: str, prompt: str, stream: bool = False, **extra) -> httpx.Response:
    request = call(protocol, key, model, prompt, stream=stream, **extra)
    return httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=30)


def client_events(body: bytes) -> list[bytes]:
    return [e for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


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
        received = first
        while chunk := sock.recv(65536):
            received += chunk
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


# -- after the first token (M2–M6) -------------------------------------------

IN_STREAM_ERROR = {
    # protocol -> (how to find the error object, busy value, other value)
    "chat": (lambda e: e["error"]["code"], "rate_limit_exceeded", "server_error"),
    "responses": (lambda e: e["error"]["code"], "rate_limit_exceeded", "server_error"),
    "messages": (lambda e: e["error"]["type"], "overloaded_error", "api_error"),
    "gemini": (lambda e: e["error"]["status"], "RESOURCE_EXHAUSTED", "UNAVAILABLE"),
}


def error_events(protocol: str, body: bytes) -> list[dict]:
    found = []
    for event in client_events(body):
        for line in event.split(b"\n"):
            if line.startswith(b"data: ") and b'"error"' in line:
                data = json.loads(line[6:])
                if "error" in data and data.get("type") != "response.failed":
                    found.append(data)
    return found


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("kind", ["overloaded", "server"])
def test_a_provider_error_mid_stream_becomes_a_generic_error_event(gateway, world, protocol, kind):
    tag = new_tag()
    response = stream(gateway, protocol, world.key, "sim-model", f"hi [sim tag={tag} tokens=6 error_after=2 error_kind={kind}]")
    (error,) = error_events(protocol, response.content)
    extract, busy, other = IN_STREAM_ERROR[protocol]
    assert extract(error) == (busy if kind == "overloaded" else other)
    assert GENERIC_ERROR in json.dumps(error)
    assert b"simulated" not in response.content
    assert TERMINALS[protocol] not in response.content
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.status == "interrupted"
    assert log.usage_estimated is True


def test_responses_mid_stream_error_ends_with_response_failed_carrying_the_upstream_id(gateway, world):
    tag = new_tag()
    response = stream(gateway, "responses", world.key, "sim-model", f"hi [sim tag={tag} tokens=6 error_after=2 id=up42]")
    events = client_events(response.content)
    assert events[-2].startswith(b"event: error\n")
    assert events[-1].startswith(b"event: response.failed\n")
    failed = json.loads(events[-1].split(b"data: ", 1)[1])
    assert failed["response"]["id"] == "resp_up42"
    assert failed["response"]["status"] == "failed"
    error = json.loads(events[-2].split(b"data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["message"] == GENERIC_ERROR
    assert failed["sequence_number"] == error["sequence_number"] + 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_cut_stream_gets_the_interruption_event(gateway, world, protocol):
    tag = new_tag()
    response = stream(gateway, protocol, world.key, "sim-model", f"hi [sim tag={tag} tokens=8 cut_after=3]")
    (error,) = error_events(protocol, response.content)
    extract, _, other = IN_STREAM_ERROR[protocol]
    assert extract(error) == other
    assert INTERRUPTED in json.dumps(error)
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.status == "interrupted"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stalled_stream_is_ended_despite_keepalives(gateway, world, protocol):
    tag = new_tag()
    started = time.monotonic()
    response = stream(gateway, protocol, world.key, "sim-model", f"hi [sim tag={tag} tokens=8 stall_after=2]")
    elapsed = time.monotonic() - started
    (error,) = error_events(protocol, response.content)
    assert STALLED in json.dumps(error)
    _, keepalives = strip_keepalives(protocol, response.content)
    assert keepalives >= 2  # 1.5 s of stall at a 0.4 s keep-alive interval
    assert 1.4 < elapsed < 5
    (record,) = wait_for_records(world.simulator.url, tag, closed=True)
    assert record["client_closed_at"] is not None
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.status == "stalled"
    assert log.output_tokens >= 2


# -- cancellation (B1) ---------------------------------------------------------


def test_a_client_that_hangs_up_mid_stream_stops_the_model(gateway, world):
    tag = new_tag()
    request = call("messages", world.key, "sim-model", f"hi [sim tag={tag} tokens=200 pace=0.02]")
    with httpx.stream("POST", gateway.url + request.path, json=request.body, headers=request.headers) as r:
        request_id = r.headers["x-hopbase-request-id"]
        received = b""
        for chunk in r.iter_raw():
            received += chunk
            if received.count(b"text_delta") >= 3:
                break
        closed_at = time.time()
    (record,) = wait_for_records(world.simulator.url, tag, closed=True)
    assert record["client_closed_at"] - closed_at < 1
    assert record["tokens_at_close"] < 200
    log = wait_for_log(request_id)
    assert log.status == "cancelled"
    assert log.sent_chars > 0
    assert log.usage_estimated is True


@pytest.mark.parametrize("moment", ["hold", "keepalive gap"])
def test_a_client_that_hangs_up_while_nothing_flows_stops_the_model(gateway, world, moment):
    tag = new_tag()
    directive = "first_delay=3" if moment == "hold" else "tokens=5 stall_after=1"
    request = call("chat", world.key, "sim-model", f"hi [sim tag={tag} {directive}]")
    sock = open_raw(gateway.port, request)
    wait_for_records(world.simulator.url, tag)
    if moment == "keepalive gap":
        received = b""
        while b"hopbase-keepalive" not in received:
            received += sock.recv(65536)
    sock.close()
    closed_at = time.time()
    (record,) = wait_for_records(world.simulator.url, tag, closed=True)
    assert record["client_closed_at"] is not None
    assert record["client_closed_at"] - closed_at < 1


# -- affinity (P9) ---------------------------------------------------------------


def test_a_follow_up_response_goes_to_the_channel_that_holds_its_state(gateway, world):
    first = post(gateway, "responses", world.key, "affinity-model", "hi [sim tokens=2]")
    first_log = wait_for_log(first.headers["x-hopbase-request-id"])
    for _ in range(6):
        follow = post(gateway, "responses", world.key, "affinity-model", "again", previous_response_id=first.json()["id"])
        assert follow.status_code == 200
        assert wait_for_log(follow.headers["x-hopbase-request-id"]).channel_id == first_log.channel_id


# -- upstream connections ------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_finished_requests_give_their_upstream_connection_back_for_reuse(gateway, world, streaming):
    """A request that ended normally returns its connection to the pool, so
    the next one to the same channel reuses it instead of leaking it."""
    tag = new_tag()

    def one(protocol: str) -> int:
        return post(gateway, protocol, world.key, "sim-model", f"hi [sim tag={tag} tokens=3]", stream=streaming).status_code

    # Four at a time, so some requests end while their channel's last bytes
    # are still in flight: that is when a careless hang-up leaks.
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(one, ("chat", "responses", "messages", "gemini") * 50)) == {200}
    peers = {record["peer"] for record in wait_for_records(world.simulator.url, tag, count=200)}
    assert len(peers) <= 8


def test_a_stream_committed_by_the_hold_cap_that_never_delivers_costs_nothing(gateway, world):
    """F7 then M2 before any content: the client gets the stall error, and
    the request failed before its first token, so it is free (B5)."""
    tag = new_tag()
    response = stream(gateway, "messages", world.key, "claude-sim", f"hi [sim tag={tag} stall_after=0]")
    assert response.status_code == 200
    assert response.content.startswith(b"event: message_start")
    (error,) = error_events("messages", response.content)
    assert error["error"]["message"] == STALLED
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.input_tokens, log.output_tokens) == ("failed", 0, 0)


def test_a_client_that_leaves_before_any_channel_answers_is_not_charged(gateway, world):
    """Waiting for the key's only slot (F8), the client hangs up: nothing
    reached a provider, so the cancelled request costs nothing."""
    started = timezone.now()
    holder = new_tag()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, gateway, "chat", world.one_at_a_time_key, "sim-model", f"hi [sim tag={holder} first_delay=2]")
        wait_for_records(world.simulator.url, holder)  # the key's slot is taken
        request = call("chat", world.one_at_a_time_key, "sim-model", "a long question " * 200, stream=False)
        with open_raw(gateway.port, request):
            time.sleep(0.3)  # nothing to observe: the request is waiting inside the gateway
        assert first.result().status_code == 200
    from billing.models import RequestLog

    deadline = time.monotonic() + 5
    mine = RequestLog.objects.filter(api_key__label="serial", status="cancelled", attempts=0, created_at__gte=started)
    while not (log := mine.order_by("-id").first()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (log.input_tokens, log.output_tokens, log.usage_estimated) == (0, 0, True)


def test_a_client_header_that_is_not_ascii_does_not_break_the_upstream_call(gateway, world):
    request = call("messages", world.key, "sim-model", "hi [sim tokens=2]")
    headers = {**request.headers, "user-agent": "MyApp/1.0 (Zürich)".encode()}
    response = httpx.post(gateway.url + request.path, json=request.body, headers=headers, timeout=10)
    assert response.status_code == 200


def test_another_tenant_cannot_follow_a_response_it_does_not_own(gateway, world):
    first = post(gateway, "responses", world.key, "affinity-model", "hi [sim tokens=2]")
    owner_channel = wait_for_log(first.headers["x-hopbase-request-id"]).channel_id
    channels = set()
    for _ in range(16):
        other = post(gateway, "responses", world.other_key, "affinity-model", "again", previous_response_id=first.json()["id"])
        channels.add(wait_for_log(other.headers["x-hopbase-request-id"]).channel_id)
    # Not pinned: the two equal channels share its requests at random.
    assert len(channels) == 2 and owner_channel in channels


def test_a_gemini_request_naming_a_cache_goes_to_the_channel_that_holds_it(gateway, world):
    from google import genai
    from google.genai import types

    client = genai.Client(api_key=world.key, http_options=types.HttpOptions(base_url=gateway.url, api_version="v1beta"))
    tag = new_tag()
    cache = client.caches.create(
        model="affinity-model",
        config=types.CreateCachedContentConfig(contents=[f"a long shared document [sim tag={tag}]"]),
    )
    (created,) = wait_for_records(world.simulator.url, tag)
    holder = world.channels["gemini-affinity-model-" + ("a" if created["api_key"] == "sk-upstream-secret" else "b")]
    for _ in range(16):
        follow = post(gateway, "gemini", world.key, "affinity-model", "and then?", cachedContent=cache.name)
        assert follow.status_code == 200
        assert wait_for_log(follow.headers["x-hopbase-request-id"]).channel_id == holder
    creation = RequestLog.objects.filter(tenant_id=world.tenant_id, channel_id=holder, cache_write_tokens=6)
    assert creation.exists()  # the creation itself is logged, its tokens billed as cache writes
