"""Embeddings in translation (rules V1–V3, T3): client requests decoded,
each channel grammar's bodies encoded and split where the channel takes
fewer inputs, answers read back and written in the client's shape; and what
the client APIs refuse themselves.

Mirrors providers/embedding_legs.py, providers/openai/embeddings.py
and gemini_embeddings.py; the same through a gateway is test_embeddings_gateway.py.
"""

from __future__ import annotations

import base64
import json
import struct

import pytest

from core.errors import GatewayError
from core.sse import Event
from core.usage import estimate_tokens
from core.vocabulary import EmbeddingGrammar
from providers.apis import EMBEDDINGS, GEMINI_EMBEDDINGS
from providers.aws.bedrock import INPUT_TOKENS_FIELD
from providers.base import Mark, RequestFacts, dumps
from providers.embedding_legs import SIDES, EmbeddingRequest, EmbeddingWatcher, decode_gemini, decode_openai
from providers.neutral import CannotServe
from providers.openai.embeddings import usage_tokens

VECTOR = [0.25, -0.5, 0.125]


def openai_facts(**body) -> RequestFacts:
    body = {"model": "public", **body}
    return EMBEDDINGS.parse(body, dumps(body), {})


def gemini_facts(body: dict, action: str = "batchEmbedContents") -> RequestFacts:
    route = {"version": "v1beta", "model": "public", "action": action}
    return GEMINI_EMBEDDINGS.parse(body, dumps(body), route)


def gemini_request(text: str, **fields) -> dict:
    return {"model": "models/public", "content": {"parts": [{"text": text}]}, **fields}


def encode(grammar: EmbeddingGrammar, request: EmbeddingRequest, model: str = "m") -> list[dict]:
    return SIDES[grammar].encode(request, model)


# -- what the client APIs refuse themselves -------------------------------------


@pytest.mark.parametrize(("body", "param"), [
    ({}, "input"), ({"input": []}, "input"), ({"input": ""}, "input"), ({"input": ["a", ""]}, "input"),
    ({"input": ["a", 1]}, "input"), ({"input": [[1], "a"]}, "input"), ({"input": [[1, 2.0]]}, "input"),
    ({"input": [[-1]]}, "input"), ({"input": [[]]}, "input"), ({"input": ["a"] * 2049}, "input"),
    ({"input": "a", "dimensions": 0}, "dimensions"), ({"input": "a", "dimensions": True}, "dimensions"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"), ({"input": "a", "user": 3}, "user"),
])
def test_openai_refuses_bad_input_naming_the_field(body, param):
    with pytest.raises(GatewayError) as refused:
        openai_facts(**body)
    assert refused.value.param == param


def test_openai_counts_four_characters_a_token_id_so_estimates_count_tokens():
    assert openai_facts(input=["abcd", "ef"]).prompt_chars == 6
    assert estimate_tokens(openai_facts(input=[[1, 2, 3], [4]]).prompt_chars) == 4
    assert len(openai_facts(input=["x"] * 2048).body["input"]) == 2048


@pytest.mark.parametrize(("body", "action"), [
    ({"requests": []}, "batchEmbedContents"),
    ({"requests": [gemini_request("a")] * 2049}, "batchEmbedContents"),
    ({"requests": [{"content": {"parts": [{"inlineData": {"data": "AA=="}}]}}]}, "batchEmbedContents"),
    ({"content": {"parts": []}}, "embedContent"),
    ({"content": {"parts": [{"text": ""}]}}, "embedContent"),
    ({"content": {"parts": [{"text": "a"}]}, "outputDimensionality": -3}, "embedContent"),
])
def test_gemini_refuses_bad_input(body, action):
    with pytest.raises(GatewayError):
        gemini_facts(body, action)


# -- decode ------------------------------------------------------------------------


def test_openai_inputs_of_every_form_decode_to_texts_or_token_ids():
    assert decode_openai(openai_facts(input="one")).texts == ["one"]
    assert decode_openai(openai_facts(input=["a", "b"], dimensions=8)) == EmbeddingRequest(texts=["a", "b"],
                                                                                          dimensions=8)
    assert decode_openai(openai_facts(input=[1, 2])).token_ids == [[1, 2]]
    assert decode_openai(openai_facts(input=[[1], [2, 3]])).count == 2


def test_gemini_requests_decode_with_task_type_titles_and_dimensions():
    facts = gemini_facts({"requests": [
        gemini_request("doc one", taskType="RETRIEVAL_DOCUMENT", title="One", outputDimensionality=8),
        {"content": {"parts": [{"text": "two"}, {"text": "parts"}]}}]})
    assert decode_gemini(facts) == EmbeddingRequest(texts=["doc one", "two parts"], dimensions=8,
                                                    task_type="RETRIEVAL_DOCUMENT", titles=["One", None])
    single = gemini_facts({"content": {"parts": [{"text": "solo"}]}}, "embedContent")
    assert decode_gemini(single).texts == ["solo"]


# -- encode, split where the channel takes fewer --------------------------------


def texts(count: int) -> EmbeddingRequest:
    return EmbeddingRequest(texts=[f"t{i}" for i in range(count)], task_type="RETRIEVAL_QUERY", dimensions=256,
                            titles=[None] * count)


def test_openai_bodies_ask_for_floats_with_the_dimensions():
    assert encode(EmbeddingGrammar.OPENAI, EmbeddingRequest(token_ids=[[1, 2]], dimensions=8)) == [
        {"model": "m", "input": [[1, 2]], "encoding_format": "float", "dimensions": 8}]


def test_gemini_bodies_split_by_a_hundred_in_order():
    bodies = encode(EmbeddingGrammar.GEMINI, texts(250), "gemini-embedding-001")
    assert [len(b["requests"]) for b in bodies] == [100, 100, 50]
    assert [r["content"]["parts"][0]["text"] for b in bodies for r in b["requests"]] == texts(250).texts
    assert bodies[0]["requests"][0] == {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "t0"}]},
                                        "taskType": "RETRIEVAL_QUERY", "outputDimensionality": 256}


