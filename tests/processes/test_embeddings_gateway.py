"""Embeddings through a running gateway (rules V1–V3), the official SDKs as
clients and the simulator as every provider: OpenAI's ``embeddings.create``
(floats, base64 the SDK decodes, ``dimensions``, token ids) and google-genai's
``models.embed_content`` (one and a batch), on every channel kind, passed
through or translated; batches split where a channel takes fewer; failover;
one billed log row each; bad input refused before any channel is called.

The simulator's vectors are derived from each text
(``simulator.embeddings.vector``), so order and dimension are
checked against it; it counts a word a token, and Gemini reports none.
No public model here has "gemini" in its name: google-genai sends a list of
texts to such a model as one multimodal content (one embedding).
"""

from __future__ import annotations

import base64
import json
import struct
import time
from decimal import Decimal

import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from billing.models import ModelPrice, RequestLog
from billing.settlement import settle
from channels_pool.models import Channel
from core.usage import estimate_tokens
from simulator import SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY, vertex_service_account
from simulator.embeddings import DEFAULT_DIMENSIONS, vector
from tests.support.protocol_checks import genai_client, new_tag, openai_client, words
from tests.support.wire import records, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

PRICE = Decimal("0.02")  # USD per million input tokens
BEDROCK = {"region": "us-east-1"}
VERTEX = {"project": "hopbase-sim", "location": "us-central1"}
# public model -> [(kind, upstream name, key directives, priority)]
MODELS = {
    "emb-openai": [("openai", "text-embedding-3-small", "", 0)],
    "emb-azure": [("azure", "embed-deployment", "", 0)],
    "emb-studio": [("gemini", "gemini-embedding-001", "", 0)],
    "emb-vertex": [("vertex", "text-embedding-005", "", 0)],
    "emb-vertex-single": [("vertex", "gemini-embedding-001", "", 0)],
    "emb-titan": [("bedrock", "amazon.titan-embed-text-v2:0", "", 0)],
    "emb-cohere": [("bedrock", "cohere.embed-english-v3", "", 0)],
    "emb-failover": [("openai", "text-embedding-3-small", "status=500", 10),
                     ("gemini", "gemini-embedding-001", "", 0)],
    "emb-text-only": [("gemini", "gemini-embedding-001", "", 0), ("bedrock", "cohere.embed-english-v3", "", 0)],
}


def secret(kind: str, directives: str, simulator_url: str) -> str:
    if kind == "bedrock":
        return f"{SIM_AWS_ACCESS_KEY_ID}:{SIM_AWS_SECRET_ACCESS_KEY}" + (f":sim:{directives}" if directives else "")
    if kind == "vertex":
        return json.dumps(vertex_service_account(simulator_url, directives))
    return f"sim:{directives}" if directives else "sk-embeddings"


@pytest.fixture(scope="module")
def embedding_channels(world, gateway, simulator, django_db_blocker):
    with django_db_blocker.unblock():
        for model, routes in MODELS.items():
            ModelPrice.objects.update_or_create(model=model, defaults={
                "input_usd_per_mtok": PRICE, "output_usd_per_mtok": Decimal("1")})
            for index, (kind, upstream, directives, priority) in enumerate(routes):
                Channel.objects.update_or_create(name=f"{model}-{index}", defaults={
                    "protocol": kind, "served_models": [f"{model}={upstream}"], "priority": priority,
                    "base_url": simulator.url + ("/v1" if kind == "openai" else ""),
                    "secret": secret(kind, directives, simulator.url), **(BEDROCK if kind == "bedrock" else {}),
                    **(VERTEX if kind == "vertex" else {})})
    client = openai_client(gateway, world.key)
    deadline = time.monotonic() + 10  # the gateway reads channels and prices within its config TTL
    for model in MODELS:
        while True:
            try:
                client.embeddings.create(model=model, input="warm up")
                break
            except openai.NotFoundError:
                assert time.monotonic() < deadline, model
                time.sleep(0.1)
    return MODELS


@pytest.fixture
def oai(gateway, world, embedding_channels) -> openai.OpenAI:
    return openai_client(gateway, world.key)


@pytest.fixture
def gem(gateway, world, embedding_channels):
    return genai_client(gateway.url, world.key)


def log_of(response) -> RequestLog:
    row = wait_for_log(response.headers["x-hopbase-request-id"])
    assert row is not None
    return row


