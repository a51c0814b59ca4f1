"""Channel kinds (providers.kinds): how a request reaches each kind of
channel, and how a cloud's answer becomes the events the relay handles."""

from __future__ import annotations

import asyncio
import base64
import binascii
import struct

import orjson
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from channels_pool.selection import ChannelInfo
from core.errors import failure_from_status
from providers.aws.eventstream import AnthropicFrames, ConverseFrames
from providers.kind import BrokenStream, Call, ConfigError, Operation
from providers.kinds import KINDS
from providers.refresh import Refreshed


def channel(kind: str, secret: str = "k", **settings: str) -> ChannelInfo:
    return ChannelInfo(id=1, name=kind, protocol=kind, base_url="http://cloud.test", secret=secret, models={},
                       priority=0, weight=1, max_concurrency=None, **settings)


def frame(headers: dict[str, str], payload: bytes, corrupt: bool = False) -> bytes:
    """One AWS event-stream message (string headers only)."""
    raw = b"".join(
        bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(raw) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    body = prelude + raw + payload
    crc = binascii.crc32(body) ^ (1 if corrupt else 0)
    return body + struct.pack(">I", crc)


def chunk(event: dict) -> bytes:
    payload = orjson.dumps({"bytes": base64.b64encode(orjson.dumps(event)).decode()})
    return frame({":event-type": "chunk", ":message-type": "event", ":content-type": "application/json"}, payload)


def test_a_bedrock_chunk_becomes_anthropics_own_event_even_split_across_reads():
    data = chunk({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}) + chunk(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}}
    )
    splitter = AnthropicFrames()
    events = [e for i in range(0, len(data), 7) for e in splitter.feed(data[i:i + 7])]
    assert [e.name for e in events] == ["message_start", "content_block_delta"]
    assert events[1].raw.startswith(b"event: content_block_delta\ndata: {")
    assert events[1].json["delta"]["text"] == "Hi"
    assert splitter.finish() == [] and splitter.pending_size == 0


def test_an_exception_frame_is_anthropics_error_event_busy_when_aws_throttles():
    exception = frame({":message-type": "exception", ":exception-type": "throttlingException"}, b'{"message":"slow"}')
    (event,) = AnthropicFrames().feed(exception)
    assert event.name == "error" and event.json["error"]["type"] == "overloaded_error"
    (converse,) = ConverseFrames().feed(exception)
    assert converse.json == {"exceptionType": "throttlingException", "message": "slow"}


def test_a_frame_with_a_bad_checksum_or_a_stream_ending_inside_a_frame_is_a_broken_stream():
    with pytest.raises(BrokenStream):
        ConverseFrames().feed(frame({":message-type": "event", ":event-type": "messageStart"}, b"{}", corrupt=True))
    splitter = ConverseFrames()
    assert splitter.feed(frame({":message-type": "event", ":event-type": "metadata"}, b"{}")[:-3]) == []
    with pytest.raises(BrokenStream):
        splitter.finish()


def test_frames_read_before_a_bad_checksum_are_handed_on_and_the_stream_is_cut_after_them():
    """The frames ahead of a corrupt one in the same read were whole and
    checked: their events go on (a token already generated is not lost, nor
    a first token taken for a failure before it), and the stream is cut at
    the next read or at its end."""
    good = chunk({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}) + chunk(
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}})
    bad = frame({":event-type": "chunk", ":message-type": "event"}, b"{}", corrupt=True)
    splitter = AnthropicFrames()
    assert [e.name for e in splitter.feed(good + bad)] == ["message_start", "content_block_delta"]
    with pytest.raises(BrokenStream):
        splitter.finish()
    again = AnthropicFrames()
    again.feed(good + bad)
    with pytest.raises(BrokenStream):
        again.feed(chunk({"type": "message_stop"}))  # nothing after the corrupt frame is read


