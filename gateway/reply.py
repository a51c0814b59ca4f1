"""What the gateway answers an API request with: a whole body or a stream
of chunks, and HopBase's own errors in the caller's format (table E)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from core.errors import FINAL, GatewayError
from providers.base import Api

STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class Reply:
    """What the view sends: a whole body, or a stream of chunks."""

    status: int
    content_type: str
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # For a stream: what to do if it is dropped without ever being read,
    # and when its client falls too far behind (gateway.relay.backpressure).
    abandon: Callable[[], None] | None = None
    too_slow: Callable[[], None] | None = None


def error_reply(api: Api, error: GatewayError) -> Reply:
    """One of HopBase's own errors, in the API's format (table E)."""
    status, body = api.error_body(error)
    headers = {}
    if error.retry_after is not None:
        headers["retry-after"] = str(error.retry_after)
    if error.kind in FINAL:
        headers["x-should-retry"] = "false"
    return Reply(status, "application/json", body=body, headers=headers)
