"""A WebSocket upgrade HopBase does not serve, refused with 426 under either
server (table E).

Clients that can fall back to HTTP take a 426 as "not here, use HTTP" and
do so at once: Codex, offered OpenAI's Responses over WebSocket, switches
to HTTP for the rest of its session, where a 403, 404 or 405 makes it
retry five times first (several seconds, every session). The answer is
written by the server adapters before any application code runs (under
uvicorn, which has no WebSocket library configured, the request reaches
the API handler as plain HTTP; under Daphne it never reaches it), so it
is one fixed answer, in OpenAI's error shape: WebSocket mode is OpenAI's.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

STATUS = 426
BODY = orjson.dumps({"error": {
    "message": "WebSocket connections are not served here: send the request over HTTP.",
    "type": "invalid_request_error", "param": None, "code": "websocket_not_supported",
}})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode()),
           (b"connection", b"close")]
# The answer as ASGI messages, which either adapter sends as they are.
ANSWER = (
    {"type": "http.response.start", "status": STATUS, "headers": HEADERS},
    {"type": "http.response.body", "body": BODY},
)


def wants_websocket(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request's headers (lower-case names) ask to upgrade to a WebSocket."""
    return any(name == b"upgrade" and value.strip().lower() == b"websocket" for name, value in headers)
