"""Raw requests to the gateway (and to the simulator), one shape per protocol,
for tests that care about exact bytes rather than what an SDK makes of them."""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from dataclasses import dataclass

import httpx

PROTOCOLS = ("chat", "responses", "messages", "gemini")
KEEPALIVE = {"chat": b": hopbase-keepalive\n\n", "responses": b": hopbase-keepalive\n\n", "messages": b": hopbase-keepalive\n\n"}


@dataclass
class Call:
    protocol: str
    path: str
    body: dict
    headers: dict[str, str]


def call(protocol: str, key: str, model: str, prompt: str, stream: bool = True, chat_usage: bool = True, **extra) -> Call:
    """A request in ``protocol``. Chat streams ask for usage unless told not
    to, so that the client's bytes and the channel's are the same (S2)."""
    if protocol == "chat":
        body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}]}
        if stream and chat_usage:
            body["stream_options"] = {"include_usage": True}
        body.update(extra)
        return Call(protocol, "/v1/chat/completions", body, {"authorization": f"Bearer {key}"})
    if protocol == "responses":
        body = {"model": model, "stream": stream, "input": prompt, **extra}
        return Call(protocol, "/v1/responses", body, {"authorization": f"Bearer {key}"})
    if protocol == "messages":
        body = {"model": model, "max_tokens": 512, "stream": stream, "messages": [{"role": "user", "content": prompt}]}
        return Call(protocol, "/v1/messages", {**body, **extra}, {"x-api-key": key, "anthropic-version": "2023-06-01"})
    if protocol == "gemini":
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": prompt}]}], **extra}
        return Call(protocol, f"/v1beta/models/{model}:{action}", body, {"x-goog-api-key": key})
    raise ValueError(protocol)


def channel_protocol(protocol: str) -> str:
    return {"chat": "openai", "responses": "openai", "messages": "anthropic", "gemini": "gemini"}[protocol]


def strip_keepalives(protocol: str, data: bytes) -> tuple[bytes, int]:
    """The stream without HopBase's keep-alive lines, and how many there were.
    Gemini's keep-alive is a bare LF; the simulator's Gemini streams use CRLF."""
    if protocol == "gemini":
        stripped, count = re.subn(rb"(?<!\r)\n", b"", data)
        return stripped, count
    keepalive = KEEPALIVE[protocol]
    return data.replace(keepalive, b""), data.count(keepalive)


def sent_bytes(record: dict) -> bytes:
    return base64.b64decode(record["sent_b64"])


def records(simulator_url: str, tag: str) -> list[dict]:
    return httpx.get(f"{simulator_url}/_sim/records", params={"tag": tag}).json()


def wait_for_records(simulator_url: str, tag: str, count: int = 1, closed: bool = False, timeout: float = 5) -> list[dict]:
    """Poll the simulator until it has recorded ``count`` requests for a tag
    (and, with ``closed``, seen the caller of the last one hang up)."""
    deadline = time.monotonic() + timeout
    while True:
        found = records(simulator_url, tag)
        done = len(found) >= count and (not closed or found[-1].get("client_closed_at") is not None)
        if done or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def wait_for_log(request_id: str, timeout: float = 5):
    """The RequestLog the gateway writes once a request has ended."""
    from billing.models import RequestLog

    deadline = time.monotonic() + timeout
    while True:
        row = RequestLog.objects.select_related("channel").filter(request_id=request_id).first()
        if row is not None or time.monotonic() > deadline:
            return row
        time.sleep(0.02)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def open_raw(port: int, request: Call, receive_buffer: int | None = None) -> socket.socket:
    """Send a request on a bare socket and hand it back, unread: for tests
    that watch the first byte or hang up at a chosen moment (or read slowly:
    ``receive_buffer`` keeps the kernel from taking much on its behalf)."""
    body = json.dumps(request.body).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"POST {request.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    return sock
