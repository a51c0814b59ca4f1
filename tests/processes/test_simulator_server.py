"""The simulator's server, checked with the official SDKs the gateway's clients use.

Routing, keep-alive and chunked bodies, the records it keeps, how directives
merge, and the failures it orders (in-stream errors, stalls, cut connections,
hang-ups, pacing, awkward splits): each checked for what the SDKs see and for
the bytes the simulator recorded. No database is touched.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from google.genai import errors as genai_errors

from tests.support.simulator_harness import PROMPT, Sim, chat, expected_text, serving, sse_blocks
from tests.support.wire import read_until_closed


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    with serving() as server:
        yield server


def raw_chunked(port: int, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[bytes]:
    """POST over a bare socket and return the HTTP chunks exactly as framed."""
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: sim", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        data = read_until_closed(sock)
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
    manage = Path(__file__).resolve().parents[2] / "manage.py"
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