def test_vertex_bodies_split_by_250_or_one_for_its_gemini_models():
    assert [len(b["instances"]) for b in encode(EmbeddingGrammar.VERTEX, texts(300), "text-embedding-005")] == [250, 50]
    single = encode(EmbeddingGrammar.VERTEX, texts(3), "gemini-embedding-001")
    assert [b["instances"] for b in single] == [[{"content": f"t{i}", "task_type": "RETRIEVAL_QUERY"}] for i in range(3)]
    assert single[0]["parameters"] == {"outputDimensionality": 256}


def test_titan_takes_one_text_a_request_and_only_its_own_dimensions():
    assert encode(EmbeddingGrammar.TITAN, texts(2), "amazon.titan-embed-text-v2:0") == [
        {"inputText": "t0", "dimensions": 256, "normalize": True}, {"inputText": "t1", "dimensions": 256,
                                                                     "normalize": True}]
    with pytest.raises(CannotServe) as refused:
        encode(EmbeddingGrammar.TITAN, EmbeddingRequest(texts=["a"], dimensions=300), "amazon.titan-embed-text-v2:0")
    assert refused.value.field == "dimensions"
    with pytest.raises(CannotServe):
        encode(EmbeddingGrammar.TITAN, EmbeddingRequest(texts=["a"], dimensions=256), "amazon.titan-embed-text-v1")


def test_cohere_splits_by_96_with_an_input_type_and_refuses_dimensions_before_v4():
    request = EmbeddingRequest(texts=[f"t{i}" for i in range(200)])
    bodies = encode(EmbeddingGrammar.COHERE, request, "cohere.embed-english-v3")
    assert [len(b["texts"]) for b in bodies] == [96, 96, 8]
    assert {b["input_type"] for b in bodies} == {"search_document"}
    assert encode(EmbeddingGrammar.COHERE, texts(1), "cohere.embed-v4:0")[0]["output_dimension"] == 256
    with pytest.raises(CannotServe):
        encode(EmbeddingGrammar.COHERE, texts(1), "cohere.embed-english-v3")


@pytest.mark.parametrize("grammar", [g for g in EmbeddingGrammar if g != EmbeddingGrammar.OPENAI])
def test_token_ids_only_reach_openais_grammar(grammar):
    with pytest.raises(CannotServe) as refused:
        encode(grammar, EmbeddingRequest(token_ids=[[1, 2]]))
    assert refused.value.field == "input"


# -- read each grammar's answers --------------------------------------------------


