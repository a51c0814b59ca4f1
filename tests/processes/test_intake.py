"""The front door: keys (P7), refusals in the caller's own error format
(table E) and one request log per request whose key is known (P8)."""

from __future__ import annotations

import io
import json
import time
from urllib.parse import quote

import httpx
import pytest
from django.core.handlers.asgi import ASGIRequest
from django.test import RequestFactory

from billing.models import RequestLog
from gateway.intake import client_headers
from tests.support.wire import PROTOCOLS, call, records, wait_for_log, wait_for_records

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


def error_of(protocol: str, response: httpx.Response) -> str:
    """The error type (OpenAI, Anthropic) or status (Gemini) of a refusal."""
    body = response.json()
    if protocol == "messages":
        assert body["type"] == "error"
        return body["error"]["type"]
    if protocol == "gemini":
        assert isinstance(body["error"]["code"], int)
        assert body["error"]["code"] == response.status_code
        return body["error"]["status"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["type"]


def send(gateway, request, content: bytes | None = None, **headers) -> httpx.Response:
    merged = {**request.headers, **headers}
    if content is None:
        return httpx.post(gateway.url + request.path, json=request.body, headers=merged)
    return httpx.post(gateway.url + request.path, content=content, headers=merged)


MALFORMED = {"chat": "invalid_request_error", "responses": "invalid_request_error", "messages": "invalid_request_error", "gemini": "INVALID_ARGUMENT"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    "case,content",
    [
        ("invalid json", b"{not json"),
        ("not an object", b"[1, 2]"),
        ("missing model", b'{"messages": [], "input": "x", "contents": []}'),
        ("model not a string", b'{"model": 7, "messages": [], "input": "x", "contents": []}'),
        ("stream not a boolean", b'{"model": "sim-model", "stream": "yes", "messages": [], "input": "x"}'),
        ("not utf-8", b'{"model": "\xff"}'),
    ],
)
def test_a_malformed_body_is_refused_in_the_callers_format(gateway, world, protocol, case, content):
    if protocol == "gemini" and case in ("missing model", "model not a string", "stream not a boolean"):
        content = b'{"contents": "not a list"}'  # Gemini names the model in the path
    request = call(protocol, world.key, "sim-model", "hi")
    response = send(gateway, request, content=content, **{"content-type": "application/json"})
    assert response.status_code == 400
    assert error_of(protocol, response) == MALFORMED[protocol]
    assert response.headers["x-should-retry"] == "false"
    log = wait_for_log(response.headers["x-hopbase-request-id"])
    assert (log.status, log.tenant_id, log.output_tokens) == ("rejected", world.tenant_id, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_absurdly_nested_body_is_malformed_not_a_server_error(gateway, world, protocol):
    nested = "[" * 900 + "]" * 900
    request = call(protocol, world.key, "sim-model", "hi")
    field = {"chat": "messages", "messages": "messages", "responses": "input", "gemini": "contents"}[protocol]
    content = f'{{"model": "sim-model", "{field}": [{{"role": "user", "content": {nested}, "parts": {nested}}}]}}'
    response = send(gateway, request, content=content.encode(), **{"content-type": "application/json"})
    assert response.status_code == 400
    assert error_of(protocol, response) == MALFORMED[protocol]
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "rejected"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_body_that_is_not_json_by_content_type_is_refused(gateway, world, protocol):
    request = call(protocol, world.key, "sim-model", "hi")
    response = send(gateway, request, content=b"model=sim-model", **{"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 400
    assert error_of(protocol, response) == MALFORMED[protocol]


TOO_LARGE = {"chat": "invalid_request_error", "responses": "invalid_request_error", "messages": "request_too_large", "gemini": "INVALID_ARGUMENT"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_body_over_the_limit_gets_413_in_the_callers_format(gateway, world, protocol):
    request = call(protocol, world.key, "sim-model", "x" * 70_000)  # the test gateway allows 64 KiB
    response = send(gateway, request)
    assert response.status_code == 413
    assert error_of(protocol, response) == TOO_LARGE[protocol]
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "rejected"


def test_a_body_of_no_declared_length_past_the_limit_gets_413(gateway, world):
    # Sent in chunks, without Content-Length: only its size read says it is too large.
    request = call("chat", world.key, "sim-model", "hi")
    piece = b"x" * 16_384

    def chunks():
        yield json.dumps(request.body).encode()[:-1] + b', "pad": "'
        for _ in range(64):  # 1 MiB, sixteen times the test gateway's limit
            yield piece
        yield b'"}'

    response = httpx.post(gateway.url + request.path, content=chunks(), headers=request.headers)
    assert response.status_code == 413
    assert error_of("chat", response) == TOO_LARGE["chat"]


NOT_FOUND = {"chat": "invalid_request_error", "responses": "invalid_request_error", "messages": "not_found_error", "gemini": "NOT_FOUND"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("key_name,model", [("key", "no-such-model"), ("limited_key", "claude-sim")])
def test_an_unknown_or_forbidden_model_is_404(gateway, world, protocol, key_name, model):
    response = send(gateway, call(protocol, getattr(world, key_name), model, "hi"))
    assert response.status_code == 404
    assert error_of(protocol, response) == NOT_FOUND[protocol]
    if protocol in ("chat", "responses"):
        assert response.json()["error"]["code"] == "model_not_found"
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "rejected"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_model_without_a_price_is_never_served(gateway, world, protocol):
    tag = f"unpriced{protocol}"
    response = send(gateway, call(protocol, world.key, "unpriced-model", f"hi [sim tag={tag}]"))
    assert response.status_code == 404
    assert error_of(protocol, response) == NOT_FOUND[protocol]
    assert "no price" in response.text
    assert records(world.simulator.url, tag) == []
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "rejected"


BROKE = {
    "chat": (429, "insufficient_quota"),
    "responses": (429, "insufficient_quota"),
    "messages": (400, "invalid_request_error"),
    "gemini": (429, "RESOURCE_EXHAUSTED"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_tenant_without_credit_is_refused_before_any_upstream_call(gateway, world, protocol):
    tag = f"broke{protocol}"
    response = send(gateway, call(protocol, world.broke_key, "sim-model", f"hi [sim tag={tag}]"))
    status, error = BROKE[protocol]
    assert response.status_code == status
    assert error_of(protocol, response) == error
    assert response.headers["x-should-retry"] == "false"
    assert "credit balance is too low" in response.text
    assert records(world.simulator.url, tag) == []
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "rejected"


INVALID_KEY = {
    "chat": (401, "invalid_request_error"),
    "responses": (401, "invalid_request_error"),
    "messages": (401, "authentication_error"),
    "gemini": (400, "INVALID_ARGUMENT"),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("which", ["unknown", "revoked", "missing"])
def test_a_bad_key_is_refused_and_not_logged(gateway, world, protocol, which):
    key = {"unknown": "hb-not-a-real-key", "revoked": world.revoked_key, "missing": ""}[which]
    request = call(protocol, key, "sim-model", "hi")
    headers = request.headers
    if which == "missing":
        headers = {k: v for k, v in headers.items() if k not in ("authorization", "x-api-key", "x-goog-api-key")}
    response = httpx.post(gateway.url + request.path, json=request.body, headers=headers)
    status, error = INVALID_KEY[protocol]
    assert response.status_code == status
    assert error_of(protocol, response) == error
    if protocol == "gemini":
        assert response.json()["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    if protocol in ("chat", "responses"):
        assert response.json()["error"]["code"] == "invalid_api_key"
    # Logs are written in order: once a later request's log is in, this one's
    # would be too.
    later = send(gateway, call(protocol, world.key, "no-such-model", "hi"))
    assert wait_for_log(later.headers["x-hopbase-request-id"]) is not None
    assert not RequestLog.objects.filter(request_id=response.headers["x-hopbase-request-id"]).exists()


@pytest.mark.parametrize("header", ["authorization", "x-api-key", "x-goog-api-key", "query"])
def test_the_key_is_accepted_wherever_an_sdk_sends_it(gateway, world, header):
    request = call("gemini", world.key, "sim-model", "hi", stream=False)
    if header == "authorization":
        headers, params = {"authorization": f"Bearer {world.key}"}, {}
    elif header == "query":
        headers, params = {}, {"key": world.key}
    else:
        headers, params = {header: world.key}, {}
    response = httpx.post(gateway.url + request.path, json=request.body, headers=headers, params=params)
    assert response.status_code == 200
    assert response.json()["candidates"][0]["content"]["parts"][0]["text"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_wrong_method_is_405_in_the_callers_format(gateway, world, protocol):
    request = call(protocol, world.key, "sim-model", "hi")
    response = httpx.get(gateway.url + request.path, headers=request.headers)
    assert response.status_code == 405
    assert error_of(protocol, response) == MALFORMED[protocol]


@pytest.mark.parametrize(
    "path,headers,expected",
    [
        ("/v1/nothing/here", {}, ("chat", "invalid_request_error")),
        ("/v1/nothing/here", {"anthropic-version": "2023-06-01"}, ("messages", "not_found_error")),
        ("/v1beta/tunedModels/x", {}, ("gemini", "NOT_FOUND")),
    ],
)
def test_an_unknown_path_is_404_in_the_callers_format(gateway, world, path, headers, expected):
    response = httpx.post(gateway.url + path, json={}, headers={"authorization": f"Bearer {world.key}", **headers})
    protocol, error = expected
    assert response.status_code == 404
    assert "html" not in response.headers["content-type"]
    assert error_of(protocol, response) == error


def test_every_response_carries_its_request_id_and_each_request_one_log(gateway, world):
    ids = []
    for protocol in PROTOCOLS:
        response = send(gateway, call(protocol, world.key, "sim-model", "hi", stream=False))
        assert response.status_code == 200
        ids.append(response.headers["x-hopbase-request-id"])
    assert len(set(ids)) == len(ids)
    for request_id in ids:
        assert wait_for_log(request_id) is not None
        assert RequestLog.objects.filter(request_id=request_id).count() == 1


def test_gemini_streams_in_the_json_array_form_without_alt_sse(gateway, world):
    request = call("gemini", world.key, "sim-model", "hi [sim tokens=3]")
    response = httpx.post(
        gateway.url + request.path.split("?")[0], json=request.body, headers=request.headers, timeout=10
    )
    assert response.status_code == 200
    chunks = response.json()
    assert isinstance(chunks, list) and len(chunks) >= 3
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert "".join(p["text"] for c in chunks for p in c["candidates"][0]["content"]["parts"]).startswith("héllo")


def test_healthz_answers_without_a_key_and_counts_unknown_keys(gateway):
    before = httpx.get(gateway.url + "/healthz").json()["unknown_key_requests"]
    request = call("chat", "hb-nobody", "sim-model", "hi")
    assert httpx.post(gateway.url + request.path, json=request.body, headers=request.headers).status_code == 401
    response = httpx.get(gateway.url + "/healthz")
    assert response.status_code == 200
    assert response.json()["unknown_key_requests"] == before + 1


def test_a_revoked_key_stops_working_within_the_cache_ttl(gateway, world):
    from tenants.models import ApiKey, Tenant

    row, secret = ApiKey.objects.issue(Tenant.objects.get(pk=world.tenant_id), label="soon revoked")
    request = call("chat", secret, "sim-model", "hi", stream=False)
    assert httpx.post(gateway.url + request.path, json=request.body, headers=request.headers).status_code == 200
    row.revoke()
    revoked_at = time.monotonic()
    while (refused := httpx.post(gateway.url + request.path, json=request.body,
                                 headers=request.headers)).status_code == 200:
        assert time.monotonic() - revoked_at < 0.5 + 1  # HOPBASE_CONFIG_TTL in the test gateway, plus slack
    assert time.monotonic() - revoked_at < 1.5
    # The refusal meant: table E's unknown key, in the caller's format.
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", refused.text


def test_a_request_marks_its_key_as_used(gateway, world):
    from tenants.models import ApiKey

    key = ApiKey.objects.authenticate(world.other_key)
    before = key.last_used_at
    response = send(gateway, call("chat", world.other_key, "sim-model", "hi [sim tokens=1]", stream=False))
    assert response.status_code == 200
    deadline = time.monotonic() + 10  # written in the background every 5 s
    while ApiKey.objects.get(pk=key.pk).last_used_at == before and time.monotonic() < deadline:
        time.sleep(0.05)
    used = ApiKey.objects.get(pk=key.pk).last_used_at
    assert used is not None and used != before


# -- one reading of the body ----------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_body_repeating_a_top_level_key_is_refused_in_the_callers_format(gateway, world, protocol):
    tag = f"repeat{protocol}{time.monotonic_ns()}"
    request = call(protocol, world.key, "sim-model", f"hi [sim tag={tag}]", stream=True)
    raw = json.dumps(request.body)
    # Billed as one thing, served as another, were either reading taken.
    repeated = "contents" if protocol == "gemini" else "model"
    again = json.dumps([]) if protocol == "gemini" else json.dumps("claude-sim")
    content = (raw[:-1] + f', "{repeated}": {again}}}').encode()
    response = send(gateway, request, content=content, **{"content-type": "application/json"})
    assert response.status_code == 400
    assert error_of(protocol, response) == MALFORMED[protocol]
    assert repeated in response.json()["error"]["message"]
    if protocol in ("chat", "responses"):
        assert response.json()["error"]["param"] == repeated
    assert records(world.simulator.url, tag) == []
    assert wait_for_log(response.headers["x-hopbase-request-id"]).status == "rejected"


def test_a_repeat_in_another_spelling_is_a_repeat_too(gateway, world):
    request = call("chat", world.key, "sim-model", "hi", stream=False)
    content = (json.dumps(request.body)[:-1] + ', "mod\\u0065l": "claude-sim"}').encode()
    response = send(gateway, request, content=content, **{"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "model"


# -- model names in upstream URLs ----------------------------------------------------

ODD_MODELS = ("odd?key&stolen", "odd#fragment", "..", "odd%2F..%2F..%2Fv1%2Fadmin")


@pytest.fixture(scope="module")
def odd_models(gateway, world, django_db_blocker):
    """Gemini models whose names carry URL syntax, served and priced."""
    from decimal import Decimal

    from billing.models import ModelPrice
    from channels_pool.models import Channel

    with django_db_blocker.unblock():
        for model in ODD_MODELS:
            ModelPrice.objects.get_or_create(
                model=model, defaults={"input_usd_per_mtok": Decimal("1"), "output_usd_per_mtok": Decimal("1")}
            )
            Channel.objects.get_or_create(
                name=f"gemini-odd-{ODD_MODELS.index(model)}",
                defaults={"protocol": "gemini", "base_url": world.simulator.url, "secret": "sk-upstream-secret",
                          "served_models": [model]},
            )
    # Until the gateway's channel list (HOPBASE_CONFIG_TTL) has them.
    deadline = time.monotonic() + 5
    while send(gateway, call("gemini", world.key, "..", "hi", stream=False)).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return ODD_MODELS


@pytest.mark.parametrize("model", ODD_MODELS)
def test_a_gemini_model_name_cannot_change_the_upstream_url(gateway, world, odd_models, model):
    tag = f"odd{ODD_MODELS.index(model)}x{time.monotonic_ns()}"
    response = send(gateway, call("gemini", world.key, quote(model, safe=""), f"hi [sim tag={tag}]"))
    assert response.status_code == 200
    (record,) = wait_for_records(world.simulator.url, tag)
    # What the simulator received, its escapes undone once: the model whole,
    # in the path, and nothing added to the query.
    assert record["path"] == f"/v1beta/models/{model}:streamGenerateContent"
    assert record["query"] == {"alt": "sse"}
    assert "key" not in record["query"]


def test_a_slash_in_a_gemini_model_name_never_reaches_a_channel(gateway, world):
    tag = f"slash{time.monotonic_ns()}"
    request = call("gemini", world.key, "a%2F..%2F..%2Fx", f"hi [sim tag={tag}]")
    response = send(gateway, request)
    assert response.status_code == 404
    assert error_of("gemini", response) == "NOT_FOUND"
    assert records(world.simulator.url, tag) == []


# -- ?key= only where Gemini takes it --------------------------------------------------


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_a_key_in_the_query_is_refused_outside_gemini(gateway, world, protocol):
    request = call(protocol, world.key, "sim-model", "hi", stream=False)
    headers = {k: v for k, v in request.headers.items() if k not in ("authorization", "x-api-key")}
    response = httpx.post(gateway.url + request.path, json=request.body, headers=headers, params={"key": world.key})
    status, error = INVALID_KEY[protocol]
    assert response.status_code == status
    assert error_of(protocol, response) == error


def test_a_key_in_the_query_still_works_for_gemini_model_lists(gateway, world):
    response = httpx.get(gateway.url + "/v1beta/models", params={"key": world.key})
    assert response.status_code == 200
    assert "models" in response.json()


# -- keys that expire --------------------------------------------------------------------


def test_a_key_is_refused_once_it_expires(gateway, world):
    from datetime import timedelta

    from django.utils import timezone

    from tenants.models import ApiKey, Tenant

    tenant = Tenant.objects.get(pk=world.tenant_id)
    _, expired = ApiKey.objects.issue(tenant, label="expired", expires_at=timezone.now() - timedelta(seconds=1))
    expires_at = timezone.now() + timedelta(seconds=1.5)
    _, expiring = ApiKey.objects.issue(tenant, label="expiring", expires_at=expires_at)
    for protocol in ("chat", "gemini"):
        response = send(gateway, call(protocol, expired, "sim-model", "hi", stream=False))
        assert (response.status_code, error_of(protocol, response)) == INVALID_KEY[protocol]
    request = call("chat", expiring, "sim-model", "hi", stream=False)
    assert send(gateway, request).status_code == 200
    time.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.05)
    # Refused from its expiry on, though the gateway has it cached.
    response = send(gateway, request)
    assert (response.status_code, error_of("chat", response)) == INVALID_KEY["chat"]


def test_headers_are_read_as_django_reads_them_repeats_joined_underscored_names_left_out():
    scope = {
        "type": "http", "method": "POST", "path": "/v1/messages", "query_string": b"",
        "headers": [(b"x-api-key", b"hb-key"), (b"anthropic-beta", b"a"), (b"anthropic-beta", b"b"),
                    (b"content-type", b"application/json"), (b"user-agent", b"Anthropic/Python \xe9"),
                    (b"x_api_key", b"smuggled")],
    }
    request = ASGIRequest(scope, io.BytesIO(b"{}"))
    headers = client_headers(request)
    assert headers == {"x-api-key": "hb-key", "anthropic-beta": "a,b", "content-type": "application/json",
                       "user-agent": "Anthropic/Python \xe9"}
    assert headers == {name.lower(): value for name, value in request.headers.items()}


def test_headers_of_a_request_without_a_scope_come_from_django():
    request = RequestFactory().post("/v1/messages", b"{}", content_type="application/json", headers={"X-Api-Key": "k"})
    assert client_headers(request) == {"x-api-key": "k", "content-type": "application/json", "content-length": "2",
                                      "cookie": ""}
