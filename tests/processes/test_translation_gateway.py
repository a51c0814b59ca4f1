"""Any client API to any channel (T1–T4), through the official SDKs
against a running gateway and the simulator as every provider.

Each public model ``via-P`` is served only by a channel of protocol P, under
an alias (the simulator records the upstream name). Every client API asks
each of them, streaming and not: pass-through where the protocols match,
translated otherwise, and the SDK sees the same answer either way.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.protocol_checks import (
    TOOL_ARGUMENTS,
    TOOL_NAME,
    new_tag,
    prompt,
    upstream_record,
    wait_for_log,
    words,
)
from tests.support.relay_checks import stream_errors
from tests.support.translation_clients import CHANNEL_PROTOCOLS, CLIENT_APIS, NATIVE, ask, count_tokens
from tests.support.wire import call, wait_for_records

pytestmark = pytest.mark.gateway

PAIRS = [(api, wire) for api in CLIENT_APIS for wire in CHANNEL_PROTOCOLS]
UPSTREAM = {"openai": "gpt-upstream", "anthropic": "claude-upstream", "gemini": "gemini-upstream"}
UPSTREAM_PATH = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages",
                 "gemini": "/v1beta/models/gemini-upstream:streamGenerateContent"}


def pair_id(pair) -> str:
    return "{}->{}".format(*pair)


def check_logged(world, answer, api: str, wire: str, model: str, *, output: int, attempts: int = 1):
    log = wait_for_log(answer.request_id)
    assert (log.status, log.protocol, log.model, log.attempts) == ("completed", api, model, attempts)
    assert log.channel_id == world.channels[f"{wire}-{model}-{'main' if attempts == 1 else 'good'}"]
    assert log.upstream_model == UPSTREAM[wire]
    assert log.output_tokens == output and log.usage_estimated is False
    return log


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_text_answers_cross_every_pair(gateway, world, sim_records, committed_db, pair, stream):
    api, wire = pair
    model, tag = f"via-{wire}", new_tag()
    text = prompt(tag, tokens=5)

    answer = ask(gateway, world.key, api, model, text, stream=stream)

    assert len(answer.text.split()) == 5 and answer.stop == "end"
    assert (answer.input_tokens, answer.output_tokens) == (words(text), 5)
    record = upstream_record(sim_records, tag)
    passes_through = NATIVE[api] == wire
    assert record["protocol"] == ("responses" if passes_through and api == "responses" else
                                  {"openai": "chat"}.get(wire, wire))
    # T4: the channel is sent the upstream name; a translated answer names the public one.
    assert record["model"] == UPSTREAM[wire]
    assert answer.model in ((UPSTREAM[wire], f"models/{UPSTREAM[wire]}") if passes_through else (model,))
    log = check_logged(world, answer, api, wire, model, output=5)
    assert log.input_tokens == words(text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_tool_calls_cross_every_pair(gateway, world, sim_records, committed_db, pair, stream):
    api, wire = pair
    model, tag = f"via-{wire}", new_tag()
    text = prompt(tag, tokens=0, tool=1)

    answer = ask(gateway, world.key, api, model, text, stream=stream, tool=True)

    assert answer.tool_calls == [(TOOL_NAME, TOOL_ARGUMENTS)]
    assert answer.stop == "tool"
    sent = upstream_record(sim_records, tag)["body"]
    # The tool's definition reached the channel in its own protocol's shape.
    assert TOOL_NAME in json.dumps(sent.get("tools"))
    check_logged(world, answer, api, wire, model, output=0)


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_thinking_crosses_every_pair(gateway, world, sim_records, committed_db, pair):
    api, wire = pair
    model, tag = f"via-{wire}", new_tag()
    text = prompt(tag, tokens=3, thinking=4)

    answer = ask(gateway, world.key, api, model, text, stream=True, thinking=True)

    assert len(answer.text.split()) == 3
    assert len(answer.thinking.split()) == 4
    assert answer.output_tokens == 7
    check_logged(world, answer, api, wire, model, output=7)


@pytest.mark.parametrize("api", CLIENT_APIS)
def test_a_busy_channel_of_one_protocol_fails_over_to_another(gateway, world, sim_records, committed_db, api):
    tag = new_tag()
    text = prompt(tag, tokens=4)

    answer = ask(gateway, world.key, api, "via-failover", text, stream=True)

    assert len(answer.text.split()) == 4 and answer.stop == "end"
    protocols = sorted(r["protocol"] for r in sim_records(tag))
    assert protocols == ["anthropic", "gemini"]
    check_logged(world, answer, api, "gemini", "via-failover", output=4, attempts=2)


STREAM_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def raw_stream_request(key: str, api: str, model: str, text: str) -> tuple[str, dict, dict]:
    """(path, headers, body) of a streaming request in the client API's own shape."""
    if api == "gemini":
        return (f"/v1beta/models/{model}:streamGenerateContent?alt=sse", {"x-goog-api-key": key},
                {"contents": [{"role": "user", "parts": [{"text": text}]}]})
    body: dict = {"model": model, "stream": True}
    if api == "responses":
        body["input"] = text
    else:
        body["messages"] = [{"role": "user", "content": text}]
        body["max_tokens"] = 512
    headers = {"authorization": f"Bearer {key}"} if api != "messages" else {"x-api-key": key,
                                                                            "anthropic-version": "2023-06-01"}
    return STREAM_PATHS[api], headers, body


