"""The gateway for Gemini clients, through the google-genai SDK (P4, B9).

Shared checks and what they prove: tests/support/protocol_checks.py.
"""

from __future__ import annotations

import httpx
import pytest
from google.genai import types

from tests.conftest import each_server
from tests.support.processes import SERVERS
from tests.support.protocol_checks import (
    check_credentials,
    check_log,
    check_stream_headers,
    genai_client,
    new_tag,
    prompt,
    upstream_record,
    words,
)

pytestmark = pytest.mark.gateway
# Every test here under both servers: plain daphne and manage.py serve (uvicorn).
gateway = pytest.fixture(params=SERVERS)(each_server)




# --------------------------------------------------------------------------- Gemini (P4)


def without_http(response: types.GenerateContentResponse) -> dict:
    return response.model_dump(exclude={"sdk_http_response"})


def request_id_of(response: types.GenerateContentResponse) -> str | None:
    headers = response.sdk_http_response.headers if response.sdk_http_response else {}
    return {k.lower(): v for k, v in (headers or {}).items()}.get("x-hopbase-request-id")


def test_it_answers_gemini_generate_content_like_the_provider(gem, direct_gem, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=5, id=tag)

    response = gem.models.generate_content(model="sim-model", contents=text)
    direct = direct_gem.models.generate_content(model="sim-model", contents=text)

    assert without_http(response) == without_http(direct)
    assert len(response.text.split()) == 5
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    usage = response.usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count) == (
        words(text), 5, words(text) + 5
    )
    assert usage.model_dump() == direct.usage_metadata.model_dump()

    check_log(world, request_id_of(response), protocol="gemini", stream=False, input_tokens=words(text),
              output_tokens=5)
    record = upstream_record(sim_records, tag)
    assert record["path"] == "/v1beta/models/sim-model:streamGenerateContent"
    assert record["query"] == {"alt": "sse"}
    check_credentials(record, "gemini", world.key)


def test_it_streams_gemini_generate_content(gem, direct_gem, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=6, id=tag)

    chunks = list(gem.models.generate_content_stream(model="sim-model", contents=text))
    direct = list(direct_gem.models.generate_content_stream(model="sim-model", contents=text))

    assert [without_http(c) for c in chunks] == [without_http(c) for c in direct]
    check_stream_headers(chunks[0].sdk_http_response.headers)
    assert len("".join(c.text or "" for c in chunks).split()) == 6
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    usage = chunks[-1].usage_metadata
    assert (usage.prompt_token_count, usage.candidates_token_count) == (words(text), 6)

    check_log(world, request_id_of(chunks[0]), protocol="gemini", stream=True, input_tokens=words(text),
              output_tokens=6)
    check_credentials(upstream_record(sim_records, tag), "gemini", world.key)


@pytest.mark.parametrize("api_version", ["v1", "v1alpha"])
def test_it_routes_every_gemini_api_version(gateway, world, sim_records, committed_db, api_version):
    tag = new_tag()
    text = prompt(tag, tokens=3)
    client = genai_client(gateway.url, world.key, api_version=api_version)

    response = client.models.generate_content(model="sim-model", contents=text)

    assert len(response.text.split()) == 3
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    record = upstream_record(sim_records, tag)
    assert record["path"] == f"/{api_version}/models/sim-model:streamGenerateContent"
    check_log(world, request_id_of(response), protocol="gemini", stream=False, input_tokens=words(text),
              output_tokens=3)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_returns_gemini_thoughts(gem, direct_gem, world, sim_records, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=4, thinking=3, id=tag)
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))

    if stream:
        chunks = list(gem.models.generate_content_stream(model="sim-model", contents=text, config=config))
        direct = direct_gem.models.generate_content_stream(model="sim-model", contents=text, config=config)
        assert [without_http(c) for c in chunks] == [without_http(c) for c in direct]
        check_stream_headers(chunks[0].sdk_http_response.headers)
        parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts or ()]
        thoughts = [p.text for p in parts if p.thought]
        answer = [p.text for p in parts if not p.thought and p.text]
        assert len(thoughts) == 3
        last, first = chunks[-1], chunks[0]
        assert first.candidates[0].content.parts[0].thought is True
    else:
        last = first = gem.models.generate_content(model="sim-model", contents=text, config=config)
        direct = direct_gem.models.generate_content(model="sim-model", contents=text, config=config)
        assert without_http(last) == without_http(direct)
        parts = last.candidates[0].content.parts
        assert [bool(p.thought) for p in parts] == [True, False]
        thoughts, answer = [parts[0].text], [parts[1].text]

    assert len("".join(thoughts).split()) == 3
    assert len("".join(answer).split()) == 4
    assert last.usage_metadata.thoughts_token_count == 3
    assert last.usage_metadata.candidates_token_count == 4
    # Billed output is candidates + thoughts.
    check_log(world, request_id_of(first), protocol="gemini", stream=stream, input_tokens=words(text),
              output_tokens=7, thinking=3)
    body = upstream_record(sim_records, tag)["body"]
    assert body["generationConfig"]["thinkingConfig"] in ({"includeThoughts": True}, {"include_thoughts": True})