def test_bedrock_signs_with_sigv4_and_sends_anthropic_models_the_bedrock_envelope():
    bedrock = channel("bedrock", secret="AKIDEXAMPLE:secret", region="us-east-1")
    body = {"model": "anthropic.claude-x-v1:0", "stream": True, "max_tokens": 5, "messages": []}
    betas = "interleaved-thinking-2025-05-14, claude-code-20250219,advanced-tool-use-2025-11-20,context-1m-2025-08-07"
    call = Call(Operation.MESSAGES, "anthropic.claude-x-v1:0", body, b"", {"anthropic-beta": betas})
    request = bedrock.kind.request(bedrock, call)
    assert request.url == "http://cloud.test/model/anthropic.claude-x-v1%3A0/invoke-with-response-stream"
    sent = orjson.loads(request.content)
    assert sent["anthropic_version"] == "bedrock-2023-05-31" and "model" not in sent and "stream" not in sent
    # Only the flags Bedrock knows: it refuses a request naming any other (Claude Code's own, say).
    assert sent["anthropic_beta"] == ["interleaved-thinking-2025-05-14", "context-1m-2025-08-07"]
    # botocore's own signer, given the same request and date, signs it alike.
    again = AWSRequest(method="POST", url=request.url, data=request.content,
                       headers={k: v for k, v in request.headers.items() if k.lower() != "authorization"})
    again.context["timestamp"] = request.headers["X-Amz-Date"]
    auth = SigV4Auth(Credentials("AKIDEXAMPLE", "secret"), "bedrock", "us-east-1")
    signature = auth.signature(auth.string_to_sign(again, auth.canonical_request(again)), again)
    assert request.headers["Authorization"].endswith(f"Signature={signature}")


def test_a_bedrock_api_key_is_a_bearer_and_other_models_speak_converse():
    bedrock = channel("bedrock", secret="ABSKexample", region="us-west-2")
    assert bedrock.kind.grammar("us.anthropic.claude-x") == "anthropic"
    assert bedrock.kind.grammar("amazon.nova-pro-v1:0") == "converse"
    request = bedrock.kind.request(bedrock, Call(Operation.CONVERSE, "amazon.nova-pro-v1:0", {}, b"{}"))
    assert request.headers["authorization"] == "Bearer ABSKexample"
    assert request.url.endswith("/model/amazon.nova-pro-v1%3A0/converse-stream")


def test_a_bedrock_model_error_fails_over_where_a_bad_request_does_not():
    bedrock = channel("bedrock", region="us-east-1")
    model_failed = bedrock.kind.failure(bedrock, 424, b'{"message":"the model failed"}', None,
                                        lambda status, body, retry_after: failure_from_status(status))
    refused = bedrock.kind.failure(bedrock, 400, b'{"message":"bad input"}', None,
                                   lambda status, body, retry_after: failure_from_status(status))
    assert model_failed.channel_fault and not model_failed.busy
    assert not refused.channel_fault


def test_azure_addresses_the_deployment_with_its_api_version_and_api_key():
    azure = channel("azure", secret="az", api_version="2024-10-21")
    request = azure.kind.request(azure, Call(Operation.CHAT, "my-gpt", {}, b"{}"))
    assert request.url == "http://cloud.test/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21"
    assert request.headers["api-key"] == "az"
    refusal = azure.kind.failure(azure, 400, b'{"error":{"code":"content_filter"}}', None, lambda *a: None)
    assert refusal.kind == "content_filter" and not refusal.channel_fault


def test_a_kinds_missing_setting_is_named():
    with pytest.raises(ConfigError) as bedrock:
        KINDS["bedrock"].check("http://x", "", {})
    assert bedrock.value.field == "region"
    with pytest.raises(ConfigError) as vertex:
        KINDS["vertex"].check("http://x", "{}", {"project": "p", "location": "us-east5"})
    assert vertex.value.field == "api_key" and "client_email" in vertex.value.message


def test_a_stale_credential_is_refreshed_once_however_many_wait():
    async def scenario() -> tuple[list[str], int]:
        release = asyncio.Event()

        async def fetch() -> tuple[str, float]:
            await release.wait()
            return "token", float("inf")

        kept = Refreshed(fetch)
        waiting = [asyncio.ensure_future(kept.get()) for _ in range(20)]
        await asyncio.sleep(0)
        release.set()
        return await asyncio.gather(*waiting), kept.refreshes

    tokens, refreshes = asyncio.run(scenario())
    assert tokens == ["token"] * 20 and refreshes == 1


