"""The upstream simulator, checked with the official SDKs the gateway's clients use.

If the simulator's bytes drift from what OpenAI, Anthropic and Google send, every
gateway test built on it proves nothing; so each protocol is parsed here by its
own SDK, and the failure directives are checked for the exception each SDK raises.
No database is touched.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from channels_pool.simulator import Simulator
from channels_pool.simulator_wire import TEXT_WORDS, THINKING_WORDS, TOOL_ARGUMENTS

PROMPT = "Please describe the weather in Paris today"  # 7 words, 42 characters
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


def expected_text(count: int, words: tuple[str, ...] = TEXT_WORDS) -> str:
    return " ".join(words[i % len(words)] for i in range(count))


def words_in(*texts: str) -> int:
    return sum(len(text.split()) for text in texts)


@dataclass
class Sim:
    base: str
    port: int
    simulator: Simulator
    http: httpx.Client
    # Building an SDK client costs tens of milliseconds (TLS contexts), and genai
    # closes its HTTP client once the Client object is collected, even mid-call
    # through client.models: so clients are built once and kept for the module.
    clients: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def records(self, tag: str | None = None) -> list[dict[str, Any]]:
        params = {"tag": tag} if tag else {}
        return self.http.get(f"{self.base}/_sim/records", params=params).json()

    def record(self, tag: str) -> dict[str, Any]:
        found = self.records(tag)
        assert len(found) == 1, found
        return found[0]

    def wait_record(self, tag: str, ready: Callable[[dict[str, Any]], bool], within: float = 2.0) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            record = self.record(tag)
            if ready(record) or time.monotonic() > deadline:
                return record
            threading.Event().wait(0.005)

    def sent(self, tag: str) -> bytes:
        return base64.b64decode(self.record(tag)["sent_b64"])

    def _client(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        if key not in self.clients:
            self.clients[key] = build()
        return self.clients[key]

    def openai(self, api_key: str = "x") -> openai.OpenAI:
        return self._client(("openai", api_key), lambda: openai.OpenAI(
            base_url=f"{self.base}/v1", api_key=api_key, max_retries=0))

    def anthropic(self, api_key: str = "x") -> anthropic.Anthropic:
        return self._client(("anthropic", api_key), lambda: anthropic.Anthropic(
            base_url=self.base, api_key=api_key, max_retries=0))

    def gemini(self, api_key: str = "x", version: str = "v1beta",
               headers: dict[str, str] | None = None) -> genai.Client:
        options = genai_types.HttpOptions(base_url=self.base, api_version=version, headers=headers)
        key = ("gemini", api_key, version, tuple(sorted((headers or {}).items())))
        return self._client(key, lambda: genai.Client(api_key=api_key, http_options=options))


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    simulator = Simulator()
    port = asyncio.run_coroutine_threadsafe(simulator.start("127.0.0.1", 0), loop).result(timeout=5)
    server = Sim(f"http://127.0.0.1:{port}", port, simulator, httpx.Client())
    deadline = time.monotonic() + 5
    while True:
        try:
            if server.http.get(f"{server.base}/_sim/health").status_code == 200:
                break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
    yield server
    server.http.close()
    asyncio.run_coroutine_threadsafe(simulator.stop(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


def chat(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def sse_blocks(raw: bytes) -> list[str]:
    return [block for block in raw.decode().replace("\r\n", "\n").split("\n\n") if block]


def raw_chunked(port: int, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[bytes]:
    """POST over a bare socket and return the HTTP chunks exactly as framed."""
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: sim", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    _, _, rest = data.partition(b"\r\n\r\n")
    chunks = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return chunks
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


# --------------------------------------------------------------------------- plumbing


def test_it_answers_health_unknown_paths_and_model_lists(sim: Sim) -> None:
    assert sim.http.get(f"{sim.base}/_sim/health").status_code == 200
    missing = sim.http.post(f"{sim.base}/v2/nothing", json={})
    assert missing.status_code == 404
    assert "error" in missing.json()
    assert "sim-model" in [m.id for m in sim.openai().models.list()]
    # Anthropic shares the path; its anthropic-version header picks its shape.
    assert "claude-sonnet-4-5" in [m.id for m in sim.anthropic().models.list()]
    gemini_names = [m.name for m in sim.gemini().models.list()]
    assert "models/gemini-2.5-flash" in gemini_names


def test_it_keeps_connections_alive_and_accepts_chunked_bodies(sim: Sim) -> None:
    body = json.dumps({"model": "m", "messages": chat(f"{PROMPT} [sim tag=keepalive]")}).encode()
    with httpx.Client() as client:
        first = client.post(f"{sim.base}/v1/chat/completions", content=body)
        # A generator body goes out with Transfer-Encoding: chunked.
        second = client.post(f"{sim.base}/v1/chat/completions", content=iter([body[:10], body[10:]]))
        with client.stream("POST", f"{sim.base}/v1/chat/completions",
                           json={"model": "m", "stream": True, "messages": chat("[sim tag=keepalive]")}) as third:
            third.read()
    assert first.status_code == second.status_code == third.status_code == 200
    records = sim.records("keepalive")
    assert len(records) == 3
    assert records[1]["headers"]["transfer-encoding"] == "chunked"
    assert records[1]["body"]["messages"][0]["content"].endswith("[sim tag=keepalive]")
    assert len({r["peer"] for r in records}) == 1  # one TCP connection served all three


def test_it_records_auth_headers_and_clears_records(sim: Sim) -> None:
    sim.openai("sk-openai").chat.completions.create(model="m", messages=chat("[sim tag=auth-a]"))
    sim.anthropic("sk-ant").messages.create(model="c", max_tokens=9, messages=chat("[sim tag=auth-b]"))
    sim.gemini("goog-key").models.generate_content(model="g", contents="[sim tag=auth-c]")
    sim.http.post(f"{sim.base}/v1beta/models/g:generateContent?key=query-key",
                  json={"contents": [{"parts": [{"text": "[sim tag=auth-d]"}]}]})
    assert sim.record("auth-a")["headers"]["authorization"] == "Bearer sk-openai"
    assert sim.record("auth-b")["api_key"] == "sk-ant"
    assert sim.record("auth-c")["headers"]["x-goog-api-key"] == "goog-key"
    assert sim.record("auth-d")["query"] == {"key": "query-key"}
    assert sim.record("auth-d")["api_key"] == "query-key"
    assert sim.http.delete(f"{sim.base}/_sim/records").json()["deleted"] >= 4
    assert sim.records("auth-a") == []


def test_it_merges_directives_key_then_text_then_header(sim: Sim) -> None:
    client = sim.openai("sim:tokens=5,tag=merge-key,thinking=1")
    only_key = client.chat.completions.create(model="m", messages=chat("hi"))
    with_text = client.chat.completions.create(model="m", messages=chat("hi [sim tokens=4 tag=merge-text]"))
    with_header = client.chat.completions.create(model="m", messages=chat("hi [sim tokens=4 tag=merge-text2]"),
                                                 extra_headers={"x-sim": "tokens=2 tag=merge-header"})
    assert only_key.usage.completion_tokens == 5 + 1
    assert with_text.choices[0].message.content == expected_text(4)
    assert with_header.choices[0].message.content == expected_text(2)
    assert sim.record("merge-header")["directives"] == {"tokens": "2", "tag": "merge-header", "thinking": "1"}


# --------------------------------------------------------------------------- OpenAI Chat


def test_it_counts_words_as_tokens_not_characters(sim: Sim) -> None:
    prompt = f"{PROMPT} [sim tag=chat-plain cached=3]"
    reply = sim.openai().chat.completions.create(model="gpt-x", messages=[
        {"role": "system", "content": "Be brief"}, {"role": "user", "content": prompt}])
    text = reply.choices[0].message.content
    assert text == expected_text(12)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == 12 != len(text) // 4
    assert reply.usage.prompt_tokens == words_in("Be brief", prompt) == 12
    assert reply.usage.prompt_tokens != len("Be brief" + prompt) // 4
    assert reply.usage.prompt_tokens_details.cached_tokens == 3
    record = sim.record("chat-plain")
    assert (record["protocol"], record["model"], record["stream"], record["status"]) == ("chat", "gpt-x", False, 200)
    assert record["completed"] is True and record["tokens_sent"] == 12
    assert json.loads(base64.b64decode(record["sent_b64"]))["usage"]["completion_tokens"] == 12


def test_it_streams_chat_with_a_usage_chunk_only_when_asked(sim: Sim) -> None:
    client = sim.openai()
    chunks = list(client.chat.completions.create(
        model="m", stream=True, stream_options={"include_usage": True},
        messages=chat(f"{PROMPT} [sim tag=chat-usage id=abc created=1700000000]")))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected_text(12)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == 11
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {"chatcmpl-abc"} and chunks[0].created == 1700000000
    blocks = sse_blocks(sim.sent("chat-usage"))
    assert blocks[-1] == "data: [DONE]"
    assert all('"usage":null' in b for b in blocks[:-2])

    plain = list(client.chat.completions.create(model="m", stream=True, messages=chat("[sim tag=chat-nousage]")))
    assert all(c.choices for c in plain)
    assert plain[-1].choices[0].finish_reason == "stop"
    assert '"usage"' not in sim.sent("chat-nousage").decode()


def test_it_streams_chat_thinking_and_a_tool_call(sim: Sim) -> None:
    stream = sim.openai().chat.completions.create(
        model="m", stream=True, stream_options={"include_usage": True}, tools=[TOOL],
        messages=chat("[sim thinking=3 tokens=2 tool=1]"))
    reasoning, text, arguments, finish, usage = "", "", "", None, None
    fragments = 0
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        text += delta.content or ""
        for call in delta.tool_calls or []:
            arguments += call.function.arguments or ""
            fragments += bool(call.function.arguments)
            assert call.index == 0
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == expected_text(3, THINKING_WORDS)
    assert text == expected_text(2)
    assert json.loads(arguments) == {"city": "Paris", "unit": "celsius"} and fragments >= 3
    assert finish == "tool_calls"
    assert usage.completion_tokens == 5 and usage.completion_tokens_details.reasoning_tokens == 3

    whole = sim.openai().chat.completions.create(model="m", messages=chat("[sim thinking=3 tokens=0 tool=1]"))
    message = whole.choices[0].message
    assert message.content is None and message.model_extra["reasoning_content"] == expected_text(3, THINKING_WORDS)
    assert message.tool_calls[0].function.name == "get_weather"
    assert message.tool_calls[0].function.arguments == TOOL_ARGUMENTS
    assert whole.choices[0].finish_reason == "tool_calls" and whole.usage.completion_tokens == 3


# --------------------------------------------------------------------------- OpenAI Responses


def test_it_answers_responses_whole_and_streamed_alike(sim: Sim) -> None:
    client = sim.openai()
    prompt = f"{PROMPT} [sim thinking=2 tool=1 id=r1 created=1700000001 cached=2 tag=resp]"
    whole = client.responses.create(model="m", instructions="Be brief", input=prompt)
    assert whole.id == "resp_r1" and whole.status == "completed"
    assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output_text == expected_text(12)
    assert whole.output[0].summary[0].text == expected_text(2, THINKING_WORDS)
    assert whole.output[2].arguments == TOOL_ARGUMENTS and whole.output[2].call_id == "call_r1"
    assert whole.usage.input_tokens == words_in("Be brief", prompt)
    assert whole.usage.output_tokens == 14 and whole.usage.output_tokens_details.reasoning_tokens == 2
    assert whole.usage.input_tokens_details.cached_tokens == 2

    with client.responses.stream(model="m", instructions="Be brief", input=prompt) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected_text(12)
    assert sum(e.type == "response.function_call_arguments.delta" for e in events) >= 3
    assert final.output_text == whole.output_text and final.usage == whole.usage
    # The terminal event carries exactly the body a non-streaming call gets.
    whole_record, stream_record = sim.records("resp")
    completed = sse_blocks(base64.b64decode(stream_record["sent_b64"]))[-1]
    assert completed.startswith("event: response.completed\ndata: ")
    terminal = json.loads(completed.split("data: ", 1)[1])
    assert terminal["response"] == json.loads(base64.b64decode(whole_record["sent_b64"]))


# --------------------------------------------------------------------------- Anthropic


def test_it_answers_anthropic_whole_and_streamed_alike(sim: Sim) -> None:
    client = sim.anthropic()
    prompt = f"{PROMPT} [sim thinking=2 tool=1 id=a1 cached=3 cache_write=1 tag=ant]"
    kwargs: dict[str, Any] = {"model": "claude-x", "max_tokens": 2048, "system": "Be brief",
                              "messages": chat(prompt), "thinking": {"type": "enabled", "budget_tokens": 1024}}
    whole = client.messages.create(**kwargs)
    assert whole.id == "msg_a1" and whole.stop_reason == "tool_use"
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.content[0].thinking == expected_text(2, THINKING_WORDS) and whole.content[0].signature
    assert whole.content[1].text == expected_text(12)
    assert whole.content[2].input == {"city": "Paris", "unit": "celsius"}
    # Anthropic's input_tokens excludes cache reads and writes; together they are the prompt.
    prompt_words = words_in("Be brief", prompt)
    assert (whole.usage.input_tokens, whole.usage.cache_read_input_tokens, whole.usage.cache_creation_input_tokens) \
        == (prompt_words - 4, 3, 1)
    assert whole.usage.output_tokens == 14

    with client.messages.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.model_dump() == whole.model_dump()
    blocks = sse_blocks(base64.b64decode(sim.records("ant")[1]["sent_b64"]))
    assert blocks[1] == 'event: ping\ndata: {"type":"ping"}'
    start = json.loads(blocks[0].split("data: ", 1)[1])
    assert start["message"]["usage"]["output_tokens"] == 1  # message_delta's cumulative count replaces it


def test_it_answers_anthropic_text_only_by_default(sim: Sim) -> None:
    reply = sim.anthropic().messages.create(model="c", max_tokens=50, messages=chat(PROMPT))
    assert [b.type for b in reply.content] == ["text"] and reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens == 12 and reply.usage.input_tokens == 7


# --------------------------------------------------------------------------- Gemini


def test_it_answers_gemini_whole_and_streamed_alike(sim: Sim) -> None:
    client = sim.gemini()
    prompt = f"{PROMPT} [sim thinking=2 tool=1 id=g1 cached=2 tag=gem]"
    config = genai_types.GenerateContentConfig(system_instruction="Be brief")
    whole = client.models.generate_content(model="gemini-2.5-flash", contents=prompt, config=config)
    parts = whole.candidates[0].content.parts
    assert [bool(p.thought) for p in parts[:2]] == [True, False]
    assert parts[1].text == expected_text(12) and parts[0].text == expected_text(2, THINKING_WORDS)
    assert parts[2].function_call.name == "get_weather"
    assert parts[2].function_call.args == {"city": "Paris", "unit": "celsius"}
    usage = whole.usage_metadata
    assert usage.prompt_token_count == words_in("Be brief", prompt) and usage.cached_content_token_count == 2
    assert (usage.candidates_token_count, usage.thoughts_token_count) == (12, 2)
    assert usage.total_token_count == usage.prompt_token_count + 14
    assert whole.response_id == "g1" and whole.candidates[0].finish_reason == "STOP"

    chunks = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents=prompt, config=config))
    thoughts = "".join(p.text for c in chunks for p in c.candidates[0].content.parts if p.thought)
    text = "".join(p.text or "" for c in chunks for p in c.candidates[0].content.parts if not p.thought)
    assert (thoughts, text) == (expected_text(2, THINKING_WORDS), expected_text(12))
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    assert chunks[-1].usage_metadata.model_dump() == usage.model_dump()
    assert chunks[-1].candidates[0].content.parts[0].function_call.args == {"city": "Paris", "unit": "celsius"}
    records = sim.records("gem")
    assert records[1]["query"] == {"alt": "sse"} and records[1]["stream"] is True
    raw = base64.b64decode(records[1]["sent_b64"])
    assert raw.startswith(b"data: {") and raw.endswith(b"}\r\n\r\n") and b"\n\n" not in raw


def test_it_routes_gemini_v1_and_the_json_array_stream(sim: Sim) -> None:
    reply = sim.gemini(version="v1").models.generate_content(model="gemini-2.5-flash", contents="[sim tokens=3]")
    assert reply.text == expected_text(3)
    response = sim.http.post(f"{sim.base}/v1alpha/models/gemini-x:streamGenerateContent",
                          json={"contents": [{"role": "user", "parts": [{"text": "one two [sim tokens=2]"}]}]})
    assert response.headers["content-type"].startswith("application/json")
    assert re.fullmatch(rb"\[\{.*\}\n,\r\n\{.*\}\n,\r\n\{.*\}\n\]", response.content, re.S)
    chunks = response.json()
    assert [c["candidates"][0]["content"]["parts"][0]["text"] for c in chunks] == ["héllo", " world", ""]
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == 2
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] == 4


# --------------------------------------------------------------------------- HTTP errors


@pytest.mark.parametrize(("status", "error_class"), [
    (429, openai.RateLimitError), (529, openai.InternalServerError), (401, openai.AuthenticationError)])
def test_it_fails_openai_with_the_status_class(sim: Sim, status: int, error_class: type[Exception]) -> None:
    with pytest.raises(error_class) as caught:
        sim.openai(f"sim:status={status}").chat.completions.create(model="m", messages=chat("hi"), stream=True)
    assert caught.value.status_code == status and "simulated" in caught.value.message
    with pytest.raises(error_class):
        sim.openai().responses.create(model="m", input=f"[sim status={status}]")


@pytest.mark.parametrize(("status", "error_class", "error_type"), [
    (529, anthropic.OverloadedError, "overloaded_error"), (429, anthropic.RateLimitError, "rate_limit_error"),
    (500, anthropic.InternalServerError, "api_error"), (400, anthropic.BadRequestError, "invalid_request_error")])
def test_it_fails_anthropic_with_the_status_class(sim: Sim, status: int, error_class: type[Exception],
                                                    error_type: str) -> None:
    with pytest.raises(error_class) as caught:
        sim.anthropic(f"sim:status={status}").messages.create(model="c", max_tokens=5, messages=chat("hi"))
    assert caught.value.status_code == status
    assert caught.value.body["error"]["type"] == error_type
    assert "simulated" in caught.value.body["error"]["message"]


def test_it_fails_gemini_with_google_error_bodies(sim: Sim) -> None:
    with pytest.raises(genai_errors.ClientError) as caught:
        sim.gemini("sim:status=429").models.generate_content(model="g", contents="hi")
    assert (caught.value.code, caught.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert "simulated" in caught.value.message
    with pytest.raises(genai_errors.ServerError) as caught:
        list(sim.gemini().models.generate_content_stream(model="g", contents="[sim status=503]"))
    assert (caught.value.code, caught.value.status) == (503, "UNAVAILABLE")
    with pytest.raises(genai_errors.ClientError) as caught:
        sim.gemini("sim:status=400,reason=API_KEY_INVALID").models.generate_content(model="g", contents="hi")
    assert caught.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"


# --------------------------------------------------------------------------- in-stream failures


def test_it_raises_in_stream_errors_after_n_tokens(sim: Sim) -> None:
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in sim.openai().chat.completions.create(model="m", stream=True,
                                                          messages=chat("[sim error_after=3 tag=err-chat]")):
            received.append(chunk.choices[0].delta.content or "")
    assert not isinstance(caught.value, openai.APIStatusError) and caught.value.code == "server_error"
    assert "".join(received) == expected_text(3)
    assert sim.record("err-chat")["completed"] is False and sim.record("err-chat")["tokens_sent"] == 3

    text = ""
    with pytest.raises(anthropic.APIStatusError) as caught_a:
        with sim.anthropic().messages.stream(model="c", max_tokens=50,
                                             messages=chat("[sim error_after=2 error_kind=overloaded]")) as stream:
            for piece in stream.text_stream:
                text += piece
    assert caught_a.value.body["error"]["type"] == "overloaded_error" and text == expected_text(2)

    with pytest.raises(genai_errors.ServerError) as caught_g:
        for _ in sim.gemini().models.generate_content_stream(model="g", contents="[sim error_after=1]"):
            pass
    assert (caught_g.value.code, caught_g.value.status) == (500, "INTERNAL")
    with pytest.raises(genai_errors.ClientError) as caught_g:
        list(sim.gemini().models.generate_content_stream(model="g", contents="[sim error_after_preamble=overloaded]"))
    assert caught_g.value.code == 429

    # The Responses error event is yielded by the SDK, not raised; the stream then ends uncompleted.
    events = list(sim.openai().responses.create(model="m", stream=True,
                                                input="[sim error_after=2 error_kind=overloaded]"))
    assert events[-1].type == "error" and events[-1].code == "rate_limit_exceeded"
    assert events[-1].sequence_number == len(events) - 1
    assert sum(e.type == "response.output_text.delta" for e in events) == 2


def test_it_fails_right_after_the_preamble(sim: Sim) -> None:
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sim.anthropic().messages.stream(model="c", max_tokens=5,
                                             messages=chat("[sim error_after_preamble=server tag=pre-a]")) as s:
            list(s)
    assert caught.value.body["error"]["type"] == "api_error"
    kinds = [b.split("\n")[0] for b in sse_blocks(sim.sent("pre-a"))]
    assert kinds == ["event: message_start", "event: ping", "event: error"]
    chunks = []
    with pytest.raises(openai.APIError):
        for chunk in sim.openai().chat.completions.create(
                model="m", stream=True, messages=chat("[sim error_after_preamble=overloaded]")):
            chunks.append(chunk)
    assert [c.choices[0].delta.role for c in chunks] == ["assistant"]


def test_it_maps_failures_of_whole_answers_to_http_errors(sim: Sim) -> None:
    with pytest.raises(anthropic.OverloadedError):
        sim.anthropic().messages.create(model="c", max_tokens=5,
                                        messages=chat("[sim error_after=2 error_kind=overloaded]"))
    with pytest.raises(openai.APIConnectionError):
        sim.openai().chat.completions.create(model="m", messages=chat("[sim cut_after=2]"))


def test_it_cuts_the_connection_after_n_tokens(sim: Sim) -> None:
    text = ""
    # anthropic lets the transport's error through untranslated while iterating.
    with pytest.raises(httpx2.RemoteProtocolError, match="incomplete chunked read"):
        with sim.anthropic().messages.stream(model="c", max_tokens=50,
                                             messages=chat("[sim cut_after=3 tag=cut]")) as stream:
            for piece in stream.text_stream:
                text += piece
    assert text == expected_text(3)
    record = sim.record("cut")
    assert record["completed"] is False and record["tokens_sent"] == 3
    last = sse_blocks(base64.b64decode(record["sent_b64"]))[-1]
    assert json.loads(last.split("data: ", 1)[1])["delta"] == {"type": "text_delta", "text": " 日本語"}


def test_it_stalls_a_whole_answer_until_the_client_gives_up(sim: Sim) -> None:
    client = openai.OpenAI(base_url=f"{sim.base}/v1", api_key="x", max_retries=0, timeout=0.2)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="m", messages=chat("[sim stall_after=0 tag=stall-whole]"))
    record = sim.wait_record("stall-whole", lambda r: r["client_closed_at"] is not None)
    assert record["client_closed_at"] is not None and record["status"] is None and record["sent_b64"] == ""


def test_it_notices_when_a_stalled_client_hangs_up(sim: Sim) -> None:
    stream = sim.openai().chat.completions.create(model="m", stream=True,
                                                  messages=chat("[sim stall_after=2 tag=stall]"))
    received = ""
    for chunk in stream:
        received += chunk.choices[0].delta.content or ""
        if received == expected_text(2):
            break
    assert sim.record("stall")["client_closed_at"] is None
    closed_at = time.time()
    stream.close()
    record = sim.wait_record("stall", lambda r: r["client_closed_at"] is not None)
    assert record["client_closed_at"] is not None and record["client_closed_at"] - closed_at < 0.5
    assert record["tokens_at_close"] == 2 and record["completed"] is False


def test_it_notices_a_hang_up_during_a_pause_mid_event(sim: Sim) -> None:
    with httpx.Client() as client:
        with client.stream("POST", f"{sim.base}/v1/messages", headers={"x-sim": "pause_mid_event=30 tag=pause"},
                           json={"model": "c", "max_tokens": 5, "stream": True, "messages": chat("hi")}) as response:
            received = b""
            for piece in response.iter_raw():
                received += piece
                if b"event: content_block_delta" in received:
                    break
    assert not received.endswith(b"\n\n")  # we stopped in the middle of the first text event
    record = sim.wait_record("pause", lambda r: r["client_closed_at"] is not None)
    assert record["client_closed_at"] is not None and record["tokens_at_close"] == 0


def test_it_paces_tokens(sim: Sim) -> None:
    list(sim.openai().chat.completions.create(model="m", stream=True,
                                              messages=chat("[sim tokens=4 pace=0.05 first_delay=0.1 tag=pace]")))
    record = sim.record("pace")
    assert record["first_token_at"] - record["started_at"] >= 0.1
    assert record["finished_at"] - record["first_token_at"] >= 0.15


# --------------------------------------------------------------------------- split and CRLF


def test_it_splits_events_at_awkward_points_without_changing_the_bytes(sim: Sim) -> None:
    fixed = "[sim thinking=2 tool=1 id=s1 created=1700000002]"
    for mode, directives in (("split-off", "crlf=1"), ("split-on", "split=7 crlf=1")):
        def via(protocol: str) -> dict[str, str]:
            return {"x-sim": f"{directives} tag={mode}-{protocol}"}

        chat_stream = sim.openai().chat.completions.create(model="m", stream=True, messages=chat(fixed),
                                                           extra_headers=via("chat"))
        assert "".join(c.choices[0].delta.content or "" for c in chat_stream) == expected_text(12)
        with sim.openai().responses.stream(model="m", input=fixed, extra_headers=via("resp")) as stream:
            assert stream.get_final_response().output_text == expected_text(12)
        with sim.anthropic().messages.stream(model="c", max_tokens=50, messages=chat(fixed),
                                             extra_headers=via("ant")) as stream:
            assert stream.get_final_message().content[2].input == {"city": "Paris", "unit": "celsius"}
        chunks = list(sim.gemini(headers=via("gem")).models.generate_content_stream(model="g", contents=fixed))
        parts = [p for c in chunks for p in c.candidates[0].content.parts]
        assert "".join(p.text or "" for p in parts if not p.thought) == expected_text(12)
    for protocol in ("chat", "resp", "ant", "gem"):
        unsplit = sim.sent(f"split-off-{protocol}")
        assert b"\r\n\r\n" in unsplit and b"\n\n" not in unsplit
        assert sim.sent(f"split-on-{protocol}") == unsplit

    chunks = raw_chunked(sim.port, "/v1/messages", {"model": "c", "max_tokens": 5, "stream": True,
                                                    "messages": chat(fixed)}, {"x-sim": "split=7 crlf=1"})
    events = sse_blocks(b"".join(chunks))
    assert len(chunks) > len(events)

    def broken_utf8(piece: bytes) -> bool:
        try:
            piece.decode()
        except UnicodeDecodeError:
            return True
        return False

    assert any(broken_utf8(chunk) for chunk in chunks)
    assert any(a.endswith(b"\r") and b.startswith(b"\n") for a, b in zip(chunks, chunks[1:]))
    # Some chunk ends one event and starts the next.
    assert any(re.search(rb"\r\n\r\n.", chunk, re.S) for chunk in chunks)


# --------------------------------------------------------------------------- the command


def test_it_runs_as_a_management_command() -> None:
    manage = Path(__file__).resolve().parent.parent / "manage.py"
    process = subprocess.Popen([sys.executable, str(manage), "simulate_upstream", "--port", "0"],
                               stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(r"simulator listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, line
        assert httpx.get(f"{match.group(1)}/_sim/health").status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=5)
