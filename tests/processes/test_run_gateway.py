"""A request's life after the commit, through a running gateway and the
simulator: mid-stream errors, cuts and stalls (M2–M6), cancellation (B1),
affinity (P9) and the upstream connections a request gives back.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.utils import timezone

from billing.models import RequestLog
from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.relay_checks import (
    GENERIC_ERROR,
    INTERRUPTED,
    STALLED,
    TERMINALS,
    client_events,
    new_tag,
    post,
    stream,
    stream_errors,
)
from tests.support.wire import (
    PROTOCOLS,
    call,
    open_raw,
    records,
    strip_keepalives,
    wait_for_log,
    wait_for_records,
)

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)


# -- after the first token (M2–M6) -------------------------------------------

IN_STREAM_ERROR = {
    # protocol -> (how to find the error object, busy value, other value)
    "chat": (lambda e: e["error"]["code"], "rate_limit_exceeded", "server_error"),
    "responses": (lambda e: e["error"]["code"], "rate_limit_exceeded", "server_error"),
    "messages": (lambda e: e["error"]["type"], "overloaded_error", "api_error"),
    "gemini": (lambda e: e["error"]["status"], "RESOURCE_EXHAUSTED", "UNAVAILABLE"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("kind", ["overloaded", "server"])
def test_a_provider_error_mid_stream_becomes_a_generic_error_event(gateway, world, protocol, kind):
    tag = new_tag()
    response = stream(gateway, protocol, world.key, "sim-model", f"hi [sim tag={tag} tokens=6 error_after=2 error_kind={kind}]")
    (error,) = stream_errors(response.content)
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
    (error,) = stream_errors(response.content)
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
    (error,) = stream_errors(response.content)
    assert STALLED in json.dumps(error)
    _, keepalives = strip_keepalives(protocol, response.content)
    assert keepalives >= 2  # 1.5 s of stall at a 0.4 s keep-alive interval
    assert 1.4 < elapsed < 5
    (record,) = wait_for_records(world.simulator.url, tag, closed=True)
    assert record["client_closed_at"] is not None
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.status == "stalled"
    assert log.output_tokens >= 2


# -- an answer taken whole (F4) that fails after its first token ---------------

FAILED = {"chat": 500, "responses": 500, "messages": 500, "gemini": 503}
BUSY = {"chat": 429, "responses": 429, "messages": 529, "gemini": 429}
WHOLE_ANSWER_ENDS = {
    # directive -> (the status each protocol answers with, what its error
    # says, the log's status, whether the gateway hung up on the channel)
    "tokens=8 cut_after=3": (FAILED, INTERRUPTED, "interrupted", False),
    "tokens=8 stall_after=2": (FAILED, STALLED, "stalled", True),
    "tokens=6 error_after=2 error_kind=overloaded": (BUSY, "", "interrupted", False),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("directive", list(WHOLE_ANSWER_ENDS))
def test_a_whole_answer_failing_after_its_first_token_gets_the_table_e_error(gateway, world, protocol, directive):
    tag = new_tag()
    response = post(gateway, protocol, world.key, "sim-model", f"hi [sim tag={tag} {directive}]")
    statuses, message, logged, hung_up = WHOLE_ANSWER_ENDS[directive]
    assert response.status_code == statuses[protocol], response.text
    assert message in response.json()["error"]["message"]
    assert b"simulated" not in response.content
    (record,) = wait_for_records(world.simulator.url, tag, closed=hung_up)
    if hung_up:  # a channel that ends its answer itself has nothing to hang up on
        assert record["client_closed_at"] is not None
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.stream) == (logged, False)
    assert log.usage_estimated is True and log.output_tokens >= 2


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
    (error,) = stream_errors(response.content)
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
    response_id = first.json()["id"]
    tag = new_tag()
    for stream_it in (False, True):
        other = post(gateway, "responses", world.other_key, "affinity-model", f"again [sim tag={tag}]",
                     stream=stream_it, previous_response_id=response_id)
        # Refused as not found (table E), before any channel is called.
        assert other.status_code == 404
        error = other.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", "previous_response_id")
        log = wait_for_log(other.headers["x-hopbase-request-id"])
        assert (log.status, log.channel_id, log.attempts) == ("rejected", None, 0)
    assert records(world.simulator.url, tag) == []


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