@pytest.mark.parametrize("model", ["emb-openai", "emb-azure", "emb-studio", "emb-vertex", "emb-titan", "emb-cohere"])
@pytest.mark.parametrize("encoding", ["float", openai.NOT_GIVEN])
def test_the_openai_sdk_embeds_on_every_kind_in_order(oai, model, encoding):
    # Not given, the SDK asks for base64 and decodes it itself.
    texts = [f"alpha {new_tag()}", "beta gamma", "alpha"]
    raw = oai.embeddings.with_raw_response.create(model=model, input=texts, encoding_format=encoding)
    reply = raw.parse()
    assert [item.index for item in reply.data] == [0, 1, 2]
    for item, text in zip(reply.data, texts, strict=True):
        assert item.embedding == pytest.approx(vector(text, DEFAULT_DIMENSIONS), abs=1e-6)
    row = log_of(raw)
    estimated = model == "emb-studio"  # Gemini reports no usage: estimated, and said so
    tokens = estimate_tokens(sum(map(len, texts))) if estimated else words(*texts)
    assert reply.usage.prompt_tokens == row.input_tokens == tokens
    assert (row.status, row.protocol, row.model, row.output_tokens, row.usage_estimated) == (
        "completed", "embeddings", model, 0, estimated)
    settle(row.pk)  # what Celery does with it; idempotent
    row.refresh_from_db()
    assert row.charge_usd == PRICE * tokens / 1_000_000  # the input price alone


@pytest.mark.parametrize("model", ["emb-openai", "emb-vertex"])
def test_base64_asked_for_is_little_endian_float32(oai, model):
    reply = oai.embeddings.create(model=model, input="packed", encoding_format="base64")
    packed = base64.b64decode(reply.data[0].embedding)
    values = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert values == pytest.approx(vector("packed", DEFAULT_DIMENSIONS), abs=1e-6)


def test_base64_from_an_openai_channel_passes_through_untouched(oai, simulator):
    tag = new_tag()
    raw = oai.embeddings.with_raw_response.create(model="emb-openai", input=f"hello [sim tag={tag}]")
    assert raw.parse().data[0].embedding == pytest.approx(vector(f"hello [sim tag={tag}]", DEFAULT_DIMENSIONS),
                                                         abs=1e-6)
    upstream = records(simulator.url, tag)
    assert len(upstream) == 1 and upstream[0]["body"]["encoding_format"] == "base64"
    assert upstream[0]["body"]["model"] == "text-embedding-3-small"
    # Byte for byte as the channel sent it: never decoded and encoded again.
    assert raw.http_response.content == base64.b64decode(upstream[0]["sent_b64"])


@pytest.mark.parametrize("model", ["emb-openai", "emb-studio", "emb-vertex", "emb-titan"])
def test_dimensions_are_honoured_where_the_channel_can(oai, model):
    dimensions = 256 if model == "emb-titan" else 8
    reply = oai.embeddings.create(model=model, input="one two", dimensions=dimensions, encoding_format="float")
    assert reply.data[0].embedding == pytest.approx(vector("one two", dimensions), abs=1e-6)


def test_dimensions_no_candidate_can_serve_are_refused_naming_the_field(oai):
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model="emb-cohere", input="one", dimensions=8)
    assert refused.value.body["param"] == "dimensions"
    assert log_of(refused.value.response).status == "rejected"


def test_token_ids_reach_a_channel_that_takes_them_and_are_refused_where_none_does(oai):
    reply = oai.embeddings.create(model="emb-openai", input=[[1, 2, 3], [4, 5]], encoding_format="float")
    assert [item.embedding for item in reply.data] == [
        pytest.approx(vector("1 2 3", DEFAULT_DIMENSIONS), abs=1e-6),
        pytest.approx(vector("4 5", DEFAULT_DIMENSIONS), abs=1e-6)]
    assert reply.usage.prompt_tokens == 5
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model="emb-text-only", input=[1, 2, 3])
    assert refused.value.body["param"] == "input"


