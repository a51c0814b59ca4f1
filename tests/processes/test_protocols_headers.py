"""Headers, through each SDK: only the channel's secret and no compression upstream,
the provider's request id back to the client (0.3).

Shared checks and what they prove: tests/support/protocol_checks.py.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.protocol_checks import (
    CHANNEL_PROTOCOL,
    anthropic_client,
    check_credentials,
    genai_client,
    new_tag,
    openai_client,
    prompt,
    upstream_record,
)

pytestmark = pytest.mark.gateway
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)




# --------------------------------------------------------------------------- hygiene (0.3)


def call_each_protocol(gateway, world, protocol: str, text: str) -> None:
    # The customer's own OpenAI org and project mean nothing to HopBase's account.
    customer = {"organization": "org-customer", "project": "proj_customer"}
    if protocol == "chat":
        list(openai_client(gateway, world.key, **customer).chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": text}], stream=True))
    elif protocol == "responses":
        openai_client(gateway, world.key, **customer).responses.create(model="sim-model", input=text)
    elif protocol == "messages":
        with anthropic_client(gateway, world.key).messages.stream(
            model="claude-sim", max_tokens=64, messages=[{"role": "user", "content": text}]
        ) as stream:
            stream.get_final_message()
    else:
        client = genai_client(gateway.url, world.key)
        client.models.generate_content(model="sim-model", contents=text)


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "gemini"])
def test_it_sends_upstream_only_the_channel_secret(gateway, world, sim_records, protocol):
    tag = new_tag()

    call_each_protocol(gateway, world, protocol, prompt(tag, tokens=2))

    record = upstream_record(sim_records, tag)
    check_credentials(record, CHANNEL_PROTOCOL[protocol], world.key)
    assert "openai-organization" not in record["headers"]
    assert "openai-project" not in record["headers"]


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "gemini"])
def test_it_does_not_ask_the_channel_for_compression(gateway, world, sim_records, protocol):
    tag = new_tag()

    call_each_protocol(gateway, world, protocol, prompt(tag, tokens=2))

    # The relay reads the channel's raw bytes (no decoding) to split events and
    # inject keep-alives between them, so it must not ask for compression (0.3, 0.1.4).
    accept_encoding = upstream_record(sim_records, tag)["headers"].get("accept-encoding", "identity")
    assert {coding.strip() for coding in accept_encoding.split(",")} <= {"identity", ""}, accept_encoding


# --------------------------------------------------------------------------- headers back to the client (0.3)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_passes_on_the_provider_request_id(oai, claude, stream):
    """The provider's x-request-id (openai) and request-id
    (anthropic) reach the client, where the SDKs expose them as ``request_id``."""
    tag = new_tag()
    ids = re.compile(r"req_[0-9a-f]{24}")

    raw = oai.chat.completions.with_raw_response.create(
        model="sim-model", messages=[{"role": "user", "content": prompt(tag, tokens=2)}], stream=stream
    )
    completion = raw.parse()
    if stream:
        list(completion)
    else:
        assert completion._request_id == raw.headers.get("x-request-id")
    assert ids.fullmatch(raw.headers.get("x-request-id") or ""), dict(raw.headers)
    assert raw.headers["x-request-id"] != raw.headers["x-hopbase-request-id"]

    kwargs = {"model": "claude-sim", "max_tokens": 64, "messages": [{"role": "user", "content": prompt(tag, tokens=2)}]}
    if stream:
        with claude.messages.stream(**kwargs) as manager:
            manager.get_final_message()
            request_id, ours = manager.request_id, manager.response.headers.get("x-hopbase-request-id")
    else:
        raw = claude.messages.with_raw_response.create(**kwargs)
        request_id, ours = raw.parse()._request_id, raw.headers.get("x-hopbase-request-id")
    assert ids.fullmatch(request_id or ""), request_id
    assert request_id != ours