@pytest.mark.parametrize(("grammar", "answers", "tokens"), [
    (EmbeddingGrammar.OPENAI, [{"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": VECTOR}],
                                "usage": {"prompt_tokens": 5}}], 5),
    (EmbeddingGrammar.GEMINI, [{"embeddings": [{"values": VECTOR}]}, {"embeddings": [{"values": [2.0]}]}], None),
    (EmbeddingGrammar.VERTEX, [{"predictions": [{"embeddings": {"values": VECTOR, "statistics": {"token_count": 3}}},
                                                {"embeddings": {"values": [2.0], "statistics": {"token_count": 4}}}]}], 7),
    (EmbeddingGrammar.TITAN, [{"embedding": VECTOR, "inputTextTokenCount": 2},
                              {"embedding": [2.0], "inputTextTokenCount": 1}], 3),
    (EmbeddingGrammar.COHERE, [{"embeddings": [VECTOR], INPUT_TOKENS_FIELD: 4},
                               {"embeddings": {"float": [[2.0]]}, INPUT_TOKENS_FIELD: 1}], 5),
])
def test_each_grammar_reads_its_vectors_in_order_and_its_token_count(grammar, answers, tokens):
    assert SIDES[grammar].read(answers) == ([VECTOR, [2.0]], tokens)


def test_counts_missing_from_any_part_are_not_reported():
    answers = [{"embeddings": [VECTOR], INPUT_TOKENS_FIELD: 4}, {"embeddings": [[2.0]]}]
    assert SIDES[EmbeddingGrammar.COHERE].read(answers)[1] is None


# -- the translated answer, written for the client ---------------------------------


def watcher(facts: RequestFacts, grammar: EmbeddingGrammar, expected: int, parts: bool = False) -> EmbeddingWatcher:
    api = EMBEDDINGS if facts.route.get("action") is None else GEMINI_EMBEDDINGS
    return EmbeddingWatcher(facts, api, SIDES[grammar], expected, parts)


def test_an_openai_client_gets_floats_or_little_endian_base64_and_the_reported_count():
    answer = dumps({"embeddings": [VECTOR], INPUT_TOKENS_FIELD: 4})
    for encoding in ("float", "base64"):
        w = watcher(openai_facts(input="x", encoding_format=encoding), EmbeddingGrammar.COHERE, 1)
        assert w.mark(Event(answer)) == Mark.CONTENT | Mark.TERMINAL
        body = json.loads(w.assembled_body())
        embedding = body["data"][0]["embedding"]
        values = list(struct.unpack("<3f", base64.b64decode(embedding))) if encoding == "base64" else embedding
        assert values == VECTOR
        assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4} and body["model"] == "public"
        assert (w.usage.input_tokens, w.usage.input_reported, w.usage.output_tokens) == (4, True, 0)


def test_unreported_usage_is_the_estimate_the_log_makes():
    facts = openai_facts(input=["twelve chars", "x"])
    w = watcher(facts, EmbeddingGrammar.GEMINI, 2, parts=True)
    assert w.mark(Event(dumps([{"embeddings": [{"values": VECTOR}]}, {"embeddings": [{"values": [2.0]}]}])))
    assert json.loads(w.assembled_body())["usage"]["prompt_tokens"] == estimate_tokens(13) == w.usage.input_tokens
    assert not w.usage.input_reported  # the row is marked usage_estimated


def test_a_gemini_client_gets_one_embedding_or_a_batch():
    single = watcher(gemini_facts({"content": {"parts": [{"text": "a"}]}}, "embedContent"), EmbeddingGrammar.OPENAI, 1)
    single.mark(Event(dumps({"data": [{"index": 0, "embedding": VECTOR}], "usage": {"prompt_tokens": 1}})))
    assert json.loads(single.assembled_body()) == {"embedding": {"values": VECTOR}}
    batch = watcher(gemini_facts({"requests": [gemini_request("a")]}), EmbeddingGrammar.VERTEX, 1)
    batch.mark(Event(dumps({"predictions": [{"embeddings": {"values": VECTOR}}]})))
    assert json.loads(batch.assembled_body()) == {"embeddings": [{"values": VECTOR}]}


@pytest.mark.parametrize("answer", [b"not json", b'{"embeddings": []}', b'{"data": "x"}', b"[]"])
def test_an_answer_that_is_not_one_for_the_request_is_the_channels_failure(answer):
    w = watcher(openai_facts(input="x"), EmbeddingGrammar.GEMINI, 1)
    assert w.mark(Event(answer)) == Mark.ERROR


def test_a_passed_through_answers_usage_is_read_from_its_end():
    body = b'{"object":"list","data":[{"index":0,"embedding":"AAAA"}],"model":"m","usage":{"prompt_tokens":7,' \
           b'"total_tokens":7}}'
    assert usage_tokens(body) == 7
    assert usage_tokens(b'{"data":[]}') is None
    w = EMBEDDINGS.new_watcher(openai_facts(input="x"))
    assert w.mark(Event(body)) == Mark.CONTENT | Mark.TERMINAL and w.assembled_body() == body
    assert EMBEDDINGS.new_watcher(openai_facts(input="x")).mark(Event(b'{"error": 1}')) == Mark.ERROR
