"""Request heads are bounded under either server, with nothing in front:
a head over 64 KiB is answered 431 and closed; one not
complete in HOPBASE_HEAD_TIMEOUT is answered 408 and closed, whether it
sent part of a head or nothing; an ordinary large head still passes."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.drain_harness import start_under
from tests.support.processes import SERVERS
from tests.support.wire import read_until_closed

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("world")]

HEAD_TIMEOUT = 1.0
WITHIN = 10.0  # every read below ends by then


@pytest.fixture(params=SERVERS, scope="module")
def bounded(request, world):
    gateway = start_under(request.param, HOPBASE_HEAD_TIMEOUT=str(HEAD_TIMEOUT))
    yield gateway
    gateway.stop()


def connected(gateway) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=WITHIN)
    return sock


def head(extra: bytes) -> bytes:
    return b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer hb-nope\r\n" + extra


def test_a_head_over_64_kib_is_431_and_closed(bounded):
    sock = connected(bounded)
    try:
        filler = b"".join(b"X-Filler-%d: %s\r\n" % (n, b"a" * 1000) for n in range(70))  # 70 KB of headers
        sock.sendall(head(filler))  # never finished: the size alone decides
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_one_header_line_over_64_kib_is_431_and_closed(bounded):
    sock = connected(bounded)
    try:
        sock.sendall(head(b"X-Long: " + b"a" * (70 * 1024) + b"\r\n\r\n"))
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


@pytest.mark.parametrize("sent", [b"", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"], ids=["nothing", "half-a-head"])
def test_a_head_not_complete_in_time_is_408_and_closed(bounded, sent):
    sock = connected(bounded)
    started = time.monotonic()
    try:
        sock.sendall(sent)
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert HEAD_TIMEOUT * 0.9 <= time.monotonic() - started < WITHIN


def test_a_large_head_under_the_bound_is_served(bounded):
    sock = connected(bounded)
    try:
        filler = b"".join(b"X-Filler-%d: %s\r\n" % (n, b"a" * 1000) for n in range(40))  # 40 KB
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + filler + b"\r\n")
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
