"""The simulator as Azure OpenAI, Amazon Bedrock and Google Vertex AI, checked with the clouds' own clients.

boto3 and the anthropic SDK sign every Bedrock call with SigV4 and decode
AWS's binary event stream; google-auth exchanges a service-account JWT at the
simulator's token endpoint before google-genai and the anthropic SDK call
Vertex; openai's AzureOpenAI builds Azure's deployment URLs. If any of them
refused what the simulator sends, the gateway's cloud channels would be
tested against a fiction. No database is touched.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import botocore.auth
import google.auth.exceptions
import httpx
import httpx2
import openai
import pytest
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import ChecksumMismatch
from botocore.exceptions import ClientError, EventStreamError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth.transport.requests import Request as GoogleRequest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from simulator import (
    SIM_AWS_ACCESS_KEY_ID,
    SIM_AWS_SECRET_ACCESS_KEY,
    SIM_BEDROCK_API_KEY,
    vertex_service_account,
)
from simulator.wire import THINKING_WORDS, TOOL_ARGUMENTS
from tests.support.cloud_clients import (
    AZURE_VERSION,
    CLAUDE_PROFILE,
    NOVA,
    anthropic_bedrock,
    anthropic_vertex,
    azure,
    bedrock,
    bedrock_anthropic_body,
    converse_messages,
    frames,
    genai_vertex,
    vertex_credentials,
)
from tests.support.simulator_harness import PROMPT, Sim, chat, expected_text, serving, sse_blocks, words_in


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with serving() as server:
        yield server


def error_type(caught: ClientError) -> str:
    return caught.response["Error"]["Code"]


# --------------------------------------------------------------------------- Bedrock: Converse


def test_converse_stream_speaks_the_converse_events(sim: Sim) -> None:
    prompt = f"{PROMPT} [sim tokens=3 thinking=2 tool=1 cached=2 tag=cv-stream]"
    events = list(bedrock(sim).converse_stream(modelId=NOVA, messages=converse_messages(prompt),
                                               system=[{"text": "Be brief"}])["stream"])
    kinds = [next(iter(event)) for event in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    deltas = [e["contentBlockDelta"] for e in events if "contentBlockDelta" in e]
    reasoning = "".join(d["delta"]["reasoningContent"].get("text", "") for d in deltas if d["contentBlockIndex"] == 0)
    assert reasoning == expected_text(2, THINKING_WORDS)
    assert "".join(d["delta"].get("text", "") for d in deltas if d["contentBlockIndex"] == 1) == expected_text(3)
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start["contentBlockIndex"] == 2 and start["start"]["toolUse"]["name"] == "get_weather"
    assert "".join(d["delta"]["toolUse"]["input"] for d in deltas if "toolUse" in d["delta"]) == TOOL_ARGUMENTS
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    prompt_words = words_in(prompt, "Be brief")
    assert events[-1]["metadata"]["usage"] == {"inputTokens": prompt_words - 2, "outputTokens": 5,
                                               "totalTokens": prompt_words + 5, "cacheReadInputTokens": 2,
                                               "cacheWriteInputTokens": 0}
    record = sim.record("cv-stream")
    assert (record["protocol"], record["model"], record["stream"]) == ("bedrock-converse", NOVA, True)
    assert record["path"] == f"/model/{NOVA}/converse-stream"
    assert record["headers"]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={SIM_AWS_ACCESS_KEY_ID}/")
    sent = frames(sim.sent("cv-stream"))
    assert all(f.headers[":message-type"] == "event" and f.headers[":content-type"] == "application/json"
               for f in sent)
    assert all("p" in json.loads(f.payload) for f in sent)  # Bedrock's padding, which clients must ignore


def test_converse_answers_one_body(sim: Sim) -> None:
    reply = bedrock(sim).converse(modelId="mistral.mistral-large-2407-v1:0",
                                  messages=converse_messages(f"{PROMPT} [sim tokens=4]"))
    assert reply["output"]["message"] == {"role": "assistant", "content": [{"text": expected_text(4)}]}
    assert reply["stopReason"] == "end_turn" and reply["usage"]["outputTokens"] == 4
    assert reply["usage"]["inputTokens"] == words_in(PROMPT, "[sim tokens=4]") and reply["metrics"]["latencyMs"] > 0


def test_event_stream_frames_survive_any_split(sim: Sim) -> None:
    fixed = "tokens=5 thinking=1 tool=1 id=fixed created=1700000000"
    # The same number of words either way (crlf=0 changes nothing here), so the same bytes.
    for directives in ("tag=cv-whole crlf=0", "tag=cv-split split=11"):
        events = list(bedrock(sim).converse_stream(
            modelId=NOVA, messages=converse_messages(f"[sim {fixed} {directives}]"))["stream"])
        assert events[-1]["metadata"]["usage"]["outputTokens"] == 6
    assert sim.sent("cv-whole") == sim.sent("cv-split")
    assert len(frames(sim.sent("cv-split"))) == len(events) == 17


# --------------------------------------------------------------------------- Bedrock: Anthropic via invoke


def test_invoke_with_response_stream_wraps_anthropic_events(sim: Sim) -> None:
    body = bedrock_anthropic_body(f"{PROMPT} [sim tokens=3 cache_write=2 tag=inv-stream]")
    response = bedrock(sim).invoke_model_with_response_stream(modelId=CLAUDE_PROFILE, body=json.dumps(body))
    events = [json.loads(part["chunk"]["bytes"]) for part in response["body"]]
    assert response["contentType"] == "application/json"
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "content_block_delta",
                                           "content_block_delta", "content_block_delta", "content_block_stop",
                                           "message_delta", "message_stop"]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == expected_text(3)
    metrics = events[-1]["amazon-bedrock-invocationMetrics"]
    prompt_words = words_in(PROMPT, "[sim tokens=3 cache_write=2 tag=inv-stream]")
    assert metrics["inputTokenCount"] == prompt_words - 2 and metrics["outputTokenCount"] == 3
    assert metrics["cacheWriteInputTokenCount"] == 2 and {"invocationLatency", "firstByteLatency"} <= set(metrics)
    record = sim.record("inv-stream")
    assert record["path"] == f"/model/{CLAUDE_PROFILE}/invoke-with-response-stream"
    assert record["body"]["anthropic_version"] == "bedrock-2023-05-31" and record["protocol"] == "bedrock-anthropic"
    assert {f.headers[":event-type"] for f in frames(sim.sent("inv-stream"))} == {"chunk"}


def test_invoke_answers_the_anthropic_message(sim: Sim) -> None:
    response = bedrock(sim).invoke_model(modelId="anthropic.claude-3-5-haiku-20241022-v1:0",
                                         body=json.dumps(bedrock_anthropic_body("[sim tokens=2 tool=1]")))
    message = json.loads(response["body"].read())
    assert message["type"] == "message" and message["stop_reason"] == "tool_use"
    assert message["content"] == [{"type": "text", "text": expected_text(2)},
                                  {"type": "tool_use", "id": message["content"][1]["id"], "name": "get_weather",
                                   "input": json.loads(TOOL_ARGUMENTS)}]
    assert response["ResponseMetadata"]["HTTPHeaders"]["x-amzn-bedrock-output-token-count"] == "2"


def test_count_tokens_counts_an_invoke_body_or_a_converse_request_for_boto3(sim: Sim) -> None:
    client = bedrock(sim)
    invoke = client.count_tokens(modelId="anthropic.claude-3-5-haiku-20241022-v1:0", input={
        "invokeModel": {"body": json.dumps(bedrock_anthropic_body("three words here [sim tag=ct-invoke]"))}})
    converse = client.count_tokens(modelId="amazon.nova-pro-v1:0", input={"converse": {
        "system": [{"text": "be brief"}],
        "messages": [{"role": "user", "content": [{"text": "two words [sim tag=ct-converse]"}]}]}})
    assert invoke["inputTokens"] == words_in("three words here [sim tag=ct-invoke]")
    assert converse["inputTokens"] == words_in("be brief", "two words [sim tag=ct-converse]")
    assert sim.record("ct-converse")["path"] == "/model/amazon.nova-pro-v1:0/count-tokens"


def test_bedrock_refuses_an_anthropic_body_with_model_or_stream(sim: Sim) -> None:
    with pytest.raises(ClientError) as caught:
        bedrock(sim).invoke_model(modelId=CLAUDE_PROFILE,
                                  body=json.dumps({**bedrock_anthropic_body("hi"), "model": "claude"}))
    assert error_type(caught.value) == "ValidationException" and "model" in str(caught.value)


def test_anthropic_bedrock_sdk_works_signed_or_with_an_api_key(sim: Sim) -> None:
    reply = anthropic_bedrock(sim).messages.create(model=CLAUDE_PROFILE, max_tokens=20,
                                                   messages=chat(f"{PROMPT} [sim tokens=4 tag=ab-whole]"))
    assert reply.content[0].text == expected_text(4) and reply.id.startswith("msg_bdrk_")
    with anthropic_bedrock(sim).messages.stream(model=CLAUDE_PROFILE, max_tokens=20,
                                                messages=chat("[sim tokens=3 thinking=1]")) as stream:
        assert "".join(stream.text_stream) == expected_text(3)
        assert stream.get_final_message().usage.output_tokens == 4
    keyed = anthropic_bedrock(sim, api_key=SIM_BEDROCK_API_KEY)
    assert keyed.messages.create(model=CLAUDE_PROFILE, max_tokens=9, messages=chat("[sim tokens=2 tag=ab-key]")
                                 ).content[0].text == expected_text(2)
    assert sim.record("ab-key")["headers"]["authorization"] == f"Bearer {SIM_BEDROCK_API_KEY}"


# --------------------------------------------------------------------------- Bedrock: failures


def test_an_exception_frame_mid_stream_raises_with_its_code(sim: Sim) -> None:
    received = ""
    with pytest.raises(EventStreamError) as caught:
        for event in bedrock(sim).converse_stream(modelId=NOVA, messages=converse_messages(
                "[sim exception_after=2 exception=throttlingException tag=exc]"))["stream"]:
            received += event.get("contentBlockDelta", {}).get("delta", {}).get("text", "")
    assert error_type(caught.value) == "throttlingException" and received == expected_text(2)
    last = frames(sim.sent("exc"))[-1]
    assert last.headers[":message-type"] == "exception" and last.headers[":exception-type"] == "throttlingException"
    assert sim.record("exc")["completed"] is False

    # The anthropic SDK turns the same frame into an error it raises.
    with pytest.raises(anthropic.APIStatusError) as sdk_caught:
        with anthropic_bedrock(sim).messages.stream(model=CLAUDE_PROFILE, max_tokens=20, messages=chat(
                "[sim exception_after=1 exception=serviceUnavailableException]")) as stream:
            assert "".join(stream.text_stream) == expected_text(1)
    assert sdk_caught.value.body["error"]["type"] == "serviceUnavailableException"


def test_a_frame_with_a_bad_crc_cannot_be_read_past(sim: Sim) -> None:
    deltas = 0
    with pytest.raises(ChecksumMismatch):
        for event in bedrock(sim).converse_stream(modelId=NOVA,
                                                  messages=converse_messages("[sim bad_crc_after=3]"))["stream"]:
            deltas += "contentBlockDelta" in event
    assert deltas == 3


def test_http_errors_raise_botocores_error_classes(sim: Sim) -> None:
    client = bedrock(sim)
    for directives, expected in (("status=429 retry_after=2", client.exceptions.ThrottlingException),
                                 ("status=503", client.exceptions.ServiceUnavailableException),
                                 ("status=500", client.exceptions.InternalServerException),
                                 ("status=400", client.exceptions.ValidationException),
                                 ("status=403 reason=AccessDeniedException", client.exceptions.AccessDeniedException)):
        with pytest.raises(expected) as caught:
            client.converse(modelId=NOVA, messages=converse_messages(f"[sim {directives}]"))
        assert "simulated upstream failure" in caught.value.response["Error"]["Message"]
    with pytest.raises(client.exceptions.ThrottlingException):
        client.invoke_model(modelId=CLAUDE_PROFILE, body=json.dumps(bedrock_anthropic_body(
            "[sim error_after=1 exception=throttlingException]")))


def test_stalls_and_cuts_reach_boto3(sim: Sim) -> None:
    with pytest.raises(urllib3.exceptions.ProtocolError):
        list(bedrock(sim).converse_stream(modelId=NOVA, messages=converse_messages("[sim cut_after=2]"))["stream"])
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        list(bedrock(sim, read_timeout=0.3).converse_stream(
            modelId=NOVA, messages=converse_messages("[sim stall_after=1 tag=bd-stall]"))["stream"])
    record = sim.wait_record("bd-stall", lambda r: r["client_closed_at"] is not None)
    assert record["tokens_at_close"] == 1
    with pytest.raises(httpx2.RemoteProtocolError):
        with anthropic_bedrock(sim).messages.stream(model=CLAUDE_PROFILE, max_tokens=9,
                                                    messages=chat("[sim cut_after=1]")) as stream:
            list(stream.text_stream)


# --------------------------------------------------------------------------- Bedrock: credentials


def test_sigv4_refuses_a_wrong_secret_an_unknown_key_and_an_old_date(sim: Sim, monkeypatch) -> None:
    with pytest.raises(ClientError) as caught:
        bedrock(sim, secret="not-the-secret").converse(modelId=NOVA, messages=converse_messages("[sim tag=bad-sig]"))
    assert error_type(caught.value) == "InvalidSignatureException"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert sim.record("bad-sig")["status"] == 403
    with pytest.raises(ClientError) as caught:
        bedrock(sim, access_key="AKIAUNKNOWNKEY000000").converse(modelId=NOVA, messages=converse_messages("hi"))
    assert error_type(caught.value) == "UnrecognizedClientException"
    stale = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(minutes=10)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: stale)
    with pytest.raises(ClientError) as caught:
        bedrock(sim).converse(modelId=NOVA, messages=converse_messages("hi"))
    assert error_type(caught.value) == "InvalidSignatureException" and "expired" in str(caught.value)


def test_a_body_changed_after_signing_is_refused(sim: Sim) -> None:
    url = f"{sim.base}/model/{NOVA}/converse"
    signed = AWSRequest(method="POST", url=url, data=b'{"messages":[]}', headers={"content-type": "application/json"})
    SigV4Auth(Credentials(SIM_AWS_ACCESS_KEY_ID, SIM_AWS_SECRET_ACCESS_KEY), "bedrock", "us-east-1").add_auth(signed)
    headers = dict(signed.headers.items())
    assert httpx.post(url, content=b'{"messages":[]}', headers=headers).status_code == 200
    tampered = httpx.post(url, content=b'{"messages":[1]}', headers=headers)
    assert tampered.status_code == 403 and tampered.headers["x-amzn-errortype"].startswith("InvalidSignatureException:")
    assert "message" in tampered.json()
    assert httpx.post(url, json={}).headers["x-amzn-errortype"].startswith("MissingAuthenticationTokenException")


def test_one_channel_fails_through_its_session_token_or_api_key(sim: Sim) -> None:
    failing = bedrock(sim, session_token="sim:status=503,tag=tok-fail")
    with pytest.raises(ClientError) as caught:
        failing.converse(modelId=NOVA, messages=converse_messages("hi"))
    assert error_type(caught.value) == "ServiceUnavailableException"
    assert sim.record("tok-fail")["directives"] == {"status": "503", "tag": "tok-fail"}
    # Any other session token is just a session token.
    assert bedrock(sim, session_token="FwoGZXIvYXdzEBYaDH").converse(
        modelId=NOVA, messages=converse_messages("[sim tokens=1]"))["usage"]["outputTokens"] == 1
    with pytest.raises(anthropic.RateLimitError):
        anthropic_bedrock(sim, api_key="sim:status=429").messages.create(model=CLAUDE_PROFILE, max_tokens=9,
                                                                           messages=chat("hi"))
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic_bedrock(sim, api_key="ABSK-some-other-key").messages.create(model=CLAUDE_PROFILE, max_tokens=9,
                                                                                messages=chat("hi"))


def test_bedrock_embeds_with_titan_and_cohere(sim: Sim) -> None:
    titan = json.loads(bedrock(sim).invoke_model(modelId="amazon.titan-embed-text-v2:0", body=json.dumps(
        {"inputText": "one two three", "dimensions": 8}))["body"].read())
    assert len(titan["embedding"]) == 8 and titan["inputTextTokenCount"] == 3
    cohere = json.loads(bedrock(sim).invoke_model(modelId="cohere.embed-english-v3", body=json.dumps(
        {"texts": ["b", "a", "b"], "input_type": "search_document"}))["body"].read())
    assert cohere["embeddings"][0] == cohere["embeddings"][2] != cohere["embeddings"][1]


# --------------------------------------------------------------------------- Vertex: the token endpoint


def test_google_auth_exchanges_the_key_once_for_many_calls(sim: Sim) -> None:
    key = vertex_service_account(sim.base, "tag=vx-once")
    client = genai_vertex(sim, vertex_credentials(key))
    for _ in range(3):
        assert client.models.generate_content(model="gemini-2.5-flash", contents="[sim tokens=2]").text \
            == expected_text(2)
    tokens = sim.http.get(f"{sim.base}/_sim/tokens").json()
    assert tokens["by_client"][key["client_email"]] == 1 and tokens["ttl"] == 3600
    records = sim.records("vx-once")
    assert len(records) == 3 and all(r["protocol"] == "vertex-gemini" for r in records)
    assert records[0]["path"] == ("/v1beta1/projects/hopbase-sim/locations/europe-west4/publishers/google/models/"
                                  "gemini-2.5-flash:generateContent")
    exchange = [r for r in sim.records() if r["path"] == "/token"][-1]
    assert exchange["body"] == {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer"}


def test_a_key_signed_by_another_key_is_an_invalid_grant(sim: Sim) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    before = sim.http.get(f"{sim.base}/_sim/tokens").json()["refused"]
    forged = vertex_credentials({**vertex_service_account(sim.base), "private_key": other})
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        forged.refresh(GoogleRequest())
    assert sim.http.get(f"{sim.base}/_sim/tokens").json()["refused"] == before + 1
    refused = httpx.post(f"{sim.base}/token", data={"grant_type": "password", "assertion": "x"})
    assert refused.status_code == 400 and refused.json()["error"] == "unsupported_grant_type"


def test_tokens_expire_after_their_lifetime_and_can_be_revoked(sim: Sim) -> None:
    credentials = vertex_credentials(vertex_service_account(sim.base))
    url = (f"{sim.base}/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-flash"
           ":generateContent")
    body = {"contents": [{"role": "user", "parts": [{"text": "[sim tokens=1]"}]}]}
    sim.http.post(f"{sim.base}/_sim/tokens", params={"ttl": 0})
    try:
        credentials.refresh(GoogleRequest())
        expired = httpx.post(url, json=body, headers={"authorization": f"Bearer {credentials.token}"})
    finally:
        sim.simulator.vertex_token_ttl = 3600.0
    assert expired.status_code == 401
    assert expired.json()["error"]["status"] == "UNAUTHENTICATED" and expired.json()["error"]["code"] == 401
    credentials.refresh(GoogleRequest())
    live = {"authorization": f"Bearer {credentials.token}"}
    assert httpx.post(url, json=body, headers=live).status_code == 200
    assert sim.http.post(f"{sim.base}/_sim/tokens", params={"revoke": 1}).json()["live"] == 0
    assert httpx.post(url, json=body, headers=live).status_code == 401
    assert httpx.post(url, json=body, headers={"authorization": "Bearer ya29.made-up"}).status_code == 401


def test_one_vertex_channel_fails_through_its_key(sim: Sim) -> None:
    failing = genai_vertex(sim, vertex_credentials(vertex_service_account(sim.base, "status=429 tag=vx-429")))
    with pytest.raises(genai_errors.ClientError) as caught:
        failing.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert (caught.value.code, caught.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert sim.record("vx-429")["directives"] == {"status": "429", "tag": "vx-429"}
    no_token = vertex_credentials(vertex_service_account(sim.base, "token_status=400"))
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        no_token.refresh(GoogleRequest())


# --------------------------------------------------------------------------- Vertex: Gemini and Claude


def test_genai_streams_gemini_from_vertex(sim: Sim) -> None:
    client = genai_vertex(sim, vertex_credentials(vertex_service_account(sim.base)))
    chunks = list(client.models.generate_content_stream(
        model="gemini-2.5-flash", contents=f"{PROMPT} [sim tokens=4 thinking=1 pace=0.02 tag=vx-stream]"))
    parts = [p for c in chunks for p in c.candidates[0].content.parts]
    assert "".join(p.text or "" for p in parts if not p.thought) == expected_text(4)
    assert chunks[-1].usage_metadata.candidates_token_count == 4
    record = sim.record("vx-stream")
    assert record["query"] == {"alt": "sse"} and record["stream"] is True
    assert record["finished_at"] - record["first_token_at"] >= 0.02 * 3  # the pace directive held
    assert b"\r\n\r\n" in sim.sent("vx-stream")  # Google's CRLF, on Vertex too


def test_genai_embeds_through_predict(sim: Sim) -> None:
    client = genai_vertex(sim, vertex_credentials(vertex_service_account(sim.base)))
    reply = client.models.embed_content(model="text-embedding-005", contents=["one two", "three"],
                                        config=genai_types.EmbedContentConfig(output_dimensionality=8))
    assert [len(e.values) for e in reply.embeddings] == [8, 8]
    assert reply.embeddings[0].statistics.token_count == 2


def test_anthropic_vertex_calls_claude_with_a_token(sim: Sim) -> None:
    client = anthropic_vertex(sim)
    reply = client.messages.create(model="claude-sonnet-4-5@20250929", max_tokens=20,
                                   messages=chat(f"{PROMPT} [sim tokens=3 tag=av-whole]"))
    assert reply.content[0].text == expected_text(3) and reply.id.startswith("msg_vrtx_")
    with client.messages.stream(model="claude-sonnet-4-5@20250929", max_tokens=20,
                                messages=chat("[sim tokens=2 tool=1 tag=av-stream]")) as stream:
        assert stream.get_final_message().content[1].input == json.loads(TOOL_ARGUMENTS)
    whole, streamed = sim.record("av-whole"), sim.record("av-stream")
    assert whole["path"].endswith("/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict")
    assert streamed["path"].endswith(":streamRawPredict") and streamed["stream"] is True
    assert "model" not in whole["body"] and whole["body"]["anthropic_version"]
    assert [b.split("\n")[0] for b in sse_blocks(sim.sent("av-stream"))][:2] == ["event: message_start", "event: ping"]

    token = client.credentials.token
    assert anthropic_vertex(sim, access_token=token).messages.create(
        model="claude-haiku-4-5@20251001", max_tokens=9, messages=chat("[sim tokens=1]")).content[0].text \
        == expected_text(1)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_vertex(sim, access_token="ya29.not-issued").messages.create(
            model="claude-haiku-4-5@20251001", max_tokens=9, messages=chat("hi"))
    with pytest.raises(anthropic.RateLimitError) as caught:  # Vertex's quota answers in Google's shape
        client.messages.create(model="claude-sonnet-4-5@20250929", max_tokens=9, messages=chat("[sim status=429]"))
    assert caught.value.body["error"]["status"] == "RESOURCE_EXHAUSTED"


def test_vertex_counts_tokens_for_both_publishers(sim: Sim) -> None:
    assert anthropic_vertex(sim).messages.count_tokens(
        model="claude-sonnet-4-5@20250929", messages=chat("one two three")).input_tokens == 3
    client = genai_vertex(sim, vertex_credentials(vertex_service_account(sim.base)))
    assert client.models.count_tokens(model="gemini-2.5-flash", contents="one two three four").total_tokens == 4


# --------------------------------------------------------------------------- Azure OpenAI


def test_azure_chat_streams_with_a_filter_only_first_chunk(sim: Sim) -> None:
    chunks = list(azure(sim).chat.completions.create(
        model="gpt-4o-prod", stream=True, stream_options={"include_usage": True},
        messages=chat(f"{PROMPT} [sim tokens=3 tag=az-stream]")))
    # The SDK hands the filter-only chunk on as a chunk without choices: a client must skip it.
    assert chunks[0].choices == [] and chunks[0].model == "" and chunks[0].id == ""
    assert chunks[0].prompt_filter_results[0]["content_filter_results"]["hate"] == {"filtered": False,
                                                                                  "severity": "safe"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_text(3) and chunks[-1].usage.completion_tokens == 3
    assert all(c.choices[0].content_filter_results for c in chunks if c.choices and c.choices[0].delta.content)
    record = sim.record("az-stream")
    assert record["path"] == "/openai/deployments/gpt-4o-prod/chat/completions"
    assert record["query"] == {"api-version": AZURE_VERSION} and record["api_key"] == "azure-key"
    assert (record["protocol"], record["model"], record["stream"]) == ("azure-chat", "gpt-4o-prod", True)
    first = sse_blocks(sim.sent("az-stream"))[0]
    assert first.startswith('data: {"choices":[],"created":0,"id":"","model":""')


def test_azure_chat_answers_whole_and_filters_on_request(sim: Sim) -> None:
    reply = azure(sim).chat.completions.create(model="gpt-4o-prod", messages=chat("[sim tokens=2]"))
    assert reply.choices[0].message.content == expected_text(2) and reply.choices[0].finish_reason == "stop"
    assert reply.prompt_filter_results[0]["prompt_index"] == 0 and reply.choices[0].content_filter_results
    with pytest.raises(openai.BadRequestError) as caught:
        azure(sim).chat.completions.create(model="gpt-4o-prod", messages=chat("[sim content_filter=1]"))
    assert caught.value.code == "content_filter" and caught.value.param == "prompt"
    assert caught.value.body["innererror"]["code"] == "ResponsibleAIPolicyViolation"
    filtered = list(azure(sim).chat.completions.create(model="gpt-4o-prod", stream=True,
                                                       messages=chat("[sim tokens=2 filter_finish=1]")))
    assert filtered[-1].choices[0].finish_reason == "content_filter"
    assert filtered[-1].choices[0].content_filter_results["violence"]["filtered"] is True
    with pytest.raises(openai.RateLimitError) as limited:
        azure(sim).chat.completions.create(model="gpt-4o-prod", messages=chat("[sim status=429 retry_after=7]"))
    assert limited.value.code == "429" and limited.value.response.headers["retry-after"] == "7"


def test_azure_responses_both_paths(sim: Sim) -> None:
    reply = azure(sim).responses.create(model="gpt-4o-prod", input="[sim tokens=3 tag=az-resp]")
    assert reply.output_text == expected_text(3)
    assert sim.record("az-resp")["path"] == "/openai/responses"
    v1 = openai.OpenAI(base_url=f"{sim.base}/openai/v1", api_key="azure-key", max_retries=0)
    with v1.responses.stream(model="gpt-4o-prod", input="[sim tokens=2 tag=az-v1]") as stream:
        assert stream.get_final_response().output_text == expected_text(2)
    record = sim.record("az-v1")
    assert (record["path"], record["model"], record["protocol"]) == ("/openai/v1/responses", "gpt-4o-prod",
                                                                    "azure-responses")


def test_azure_refuses_a_missing_key_and_obeys_stream_directives(sim: Sim) -> None:
    missing = httpx.post(f"{sim.base}/openai/deployments/d/chat/completions", params={"api-version": AZURE_VERSION},
                         json={"messages": chat("hi")})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "401"
    with pytest.raises(openai.APITimeoutError):
        list(azure(sim, timeout=0.3).chat.completions.create(model="d", stream=True,
                                                             messages=chat("[sim stall_after=1 tag=az-stall]")))
    assert sim.wait_record("az-stall", lambda r: r["client_closed_at"] is not None)["tokens_at_close"] == 1
    bearer = httpx.post(f"{sim.base}/openai/deployments/d/chat/completions", params={"api-version": AZURE_VERSION},
                        json={"messages": chat("[sim tokens=1]")}, headers={"authorization": "Bearer entra-token"})
    assert bearer.status_code == 200


def test_azure_embeddings_keep_input_order(sim: Sim) -> None:
    reply = azure(sim).embeddings.create(model="embed-prod", input=["b", "a", "b"], dimensions=8)
    vectors = [item.embedding for item in reply.data]
    assert [len(v) for v in vectors] == [8, 8, 8] and vectors[0] == vectors[2] != vectors[1]
    assert [item.index for item in reply.data] == [0, 1, 2] and reply.usage.prompt_tokens == 3


# --------------------------------------------------------------------------- the command


def test_the_command_writes_a_vertex_key_it_accepts(tmp_path: Path) -> None:
    manage = Path(__file__).resolve().parents[2] / "manage.py"
    key_path = tmp_path / "vertex.json"
    process = subprocess.Popen([sys.executable, str(manage), "simulate_upstream", "--port", "0",
                                "--vertex-key-out", str(key_path), "--vertex-token-ttl", "900"],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(r"simulator listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, line
        key = json.loads(key_path.read_text())
        assert key["token_uri"] == f"{match.group(1)}/token" and key["type"] == "service_account"
        credentials = vertex_credentials(key)
        credentials.refresh(GoogleRequest())
        assert credentials.token.startswith("ya29.")
        tokens = httpx.get(f"{match.group(1)}/_sim/tokens").json()
        assert tokens["ttl"] == 900 and tokens["by_client"] == {key["client_email"]: 1}
    finally:
        process.terminate()
        process.wait(timeout=5)
