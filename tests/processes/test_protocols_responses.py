"""The gateway for OpenAI Responses clients, through the openai SDK (P2, S3, B9).

Shared checks and what they prove: tests/support/protocol_checks.py.
"""

from __future__ import annotations

import pytest

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.protocol_checks import (
    check_credentials,
    check_log,
    dump,
    hooked_openai,
    new_tag,
    prompt,
    upstream_record,
    words,
)

pytestmark = pytest.mark.gateway
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)




# --------------------------------------------------------------------------- OpenAI Responses (P2, S3)


def test_it_answers_responses_create_like_the_provider(oai, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=5, id=tag, created=1700000000)

    raw = oai.responses.with_raw_response.create(model="sim-model", input=text)
    response = raw.parse()
    direct = direct_oai.responses.create(model="sim-model", input=text)

    assert response.model_dump() == direct.model_dump()
    assert response.id == f"resp_{tag}"
    assert response.status == "completed"
    assert len(response.output_text.split()) == 5
    assert (response.usage.input_tokens, response.usage.output_tokens) == (words(text), 5)

    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="responses", stream=False,
              input_tokens=words(text), output_tokens=5)
    record = upstream_record(sim_records, tag)
    assert record["path"] == "/v1/responses"
    assert record["body"]["stream"] is True
    check_credentials(record, "openai", world.key)


def test_it_serves_the_responses_stream_helper(gateway, direct_oai, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, id=tag, created=1700000000)
    client, ids = hooked_openai(gateway, world.key)

    with client.responses.stream(model="sim-model", input=text) as stream:
        events = list(stream)
        final = stream.get_final_response()
    with direct_oai.responses.stream(model="sim-model", input=text) as stream:
        direct = list(stream)

    assert [dump(e) for e in events] == [dump(e) for e in direct]
    assert [e.sequence_number for e in events] == list(range(len(events)))

    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 6
    assert final.status == "completed"
    assert final.output_text == "".join(deltas)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (words(text), 6)
    assert final.id == events[0].response.id

    check_log(world, ids.only, protocol="responses", stream=True, input_tokens=words(text), output_tokens=6)
    check_credentials(upstream_record(sim_records, tag), "openai", world.key)


def test_it_streams_a_responses_reasoning_summary(gateway, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3, thinking=3)
    client, ids = hooked_openai(gateway, world.key)

    with client.responses.stream(
        model="sim-model", input=text, reasoning={"effort": "low", "summary": "auto"}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()

    summary = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert len(summary) == 3
    types_in_order = [e.type for e in events]
    assert types_in_order.index("response.reasoning_summary_text.delta") < types_in_order.index(
        "response.output_text.delta"
    )
    reasoning = [item for item in final.output if item.type == "reasoning"]
    assert reasoning[0].summary[0].text == "".join(summary)
    assert final.usage.output_tokens == 6
    assert final.usage.output_tokens_details.reasoning_tokens == 3

    check_log(world, ids.only, protocol="responses", stream=True, input_tokens=words(text), output_tokens=6,
              thinking=3)
    record = upstream_record(sim_records, tag)
    assert record["body"]["reasoning"] == {"effort": "low", "summary": "auto"}
    check_credentials(record, "openai", world.key)


# --------------------------------------------------------------------------- cached usage (B9)


def test_it_bills_responses_input_without_cached_tokens(oai, world, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3, cached=2)

    raw = oai.responses.with_raw_response.create(model="sim-model", input=text)
    response = raw.parse()

    assert response.usage.input_tokens_details.cached_tokens == 2
    check_log(world, raw.headers.get("x-hopbase-request-id"), protocol="responses", stream=False,
              input_tokens=words(text) - 2, output_tokens=3, cache_read=2)
