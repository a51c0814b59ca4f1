"""Helpers shared by the gateway-level relay tests (test_relay_gateway.py,
test_run_gateway.py): requests through a running gateway, and what to look
for in what comes back."""

from __future__ import annotations

import json
import uuid

import httpx

from tests.support.wire import call

GENERIC_ERROR = "The model provider returned an error. Please retry."
STALLED = "Upstream stopped responding mid-stream"
INTERRUPTED = "Response stream interrupted, please retry"
TERMINALS = {
    "chat": b"data: [DONE]",
    "responses": b"event: response.completed",
    "messages": b"event: message_stop",
    "gemini": b'"finishReason"',
}


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def stream(gateway, protocol: str, key: str, model: str, prompt: str, **extra) -> httpx.Response:
    request = call(protocol, key, model, prompt, stream=True, **extra)
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        response = client.post(request.path, json=request.body, headers=request.headers)
    return response


def post(gateway, protocol: str, key: str, model: str, prompt: str, stream: bool = False, **extra) -> httpx.Response:
    request = call(protocol, key, model, prompt, stream=stream, **extra)
    return httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=30)


def client_events(body: bytes) -> list[bytes]:
    return [e for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def stream_errors(body: bytes) -> list[dict]:
    """The error objects among a stream's events (Responses' closing
    ``response.failed`` aside)."""
    found = []
    for event in client_events(body):
        for line in event.split(b"\n"):
            if line.startswith(b"data: ") and b'"error"' in line:
                data = json.loads(line[6:])
                if "error" in data and data.get("type") != "response.failed":
                    found.append(data)
    return found