def test_counting_goes_to_each_kinds_own_counting_endpoint():
    messages = {"model": "m", "max_tokens": 9, "temperature": 1, "messages": [{"role": "user", "content": "hi"}]}
    vendor = channel("anthropic")
    request = vendor.kind.request(vendor, Call(Operation.COUNT, "claude-x", messages, b""))
    assert request.url == "http://cloud.test/v1/messages/count_tokens"
    assert orjson.loads(request.content) == {"model": "m", "messages": messages["messages"]}  # all it takes
    contents = {"contents": [{"parts": [{"text": "hi"}]}], "safetySettings": []}
    gemini = channel("gemini")
    request = gemini.kind.request(gemini, Call(Operation.COUNT, "gemini-x", contents, b"", route={"version": "v1beta"}))
    assert request.url == "http://cloud.test/v1beta/models/gemini-x:countTokens"
    assert orjson.loads(request.content) == {"generateContentRequest": {"model": "models/gemini-x", **contents}}
    vertex = channel("vertex", project="p", location="l")
    request = vertex.kind.request(vertex, Call(Operation.COUNT, "gemini-x", contents, b""))
    assert request.url.endswith("/projects/p/locations/l/publishers/google/models/gemini-x:countTokens")
    assert orjson.loads(request.content) == {"contents": contents["contents"]}  # Vertex refuses safetySettings
    request = vertex.kind.request(vertex, Call(Operation.COUNT, "claude-x@1", messages, b""))
    assert request.url.endswith("/publishers/anthropic/models/count-tokens:rawPredict")
    assert orjson.loads(request.content)["model"] == "claude-x@1"
    assert not channel("openai").kind.serves(Operation.COUNT) and not channel("azure").kind.serves(Operation.COUNT)


def test_bedrock_counts_a_profiles_foundation_model_with_the_invoke_body_as_a_blob():
    bedrock = channel("bedrock", secret="ABSKexample", region="us-east-1")
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    request = bedrock.kind.request(bedrock, Call(Operation.COUNT, "us.anthropic.claude-x-v1:0", body, b""))
    assert request.url == "http://cloud.test/model/anthropic.claude-x-v1%3A0/count-tokens"
    invoke = orjson.loads(base64.b64decode(orjson.loads(request.content)["input"]["invokeModel"]["body"]))
    assert invoke == {"messages": body["messages"], "anthropic_version": "bedrock-2023-05-31", "max_tokens": 1}
    assert orjson.loads(request.answer(b'{"inputTokens": 12}', None)) == {"input_tokens": 12}
    thinking = {**body, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    request = bedrock.kind.request(bedrock, Call(Operation.COUNT, "anthropic.claude-x-v1:0", thinking, b""))
    invoke = orjson.loads(base64.b64decode(orjson.loads(request.content)["input"]["invokeModel"]["body"]))
    assert invoke["max_tokens"] == 2049  # InvokeModel refuses a thinking budget not under max_tokens
    converse = {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "inferenceConfig": {"maxTokens": 5}}
    request = bedrock.kind.request(bedrock, Call(Operation.COUNT, "amazon.nova-pro-v1:0", converse, b""))
    assert orjson.loads(request.content) == {"input": {"converse": {"messages": converse["messages"]}}}
    assert request.answer is None


@pytest.mark.parametrize(("header", "sent"), [
    ("claude-code-20250219,interleaved-thinking-2025-05-14,prompt-caching-scope-2026-01-05",
     "interleaved-thinking-2025-05-14"),
    ("claude-code-20250219", None),  # none Vertex knows: no header at all
])
def test_vertex_gets_only_the_beta_flags_it_knows(header, sent):
    vertex = channel("vertex", project="p", location="l")
    body = {"model": "claude-x@1", "max_tokens": 5, "messages": []}
    request = vertex.kind.request(vertex, Call(Operation.MESSAGES, "claude-x@1", body, b"", {"anthropic-beta": header}))
    assert request.headers.get("anthropic-beta") == sent