def raw_stream(gateway, key: str, api: str, model: str, text: str) -> httpx.Response:
    path, headers, body = raw_stream_request(key, api, model, text)
    return httpx.post(gateway.url + path, headers=headers, json=body, timeout=20)


TERMINALS = {"chat": b"[DONE]", "responses": b"response.completed", "messages": b"message_stop",
             "gemini": b"finishReason"}


@pytest.mark.parametrize("pair", [p for p in PAIRS if NATIVE[p[0]] != p[1]], ids=pair_id)
def test_a_translated_stream_cut_mid_way_ends_with_the_callers_error_event(gateway, world, committed_db, pair):
    api, wire = pair
    tag = new_tag()

    response = raw_stream(gateway, world.key, api, f"via-{wire}", prompt(tag, tokens=8, error_after=3))

    assert response.status_code == 200
    errors = stream_errors(response.content)
    assert len(errors) == 1, response.content
    assert TERMINALS[api] not in response.content.split(b"error")[-1]
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.status == "interrupted" and log.model == f"via-{wire}"


@pytest.mark.parametrize("pair", [p for p in PAIRS if NATIVE[p[0]] != p[1]], ids=pair_id)
def test_a_slow_translated_stream_gets_keepalives_then_a_stall_error(gateway, world, committed_db, pair):
    api, wire = pair
    tag = new_tag()

    response = raw_stream(gateway, world.key, api, f"via-{wire}", prompt(tag, tokens=6, stall_after=2))

    assert response.status_code == 200
    keepalive = b"\n\n\n" if api == "gemini" else b": hopbase-keepalive"
    assert keepalive in response.content
    assert len(stream_errors(response.content)) == 1
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert log.status == "stalled"


@pytest.mark.parametrize("api", ["messages", "gemini"])
@pytest.mark.parametrize("wire", CHANNEL_PROTOCOLS)
def test_count_tokens_asks_the_serving_provider_or_estimates(gateway, world, sim_records, api, wire):
    tag = new_tag()
    text = prompt(tag)
    model = f"via-{wire}"
    response, counted = count_tokens(gateway, world.key, api, model, text)
    assert response.status_code == 200
    if wire == "openai":
        # No counting endpoint for Chat Completions: estimated from characters.
        assert response.headers["x-hopbase-estimated"] == "true"
        assert counted == -(-len(text) // 4)
    else:
        assert "x-hopbase-estimated" not in response.headers
        assert counted == words(text)
        (record,) = sim_records(tag)
        assert record["protocol"] == wire and record["model"] == UPSTREAM[wire]


def test_a_field_no_channel_can_serve_is_refused_naming_it(gateway, world):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"authorization": f"Bearer {world.key}"},
                          json={"model": "via-anthropic", "n": 2, "messages": [{"role": "user", "content": "hi"}]},
                          timeout=20)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "n")