def test_it_accepts_a_gemini_query_key_and_keeps_it_off_the_upstream_url(gateway, world, sim_records, committed_db):
    tag = new_tag()
    text = prompt(tag, tokens=3)

    response = httpx.post(
        f"{gateway.url}/v1beta/models/sim-model:generateContent",
        params={"key": world.key},
        json={"contents": [{"role": "user", "parts": [{"text": text}]}]},
        timeout=20,
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["candidates"][0]["finishReason"] == "STOP"
    assert len(body["candidates"][0]["content"]["parts"][0]["text"].split()) == 3
    record = upstream_record(sim_records, tag)
    assert record["query"] == {"alt": "sse"}
    check_credentials(record, "gemini", world.key)
    check_log(world, response.headers.get("x-hopbase-request-id"), protocol="gemini", stream=False,
              input_tokens=words(text), output_tokens=3)


# --------------------------------------------------------------------------- cached usage (B9)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "create"])
def test_it_bills_gemini_input_without_cached_tokens(gem, world, committed_db, stream):
    tag = new_tag()
    text = prompt(tag, tokens=3, cached=2)

    if stream:
        chunks = list(gem.models.generate_content_stream(model="sim-model", contents=text))
        first, usage = chunks[0], chunks[-1].usage_metadata
    else:
        first = gem.models.generate_content(model="sim-model", contents=text)
        usage = first.usage_metadata

    assert (usage.prompt_token_count, usage.cached_content_token_count) == (words(text), 2)
    check_log(world, request_id_of(first), protocol="gemini", stream=stream, input_tokens=words(text) - 2,
              output_tokens=3, cache_read=2)


@pytest.mark.parametrize(
    ("model", "path"),
    [
        ("gemini-2.0-flash-001", "/v1beta/models/gemini-2.0-flash-001:streamGenerateContent"),
        ("a/../../admin", "/v1beta/models/a%2F..%2F..%2Fadmin:streamGenerateContent"),
        ("a?key=x#frag", "/v1beta/models/a%3Fkey%3Dx%23frag:streamGenerateContent"),
        ("..", "/v1beta/models/..:streamGenerateContent"),
    ],
)
def test_a_model_name_is_escaped_whole_into_the_upstream_url(model, path):
    from channels_pool.selection import ChannelInfo
    from providers.apis import GEMINI

    channel = ChannelInfo(id=1, name="g", protocol="gemini", base_url="https://gemini.test/prefix", secret="k",
                          models={}, priority=0, weight=1, max_concurrency=None)
    route = {"version": "v1beta", "model": model, "action": "streamGenerateContent"}
    facts = GEMINI.parse({"contents": []}, b'{"contents": []}', route)
    url = httpx.URL(channel.kind.request(channel, GEMINI.upstream_call(facts, {})).url)
    assert (url.host, url.raw_path.decode()) == ("gemini.test", "/prefix" + path + "?alt=sse")
    assert url.fragment == "" and url.params == httpx.QueryParams({"alt": "sse"})
