"""Request bodies over HOPBASE_MAX_BODY_BYTES are refused while they are
read (serving.twisted_web under Daphne,
serving.uvicorn_web under uvicorn; every test under both): a declared length over the
limit at once, a chunked body as soon as what was read passes the limit;
the API answers the 413 as before (its key read, the refusal logged), and
the connection is closed. So a client can never make a gateway process hold
more of a body than the limit: a 100 MB body is sent slowly over a raw
socket while the process's memory is watched."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.drain_harness import ServeGroup, start_under
from tests.support.processes import SERVERS
from tests.support.wire import wait_for_log

LIMIT = 1024 * 1024  # the gateways' HOPBASE_MAX_BODY_BYTES here
HUGE = 100 * 1024 * 1024
PIECE = 64 * 1024
PACE = 16 * 1024 * 1024  # bytes a second: over 6 s for the whole body, were it all taken
# Every wait below is a hang detector, not a measurement.
WITHIN = 30.0
# What the process may grow by while a 100 MB body is sent: far below it.
MAX_GROWTH = 20 * 1024 * 1024
# Sent before the answer came: the limit, and what was on its way meanwhile.
MAX_SENT_BEFORE_ANSWER = LIMIT + 2 * 1024 * 1024

# Where each API is called, and how its table E 413 reads.
APIS = {
    "openai": ("/v1/chat/completions", "authorization", lambda body: body["error"]["type"] == "invalid_request_error"),
    "anthropic": (
        "/v1/messages",
        "x-api-key",
        lambda body: body["type"] == "error" and body["error"]["type"] == "request_too_large",
    ),
    "gemini": (
        "/v1beta/models/gemini-2.0-flash:generateContent",
        "x-goog-api-key",
        lambda body: body["error"]["status"] == "INVALID_ARGUMENT" and body["error"]["code"] == 413,
    ),
}


def too_large(api: str, body: dict) -> bool:
    return APIS[api][2](body)


@pytest.fixture(scope="module", params=SERVERS)
def gateway(world, request):
    """Daphne's (serving.twisted_web) and uvicorn's (serving.uvicorn_web)."""
    service = start_under(request.param, HOPBASE_MAX_BODY_BYTES=str(LIMIT))
    yield service
    service.stop()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class MemoryWatch:
    """The most a process's resident memory reached while watched."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(WITHIN)
        self.peak = max(self.peak, rss(self.pid))

    @property
    def growth(self) -> int:
        return self.peak - self.start


@dataclass
class Outcome:
    answer: bytes  # everything the gateway sent back
    sent: int  # body bytes the gateway took before it stopped taking them
    sent_before_answer: int | None  # body bytes sent when the answer's first bytes were seen
    closed: bool  # the gateway closed the connection

    @property
    def status(self) -> int:
        return int(self.answer.split(b" ", 2)[1])

    @property
    def headers(self) -> dict[str, str]:
        head = self.answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
        return {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in head)}

    @property
    def body(self) -> dict:
        content = self.answer.split(b"\r\n\r\n", 1)[1]
        if self.headers.get("transfer-encoding") == "chunked":
            content = dechunked(content)
        return json.loads(content)


def dechunked(content: bytes) -> bytes:
    parts = []
    while True:
        size, content = content.split(b"\r\n", 1)
        if int(size, 16) == 0:
            return b"".join(parts)
        parts.append(content[: int(size, 16)])
        content = content[int(size, 16) + 2 :]


