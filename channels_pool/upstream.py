"""Talking to a channel: one pooled httpx client per process, and ``Attempt``,
one upstream request read by its own task into a queue.

The relay never awaits the httpx iterator directly: cancelling a
``wait_for`` around ``__anext__`` would close it. Reading in a separate task
lets the relay time keep-alives, stalls and the hold with plain queue waits,
and closing an attempt (cancelling its task) hangs up on the channel at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import anyio
import httpx
from django.conf import settings

log = logging.getLogger("hopbase.upstream")

from core.errors import UpstreamFailure
from core.sse import Event, EventSplitter

MAX_ERROR_BODY = 64 * 1024
RELEASE_GRACE_SECONDS = 5
# Response headers from the channel that a client's SDK reads (request ids);
# rate-limit headers describe HopBase's account and stay here.
PASSED_BACK_HEADERS = ("x-request-id", "request-id")


class _Signal:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


TIMEOUT = _Signal("TIMEOUT")  # nothing arrived in time
PROGRESS = _Signal("PROGRESS")  # bytes arrived, no complete event yet
END = _Signal("END")  # the channel closed its response normally
OPENED = _Signal("OPENED")  # the channel answered 200; its events follow

_clients: dict[int, httpx.AsyncClient] = {}


def client() -> httpx.AsyncClient:
    """The process's pooled client (one per event loop)."""
    loop_id = id(asyncio.get_running_loop())
    pooled = _clients.get(loop_id)
    if pooled is None:
        limit = settings.HOPBASE_UPSTREAM_MAX_CONNECTIONS
        pooled = httpx.AsyncClient(
            # No read timeout: long silences are the relay's to judge (hold,
            # slow start, stall), not the transport's.
            timeout=httpx.Timeout(connect=settings.HOPBASE_CONNECT_TIMEOUT, read=None, write=30, pool=settings.HOPBASE_CAPACITY_WAIT),
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit, keepalive_expiry=30),
            follow_redirects=False,
            trust_env=False,
        )
        _clients[loop_id] = pooled
    return pooled


def retry_after_seconds(headers: httpx.Headers) -> int | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0, int(float(value)))
    except ValueError:
        return None


def _set_if_waiting(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)


class Attempt:
    """One request to one channel. ``next()`` yields events in order, then END;
    or a signal; or an ``UpstreamFailure`` as the last item."""

    def __init__(self, channel: Any, url: str, headers: dict[str, str], content: bytes, protocol: Any) -> None:
        self.channel = channel
        self.ended = False  # set by the relay once it has let go of the attempt
        self.status: int | None = None
        self.response_headers: httpx.Headers | None = None
        self._protocol = protocol
        # What the pump read, in order; ``_wake`` is set when an item arrives
        # for a ``next()`` that is waiting. (A future and a timer per wait
        # cost far less than ``wait_for`` on a queue, which makes a task for
        # every event.)
        self._items: deque[Any] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._splitter = EventSplitter()
        self._events: deque[Event] = deque()
        # Hang-ups go through an anyio scope, not Task.cancel(): httpcore
        # cleans up under shielded anyio scopes, and a bare task cancellation
        # interrupts that cleanup, leaking the pooled connection.
        self._scope = anyio.CancelScope()
        self._task = asyncio.get_running_loop().create_task(self._pump(url, headers, content))

    async def _pump(self, url: str, headers: dict[str, str], content: bytes) -> None:
        with self._scope:
            try:
                await self._read(url, headers, content)
            except Exception:
                # Whatever broke, the relay must hear of it rather than wait
                # on a reader that is gone.
                log.exception("upstream read failed on channel %s", self.channel.name)
                self._put(UpstreamFailure("internal", self.status))

    async def _read(self, url: str, headers: dict[str, str], content: bytes) -> None:
        put = self._put
        http = client()
        # httpx asks for gzip by default; the relay splits raw bytes, so the
        # channel must send them uncompressed.
        request = http.build_request("POST", url, headers={**headers, "accept-encoding": "identity"}, content=content)
        try:
            response = await http.send(request, stream=True)
        except httpx.TimeoutException:
            put(UpstreamFailure("timeout"))
            return
        except httpx.HTTPError:
            put(UpstreamFailure("connect"))
            return
        try:
            self.status = response.status_code
            self.response_headers = response.headers
            if response.status_code == 200:
                put(OPENED)
            else:
                body = b""
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > MAX_ERROR_BODY:
                        break
                put(self._protocol.upstream_failure(response.status_code, body, retry_after_seconds(response.headers)))
                return
            async for chunk in response.aiter_raw():
                put(chunk)
            put(END)
        except httpx.HTTPError:
            put(UpstreamFailure("cut", self.status))
        finally:
            await response.aclose()

    def _put(self, item: Any) -> None:
        self._items.append(item)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def next(self, timeout: float) -> Any:
        if self._events:
            return self._events.popleft()
        if not self._items:
            if timeout <= 0:
                return TIMEOUT
            loop = asyncio.get_running_loop()
            self._wake = wake = loop.create_future()
            timer = loop.call_later(timeout, _set_if_waiting, wake)
            try:
                await wake
            finally:
                timer.cancel()
                self._wake = None
            if not self._items:
                return TIMEOUT
        item = self._items.popleft()
        if isinstance(item, bytes):
            events = self._splitter.feed(item)
            if not events:
                return PROGRESS
            self._events.extend(events)
            return self._events.popleft()
        if item is END:
            # A last event the channel never terminated with a blank line.
            rest = self._splitter.finish()
            if rest:
                self._items.appendleft(END)
                return rest[0]
        return item

    def passed_back_headers(self) -> dict[str, str]:
        found = self.response_headers or {}
        return {name: found[name] for name in PASSED_BACK_HEADERS if name in found}

    def close(self) -> None:
        """Hang up on the channel (no-op once the response has ended)."""
        if not self._task.done():
            self._scope.cancel()

    def release(self) -> None:
        """The terminal event is in: let the pump read the body's end so the
        connection goes back to the pool for reuse; hang up if it has not
        within a few seconds."""
        if not self._task.done():
            asyncio.get_running_loop().call_later(RELEASE_GRACE_SECONDS, self.close)
