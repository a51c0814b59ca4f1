"""A WebSocket upgrade, which HopBase does not serve, is answered 426 under
either server (table E), so that a client offered OpenAI's Responses over
WebSocket (Codex) falls back to HTTP at once instead of retrying; HTTP on
the same connection's path is served as before."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.support.drain_harness import start_under
from tests.support.processes import SERVERS
from tests.support.wire import read_until_closed

pytestmark = [pytest.mark.gateway]

WITHIN = 10.0


@pytest.fixture(params=SERVERS, scope="module")
def gateway(request, world):
    gateway = start_under(request.param)
    yield gateway
    gateway.stop()


def upgrade(gateway, path: str, key: str) -> bytes:
    """A WebSocket upgrade as Codex sends it, and everything answered until the server closes."""
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=WITHIN)
    try:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            f"Authorization: Bearer {key}\r\nOpenAI-Beta: responses_websockets=2026-02-06\r\n\r\n".encode()
        )
        return read_until_closed(sock)
    finally:
        sock.close()


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions", "/v1/models"])
def test_an_upgrade_is_426_with_an_openai_error_and_closed(gateway, world, path):
    answer = upgrade(gateway, path, world.key)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 426 "), head
    assert json.loads(body)["error"]["code"] == "websocket_not_supported"


def test_http_is_served_beside_it(gateway, world):
    upgrade(gateway, "/v1/responses", world.key)
    answer = httpx.get(f"http://127.0.0.1:{gateway.port}/v1/models", headers={"authorization": f"Bearer {world.key}"},
                       timeout=WITHIN)
    assert answer.status_code == 200 and answer.json()["object"] == "list"