def head(api: str, framing: str, key: str, length: int = HUGE) -> bytes:
    """A request's head, with a key that may use every model: what decides
    its answer is its body's size alone."""
    path, key_header, _ = APIS[api]
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json"]
    lines.append(f"{key_header}: Bearer {key}" if key_header == "authorization" else f"{key_header}: {key}")
    if api == "anthropic":
        lines.append("anthropic-version: 2023-06-01")
    lines.append(f"content-length: {length}" if framing == "length" else "transfer-encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def pieces(framing: str, total: int = HUGE) -> Iterator[bytes]:
    """The body, PIECE bytes at a time (a JSON string that never ends)."""
    data = b"x" * PIECE
    for index in range(total // PIECE):
        piece = b'{"messages": "' + data[14:] if index == 0 else data
        yield piece if framing == "length" else b"%x\r\n%s\r\n" % (len(piece), piece)
    if framing == "chunked":
        yield b"0\r\n\r\n"


def send_slowly(port: int, request_head: bytes, body: Iterator[bytes], reading: bool = True) -> Outcome:
    """Send the body at PACE, until it is all sent or the gateway stops
    taking it (a client that does not give up when answered). With
    ``reading``, what the gateway answers is read between pieces, else only
    once sending is over (as HTTP clients do). Then the rest of the answer
    is read, until the gateway closes the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    answer, sent, sent_before_answer, ended = b"", 0, None, False
    deadline = time.monotonic() + WITHIN
    started = time.monotonic()

    def read() -> None:
        nonlocal answer, sent_before_answer, ended
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            ended = True
        elif not answer:
            sent_before_answer = sent
        answer += data

    try:
        sock.sendall(request_head)
        for piece in body:
            assert time.monotonic() < deadline, "the body was still being taken"
            while reading and not ended and select.select([sock], [], [], 0)[0]:
                read()
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break  # the gateway stopped taking the body
            sent += len(piece)
            # Paced: the time the bytes sent so far should have taken.
            ahead = started + sent / PACE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        while not ended and time.monotonic() < deadline:
            try:
                read()
            except TimeoutError:
                break  # still open
    finally:
        sock.close()
    return Outcome(answer, sent, sent_before_answer, ended)


def warm_up(gateway, key: str) -> None:
    """A first refusal, so that what a refusal imports or caches is in the
    process before its memory is watched."""
    request = head("openai", "length", key, length=LIMIT + 1).replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")
    outcome = send_slowly(gateway.port, request, iter([b"x" * (LIMIT + 1)]))
    assert outcome.answer.startswith(b"HTTP/1.1 413 "), outcome.answer[:300]


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize(
    ("framing", "api", "reading"),
    [("length", "openai", True), ("chunked", "anthropic", True), ("length", "gemini", True), ("chunked", "openai", False)],
    ids=["length-openai", "chunked-anthropic", "length-gemini", "chunked-read-after-sending"],
)
def test_a_100_mb_body_sent_slowly_is_refused_while_it_is_read(gateway, world, framing, api, reading):
    warm_up(gateway, world.key)
    with MemoryWatch(gateway.serving_pid) as memory:
        outcome = send_slowly(gateway.port, head(api, framing, world.key), pieces(framing), reading)

    assert outcome.answer.startswith(b"HTTP/1.1 413 "), outcome.answer[:300]
    if reading:
        # Answered while the body was being sent: at once for a declared
        # length, as soon as the limit was passed for a chunked one.
        assert outcome.sent_before_answer is not None and outcome.sent_before_answer < MAX_SENT_BEFORE_ANSWER, outcome
        if framing == "chunked":
            assert outcome.sent_before_answer >= LIMIT - PIECE
    # Then, though the client went on sending, the connection was closed
    # long before the body could be sent (and the answer was still read).
    assert outcome.closed
    assert outcome.sent < HUGE // 2, outcome.sent
    assert memory.growth < MAX_GROWTH, f"the gateway grew by {memory.growth / 2**20:.1f} MiB"
    # Table E's 413, in the caller's format, from the API: its key was read,
    # and the refusal logged (P8).
    assert too_large(api, outcome.body), outcome.body
    assert outcome.headers["connection"] == "close"
    assert outcome.headers["x-should-retry"] == "false"
    assert wait_for_log(outcome.headers["x-hopbase-request-id"]).status == "rejected"


@pytest.mark.gateway
def test_an_over_long_declared_body_gets_no_100_continue_only_the_413(gateway, world):
    request = head("openai", "length", world.key).replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n")
    outcome = send_slowly(gateway.port, request, iter(()))
    assert outcome.answer.startswith(b"HTTP/1.1 413 "), outcome.answer[:300]
    assert b"100 Continue" not in outcome.answer
    assert outcome.closed


@pytest.mark.gateway
def test_an_over_long_body_with_an_unknown_key_is_answered_as_before_401(gateway):
    """The API reads the key first, as it always has (now at once, not after
    the body)."""
    outcome = send_slowly(gateway.port, head("anthropic", "length", "hb-nobody"), iter(()))
    assert outcome.answer.startswith(b"HTTP/1.1 401 "), outcome.answer[:300]
    assert outcome.closed


@pytest.mark.gateway
def test_an_over_long_body_off_the_api_gets_a_plain_413(gateway):
    request = b"POST /admin/login/ HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: %d\r\n\r\n" % HUGE
    outcome = send_slowly(gateway.port, request, iter(()))
    assert outcome.answer.startswith(b"HTTP/1.1 413 "), outcome.answer[:300]
    assert outcome.answer.endswith(b"\r\n\r\nRequest body too large.\n")
    assert outcome.closed


@pytest.mark.gateway
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_within_the_limit_is_still_read_and_served(gateway, world, framing):
    """Up to the limit, bodies reach the API as before (here: a model that
    does not exist, found out once the body was read)."""
    body = b'{"model": "no-such-model", "messages": [{"role": "user", "content": "' + b"x" * (LIMIT - 100) + b'"}]}'
    assert len(body) <= LIMIT
    chunks = iter([body if framing == "length" else b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)])
    request = head("openai", framing, world.key, length=len(body)).replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")
    outcome = send_slowly(gateway.port, request, chunks)
    assert outcome.status == 404, outcome.answer[:300]
    assert outcome.body["error"]["code"] == "model_not_found"


@pytest.mark.gateway
@pytest.mark.parametrize("server", SERVERS)
def test_serve_workers_refuse_an_over_long_body_at_once(world, server):
    """``manage.py serve``'s workers, uvicorn's or Daphne's: the same
    refusal, before a byte of the body is sent."""
    group = ServeGroup(workers=2, server=server, HOPBASE_MAX_BODY_BYTES=str(LIMIT))
    try:
        for _ in range(16):  # the kernel spreads connections over the workers
            started = time.monotonic()
            outcome = send_slowly(group.port, head("anthropic", "length", world.key), iter(()))
            assert outcome.answer.startswith(b"HTTP/1.1 413 "), outcome.answer[:300]
            assert too_large("anthropic", outcome.body)
            assert outcome.closed and time.monotonic() - started < 5
    finally:
        group.stop()
