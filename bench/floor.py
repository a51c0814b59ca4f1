"""The floor HopBase is held against (issue 13): a bare relay under Daphne.

Each POST is forwarded to ``BENCH_FLOOR_UPSTREAM`` + its path with httpx over
aiohttp's transport, the answer's status, content type and bytes passed back
as they arrive. No keys, no accounting, no hold: what any gateway on this
stack must spend. ``daphne -v 0 bench.floor:application``.
"""

import os

import httpx
from httpx_aiohttp import AiohttpTransport

UPSTREAM = os.environ.get("BENCH_FLOOR_UPSTREAM", "http://127.0.0.1:8901")
# Upstream connections at once: raised for a burst of streams held open, as
# the gateway's own pool is (HOPBASE_UPSTREAM_MAX_CONNECTIONS).
MAX_CONNECTIONS = int(os.environ.get("BENCH_FLOOR_MAX_CONNECTIONS", "1000"))
FORWARDED = (b"authorization", b"content-type", b"x-api-key", b"anthropic-version")
clients: dict[int, httpx.AsyncClient] = {}


async def application(scope, receive, send):
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS)
    http = clients.get(0) or clients.setdefault(0, httpx.AsyncClient(
        transport=AiohttpTransport(limits=limits), timeout=httpx.Timeout(30, read=None)))
    headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in FORWARDED}
    request = http.build_request(scope["method"], UPSTREAM + scope["path"], headers=headers, content=body)
    response = await http.send(request, stream=True)
    try:
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": [(b"content-type", response.headers.get("content-type", "").encode())]})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.aclose()