def test_every_model_is_listed_whatever_protocol_serves_it(gateway, world):
    listed = httpx.get(f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {world.key}"}, timeout=20)
    names = {entry["id"] for entry in listed.json()["data"]}
    assert {"via-openai", "via-anthropic", "via-gemini"} <= names
    gemini = httpx.get(f"{gateway.url}/v1beta/models", headers={"x-goog-api-key": world.key}, timeout=20)
    assert "models/via-anthropic" in {entry["name"] for entry in gemini.json()["models"]}


CALL_ID = "call_7"
RESULT = "18 degrees and sunny"


def second_turn(api: str, model: str, text: str) -> tuple[str, dict, dict]:
    """A conversation's second turn, in the client API's own shape: the
    user's question, the model's call of the weather tool, the tool's result."""
    args = json.dumps(TOOL_ARGUMENTS)
    if api == "chat":
        return "/v1/chat/completions", {"authorization": "Bearer {key}"}, {"model": model, "messages": [
            {"role": "user", "content": text},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": CALL_ID, "type": "function", "function": {"name": TOOL_NAME, "arguments": args}}]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": RESULT}]}
    if api == "responses":
        return "/v1/responses", {"authorization": "Bearer {key}"}, {"model": model, "input": [
            {"role": "user", "content": text},
            {"type": "function_call", "call_id": CALL_ID, "name": TOOL_NAME, "arguments": args},
            {"type": "function_call_output", "call_id": CALL_ID, "output": RESULT}]}
    if api == "messages":
        return "/v1/messages", {"x-api-key": "{key}", "anthropic-version": "2023-06-01"}, {
            "model": model, "max_tokens": 64, "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": CALL_ID, "name": TOOL_NAME, "input": TOOL_ARGUMENTS}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": RESULT}]}]}
    return f"/v1beta/models/{model}:generateContent", {"x-goog-api-key": "{key}"}, {"contents": [
        {"role": "user", "parts": [{"text": text}]},
        {"role": "model", "parts": [{"functionCall": {"name": TOOL_NAME, "args": TOOL_ARGUMENTS}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": TOOL_NAME, "response": {"result": RESULT}}}]}]}


def tool_result_sent(wire: str, body: dict) -> tuple[str, str]:
    """(the called tool's name, the result) as the channel's protocol carries them."""
    if "input" in body:  # a Responses client on an OpenAI channel: passed through
        (call,) = [i for i in body["input"] if i.get("type") == "function_call"]
        (result,) = [i for i in body["input"] if i.get("type") == "function_call_output"]
        assert result["call_id"] == call["call_id"]
        return call["name"], json.dumps(result["output"])
    if wire == "openai":
        (call,) = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
        (result,) = [m for m in body["messages"] if m["role"] == "tool"]
        assert result["tool_call_id"] == call["id"]
        return call["function"]["name"], json.dumps(result["content"])
    if wire == "anthropic":
        blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
        (use,) = [b for b in blocks if b["type"] == "tool_use"]
        (result,) = [b for b in blocks if b["type"] == "tool_result"]
        assert result["tool_use_id"] == use["id"]
        return use["name"], json.dumps(result["content"])
    parts = [p for c in body["contents"] for p in c["parts"]]
    (call,) = [p["functionCall"] for p in parts if "functionCall" in p]
    (result,) = [p["functionResponse"] for p in parts if "functionResponse" in p]
    assert result["name"] == call["name"]
    return call["name"], json.dumps(result["response"])


@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_a_tool_result_turn_reaches_the_channel_in_its_own_shape(gateway, world, sim_records, committed_db, pair):
    api, wire = pair
    tag = new_tag()
    path, headers, body = second_turn(api, f"via-{wire}", prompt(tag, tokens=4))
    headers = {name: value.format(key=world.key) for name, value in headers.items()}

    response = httpx.post(gateway.url + path, headers=headers, json=body, timeout=20)

    assert response.status_code == 200, response.text
    name, result = tool_result_sent(wire, upstream_record(sim_records, tag)["body"])
    assert name == TOOL_NAME and RESULT in result


DELTA_MARKS = {"chat": b'"content"', "responses": b"output_text.delta", "messages": b"text_delta",
               "gemini": b'"text"'}


@pytest.mark.parametrize("pair", [("messages", "openai"), ("chat", "gemini"), ("gemini", "anthropic")], ids=pair_id)
def test_a_client_hanging_up_on_a_translated_stream_stops_the_model(gateway, world, committed_db, pair):
    api, wire = pair
    tag = new_tag()
    request = raw_stream_request(world.key, api, f"via-{wire}", prompt(tag, tokens=200, pace=0.02))
    with httpx.stream("POST", gateway.url + request[0], headers=request[1], json=request[2], timeout=20) as r:
        request_id = r.headers["x-hopbase-request-id"]
        received = b""
        for chunk in r.iter_raw():
            received += chunk
            if received.count(DELTA_MARKS[api]) >= 3:
                break
        closed_at = time.time()
    (record,) = wait_for_records(world.simulator.url, tag, closed=True)
    assert record["client_closed_at"] - closed_at < 1
    assert record["tokens_at_close"] < 200
    log = wait_for_log(request_id)
    assert (log.status, log.model) == ("cancelled", f"via-{wire}")


PREAMBLES = {"chat": b'"role":"assistant"', "responses": b"event: response.created",
             "messages": b"event: message_start"}
ENDS = {"chat": b"data: [DONE]", "responses": b"event: response.completed", "messages": b"event: message_stop"}


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_failover_across_protocols_leaves_one_clean_stream(gateway, world, committed_db, api):
    tag = new_tag()

    response = raw_stream(gateway, world.key, api, "via-failover", prompt(tag, tokens=4))

    assert response.status_code == 200
    # Nothing of the refused attempt reached the client: one preamble, one end, no error.
    assert response.content.count(PREAMBLES[api]) == 1
    assert response.content.count(ENDS[api]) == 1
    assert stream_errors(response.content) == []


CODEX_REQUEST = {"stream": True, "store": False, "include": ["reasoning.encrypted_content"],
                 "reasoning": {"summary": "auto"}, "tool_choice": "auto", "parallel_tool_calls": True}


def codex_turn(gateway, key: str, model: str, items: list[dict]) -> list[dict]:
    """One Codex turn through the gateway: the output items, handed back as
    the Codex CLI sends them (0.171, tests/processes/test_real_clients.py): a
    reasoning item with its null fields, its ids kept."""
    response = httpx.post(f"{gateway.url}/v1/responses", headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "input": items, **CODEX_REQUEST}, timeout=20)
    assert response.status_code == 200, response.text
    (completed,) = [json.loads(line[6:]) for line in response.text.splitlines()
                    if line.startswith("data: ") and '"response.completed"' in line]
    output = completed["response"]["output"]
    return [{"type": "reasoning", "id": item["id"], "summary": item["summary"], "content": None,
             "encrypted_content": item.get("encrypted_content")} if item["type"] == "reasoning" else item
            for item in output]


def user_says(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@pytest.mark.parametrize("wire", ["anthropic", "gemini"])
def test_a_codex_turn_after_another_protocols_thinking_reaches_openai_without_it(gateway, world, sim_records,
                                                                                 committed_db, wire):
    """Codex's first turn on a Claude channel (thinking sealed
    with its signature) or a Gemini one (thinking with no state: no
    encrypted_content at all), its second passed through to an OpenAI
    channel. OpenAI refuses a reasoning item it cannot use and never stored
    (store false: "Item with id 'rs_…' not found"): none may reach it."""
    first, second = new_tag(), new_tag()
    turn = [user_says(prompt(first, tokens=3, thinking=4))]
    output = codex_turn(gateway, world.key, f"via-{wire}", turn)
    (reasoning,) = [item for item in output if item["type"] == "reasoning"]
    assert len(reasoning["summary"][0]["text"].split()) == 4
    assert bool(reasoning["encrypted_content"]) == (wire == "anthropic")

    turn += [*output, user_says(prompt(second, tokens=2))]
    codex_turn(gateway, world.key, "via-openai", turn)

    sent = upstream_record(sim_records, second)
    assert sent["protocol"] == "responses" and sent["model"] == UPSTREAM["openai"]
    assert [item for item in sent["body"]["input"] if item.get("type") == "reasoning"] == []
    assert sent["body"]["input"] == [item for item in turn if item["type"] != "reasoning"]
    assert "hb1." not in json.dumps(sent["body"])


def nested(depth: int) -> dict:
    value: dict = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"x": value}}
    return value


@pytest.mark.parametrize(("api", "model"), [("chat", "via-anthropic"), ("messages", "via-openai"),
                                            ("gemini", "via-openai"), ("responses", "via-gemini")])
def test_a_request_nested_too_deeply_to_translate_is_a_400_in_the_callers_format(gateway, world, api, model):
    schema = nested(300)  # JSON readers take it; writers stop at 255 levels
    tools = {
        "chat": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
        "responses": [{"type": "function", "name": "f", "parameters": schema}],
        "messages": [{"name": "f", "input_schema": schema}],
        "gemini": [{"functionDeclarations": [{"name": "f", "parameters": schema}]}],
    }[api]
    request = call(api, world.key, model, "hello", stream=False, tools=tools)
    # Written by the standard library: orjson itself refuses to write it.
    response = httpx.post(gateway.url + request.path, content=json.dumps(request.body),
                          headers={**request.headers, "content-type": "application/json"}, timeout=10)
    assert response.status_code == 400, response.text
    assert "nested" in response.text


@pytest.mark.usefixtures("committed_db")
def test_counting_stops_at_the_first_channel_that_answers_and_is_logged(gateway, world, sim_records):
    tag = new_tag()
    # bad-request's first channel refuses every request with a 400; the second would answer.
    response, counted = count_tokens(gateway, world.key, "messages", "bad-request", prompt(tag))
    assert response.status_code == 200 and response.headers["x-hopbase-estimated"] == "true"
    assert [record["directives"].get("status") for record in sim_records(tag)] == ["400"]
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts, log.charge_usd or 0) == ("completed", 1, 0)
    assert log.channel_id == world.channels["anthropic-bad-request-strict"]


@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("api", ["messages", "gemini"])
def test_counting_obeys_the_keys_requests_per_minute(gateway, world, api):
    key = world.two_a_minute_key
    if api == "messages":
        def one() -> httpx.Response:
            return httpx.post(f"{gateway.url}/v1/messages/count_tokens", timeout=20,
                              headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                              json={"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]})
    else:
        def one() -> httpx.Response:
            return httpx.post(f"{gateway.url}/v1beta/models/sim-model:countTokens", timeout=20,
                              headers={"x-goog-api-key": key}, json={"contents": [{"parts": [{"text": "hello"}]}]})
    answers = [one() for _ in range(3)]  # the key takes two a minute
    assert answers[-1].status_code == 429, [a.text for a in answers]
    logs = [wait_for_log(a.headers["x-hopbase-request-id"]) for a in answers]
    assert logs[-1].status == "rejected" and logs[-1].error_kind == "rate_limit"
