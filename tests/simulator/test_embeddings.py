"""The simulator's embeddings on the vendors' own routes, checked with their
SDKs: OpenAI's ``/v1/embeddings`` (floats, base64 the SDK decodes itself,
``dimensions``, token ids) and Gemini's ``:embedContent`` /
``:batchEmbedContents`` through google-genai. Vectors are deterministic per
text, so order and dimension can be checked; a batch larger than the
provider takes is refused as the provider would. The clouds' embeddings are
in test_simulator_clouds.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from simulator.embeddings import GEMINI_BATCH, MOST_INPUTS, vector
from tests.support.simulator_harness import Sim, serving


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with serving() as server:
        yield server


def test_openai_embeddings_in_order_as_floats_or_base64(sim: Sim) -> None:
    client = sim.openai()
    floats = client.embeddings.create(model="text-embedding-3-small", input=["b", "a", "b"], dimensions=8,
                                      encoding_format="float")
    packed = client.embeddings.create(model="text-embedding-3-small", input=["b", "a", "b"], dimensions=8)
    for reply in (floats, packed):
        assert [item.index for item in reply.data] == [0, 1, 2]
        for item, text in zip(reply.data, "bab", strict=True):
            assert item.embedding == pytest.approx(vector(text, 8), abs=1e-6)
        assert reply.usage.prompt_tokens == 3
    # The SDK asks for base64 unless told otherwise and decodes it itself.
    assert sim.records()[-1]["body"]["encoding_format"] == "base64"


def test_openai_embeddings_take_token_ids_and_refuse_an_empty_input(sim: Sim) -> None:
    reply = sim.openai().embeddings.create(model="text-embedding-3-small", input=[[1, 2, 3], [4]])
    assert reply.usage.prompt_tokens == 4 and len(reply.data) == 2
    refused = httpx.post(f"{sim.base}/v1/embeddings", json={"model": "m", "input": []},
                         headers={"authorization": "Bearer x"})
    assert refused.status_code == 400 and "nothing to embed" in refused.json()["error"]["message"]


def test_gemini_embeds_one_and_a_batch_without_usage(sim: Sim) -> None:
    client = sim.gemini()
    config = genai_types.EmbedContentConfig(output_dimensionality=8, task_type="RETRIEVAL_DOCUMENT")
    batch = client.models.embed_content(model="gemini-embedding-001", contents=["b", "a"], config=config)
    assert [e.values for e in batch.embeddings] == [vector("b", 8), vector("a", 8)]
    assert batch.metadata is None and batch.usage_metadata is None
    request = sim.records()[-1]
    assert request["path"] == "/v1beta/models/gemini-embedding-001:batchEmbedContents"
    assert request["body"]["requests"][0]["taskType"] == "RETRIEVAL_DOCUMENT"
    single = httpx.post(f"{sim.base}/v1beta/models/gemini-embedding-001:embedContent",
                        json={"content": {"parts": [{"text": "a"}]}, "outputDimensionality": 4},
                        headers={"x-goog-api-key": "x"})
    assert single.json() == {"embedding": {"values": vector("a", 4)}}


def test_a_batch_larger_than_the_provider_takes_is_refused(sim: Sim) -> None:
    with pytest.raises(genai_errors.ClientError) as refused:
        sim.gemini().models.embed_content(model="gemini-embedding-001",
                                          contents=[str(i) for i in range(MOST_INPUTS[GEMINI_BATCH] + 1)])
    assert refused.value.code == 400 and "at most 100 inputs" in refused.value.message


def test_directives_fail_an_embedding_request_as_any_other(sim: Sim) -> None:
    with pytest.raises(openai.RateLimitError):
        sim.openai().embeddings.create(model="m", input="hi [sim status=429]")
