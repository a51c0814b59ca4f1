"""Provider surcharges through a running gateway (rule B10): a request that
switches on something a channel bills beyond its tokens is refused 400 in
its caller's format, naming the field, before any channel is called, unless
the operator has priced it on the model; a priced one is charged at its
multiplier and named in the log row and the export. A web search the request
only offers (Codex offers one every time) is taken out instead, unpriced,
and the model answers unsearched."""

from __future__ import annotations

import io
import json
import time
import uuid
from decimal import Decimal

import httpx
import pytest
from django.core.management import call_command

from billing.models import ModelPrice
from billing.settlement import settle_many
from channels_pool.models import Channel
from tests.support.protocol_checks import new_tag
from tests.support.wire import call, channel_protocol, records, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

SURCHARGES = [  # client API, what the request adds, the field the refusal names
    ("chat", {"service_tier": "priority"}, {}, "service_tier"),
    ("responses", {"service_tier": "flex"}, {}, "service_tier"),
    ("responses", {"background": True}, {}, "background"),
    ("responses", {"tools": [{"type": "web_search_preview"}], "tool_choice": {"type": "web_search_preview"}}, {},
     "tools[0].type"),
    ("responses", {"tools": [{"type": "function", "name": "f", "parameters": {}},
                             {"type": "code_interpreter", "container": {"type": "auto"}}]}, {}, "tools[1].type"),
    ("messages", {"tools": [{"type": "web_search_20250305", "name": "web_search"}],
                  "tool_choice": {"type": "tool", "name": "web_search"}}, {}, "tools[0].type"),
    ("messages", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, {}, "tools[0].type"),
    ("messages", {}, {"anthropic-beta": "context-1m-2025-08-07"}, "anthropic-beta"),
    # The header goes on to any Anthropic channel, whatever API the client called.
    ("chat", {}, {"anthropic-beta": "interleaved-thinking-2025-05-14,context-1m-2025-08-07"}, "anthropic-beta"),
    ("messages", {"system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral",
                                                                                   "ttl": "1h"}}]},
     {}, "cache_control.ttl"),
    ("gemini", {"tools": [{"url_context": {}}]}, {}, "tools[0].url_context"),
]


def error_message(api: str, body: dict) -> str:
    return body["error"]["message"]


@pytest.mark.parametrize(("api", "extra", "headers", "field"), SURCHARGES,
                         ids=[f"{api}-{field}" for api, _, _, field in SURCHARGES])
def test_an_unpriced_surcharge_is_refused_naming_its_field_before_any_channel(gateway, world, api, extra,
                                                                              headers, field):
    tag = new_tag()
    request = call(api, world.key, "sim-model", f"hello [sim tag={tag}]", stream=False, **extra)
    answer = httpx.post(gateway.url + request.path, json=request.body, headers={**request.headers, **headers},
                        timeout=10)
    assert answer.status_code == 400, answer.text
    assert f"`{field}`" in error_message(api, answer.json())
    row = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (row.status, row.attempts, row.channel_id, row.charge_usd or 0) == ("rejected", 0, None, 0)
    assert records(world.simulator.url, tag) == []  # no channel was called


OFFERED_SEARCH = [  # client API, a web search it offers, what the channel must not see
    ("chat", {"web_search_options": {}}, b"web_search_options"),
    ("responses", {"tools": [{"type": "web_search"}, {"type": "function", "name": "f", "parameters": {}}]},
     b"web_search"),
    ("messages", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, b"web_search"),
    ("gemini", {"tools": [{"googleSearch": {}}, {"functionDeclarations": [{"name": "f"}]}]}, b"googleSearch"),
]


@pytest.mark.parametrize(("api", "extra", "unseen"), OFFERED_SEARCH, ids=[api for api, _, _ in OFFERED_SEARCH])
def test_an_unpriced_web_search_only_offered_is_taken_out_and_answered_unsearched(gateway, world, api, extra,
                                                                                  unseen):
    tag = new_tag()
    request = call(api, world.key, "sim-model", f"hello [sim tag={tag}]", stream=False, **extra)
    answer = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=10)
    assert answer.status_code == 200, answer.text
    (record,) = records(world.simulator.url, tag)
    sent = json.dumps(record["body"]).encode()
    assert unseen not in sent
    if api in ("responses", "gemini"):  # the client's other tools still go
        assert b'"f"' in sent
    row = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (row.status, row.extras) == ("completed", "")


@pytest.fixture
def tiered_model(world):
    model = f"tiered-{uuid.uuid4().hex[:8]}"
    ModelPrice.objects.create(model=model, input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("15"),
                              extras={"service_tier:priority": "2", "tool:google_search": "1.5"})
    for api in ("chat", "gemini"):
        Channel.objects.create(name=f"{model}-{api}", protocol=channel_protocol(api),
                               base_url=world.simulator.url + ("/v1" if api == "chat" else ""),
                               secret="sk-upstream", served_models=[model])
    return model


def served_in_time(gateway, request, within: float = 5.0) -> httpx.Response:
    """The first 200 (a new price and channel are read within the config TTL)."""
    deadline = time.monotonic() + within
    while True:
        answer = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=10)
        if answer.status_code == 200 or time.monotonic() > deadline:
            return answer


@pytest.mark.parametrize(("api", "extra", "feature", "multiplier"), [
    ("chat", {"service_tier": "priority"}, "service_tier:priority", Decimal("2")),
    ("gemini", {"tools": [{"googleSearch": {}}]}, "tool:google_search", Decimal("1.5")),  # priced: it goes
])
def test_a_priced_surcharge_is_served_and_charged_at_its_multiplier(gateway, world, tiered_model, api, extra,
                                                                     feature, multiplier):
    request = call(api, world.key, tiered_model, "hello [sim tokens=7]", stream=False, **extra)
    answer = served_in_time(gateway, request)
    assert answer.status_code == 200, answer.text
    row = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert row.extras == f"{feature} x{multiplier}"
    assert row.price_multiplier == multiplier * row.tenant.price_multiplier
    settle_many([row.pk])
    row.refresh_from_db()
    tokens_usd = (row.input_tokens * Decimal(3) + row.output_tokens * Decimal(15)) / Decimal(1_000_000)
    assert row.charge_usd == (tokens_usd * row.price_multiplier).quantize(Decimal("1e-10"))
    out = io.StringIO()
    call_command("exportbilling", "--format", "jsonl", stdout=out)
    exported = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["extras"] for line in exported if line["request_id"] == row.request_id] == [row.extras]


def test_a_cache_cannot_hold_a_hosted_tool_that_every_later_request_would_use_unpriced(gateway, world):
    tag = new_tag()
    made = httpx.post(f"{gateway.url}/v1beta/cachedContents", headers={"x-goog-api-key": world.key}, timeout=10,
                      json={"model": "models/sim-model", "tools": [{"googleSearch": {}}],
                            "contents": [{"role": "user", "parts": [{"text": f"doc [sim tag={tag}]"}]}]})
    assert made.status_code == 400 and "`tools[0].googleSearch`" in made.json()["error"]["message"]
    assert records(world.simulator.url, tag) == []