def test_google_genai_embeds_one_and_a_batch_on_gemini_and_openai_channels(gem):
    for model in ("emb-studio", "emb-openai", "emb-vertex"):
        config = genai_types.EmbedContentConfig(output_dimensionality=8, task_type="RETRIEVAL_DOCUMENT")
        one = gem.models.embed_content(model=model, contents="solo text", config=config)
        assert one.embeddings[0].values == pytest.approx(vector("solo text", 8), abs=1e-6)
        batch = gem.models.embed_content(model=model, contents=["b", "a", "b"], config=config)
        assert [e.values for e in batch.embeddings] == [pytest.approx(vector(t, 8), abs=1e-6) for t in "bab"]


def test_a_batch_larger_than_the_channel_takes_is_split_and_joined_in_order(gem, simulator):
    tag = new_tag()
    texts = [f"text {i} [sim tag={tag}]" for i in range(150)]  # Gemini takes 100 a request
    reply = gem.models.embed_content(model="emb-studio", contents=texts)
    assert [e.values for e in reply.embeddings] == [pytest.approx(vector(t, DEFAULT_DIMENSIONS), abs=1e-6)
                                                   for t in texts]
    sizes = sorted(len(r["body"]["requests"]) for r in records(simulator.url, tag))
    assert sizes == [50, 100]


def test_vertex_gemini_embedding_models_are_asked_one_input_at_a_time(oai, simulator):
    tag = new_tag()
    texts = [f"{word} [sim tag={tag}]" for word in ("one", "two", "three")]
    raw = oai.embeddings.with_raw_response.create(model="emb-vertex-single", input=texts, encoding_format="float")
    assert [d.embedding for d in raw.parse().data] == [pytest.approx(vector(t, DEFAULT_DIMENSIONS), abs=1e-6)
                                                       for t in texts]
    assert sorted(r["body"]["instances"][0]["content"] for r in records(simulator.url, tag)) == sorted(texts)
    assert log_of(raw).input_tokens == words(*texts)


def test_a_failing_channel_fails_over_before_the_answer(oai):
    raw = oai.embeddings.with_raw_response.create(model="emb-failover", input="fail over", encoding_format="float")
    assert raw.parse().data[0].embedding == pytest.approx(vector("fail over", DEFAULT_DIMENSIONS), abs=1e-6)
    row = log_of(raw)
    assert (row.status, row.attempts, row.channel.protocol) == ("completed", 2, "gemini")


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["ok", 3]}, "input"),
    ({"input": [[1, 2.5]]}, "input"),
    ({"input": [[1, True]]}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
])
def test_bad_input_is_refused_before_any_channel_is_called(gateway, world, embedding_channels, body, param):
    answer = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": "emb-openai", **body},
                        headers={"authorization": f"Bearer {world.key}"}, timeout=10)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    row = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (row.status, row.protocol, row.input_tokens) == ("rejected", "embeddings", 0)


def test_an_unknown_model_is_a_404_in_each_format(oai, gem):
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-embedder", input="x")
    with pytest.raises(genai_errors.ClientError) as refused:
        gem.models.embed_content(model="no-such-embedder", contents="x")
    assert refused.value.code == 404


def test_gemini_bad_input_is_refused_in_geminis_format(gateway, world, embedding_channels):
    answer = httpx.post(f"{gateway.url}/v1beta/models/emb-studio:batchEmbedContents", json={"requests": []},
                        headers={"x-goog-api-key": world.key}, timeout=10)
    assert answer.status_code == 400 and answer.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_gemini_logs_its_embeddings_as_gemini_with_estimated_usage(gateway, world, embedding_channels):
    answer = httpx.post(f"{gateway.url}/v1beta/models/emb-vertex:embedContent",
                        json={"content": {"parts": [{"text": "four words right here"}]}},
                        headers={"x-goog-api-key": world.key}, timeout=10)
    assert answer.status_code == 200 and len(answer.json()["embedding"]["values"]) == DEFAULT_DIMENSIONS
    row = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (row.protocol, row.input_tokens, row.output_tokens, row.usage_estimated) == ("gemini", 4, 0, False)


def test_models_served_for_embeddings_are_listed_with_gemini_embed_methods(gem, oai):
    listed = {m.name: m.supported_actions for m in gem.models.list()}
    assert listed["models/emb-studio"] == ["embedContent", "batchEmbedContents"]
    assert listed["models/sim-model"] == ["generateContent", "streamGenerateContent"]
    assert {"emb-openai", "emb-cohere"} <= {m.id for m in oai.models.list()}
