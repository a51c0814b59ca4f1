"""What HopBase changes in uvicorn, the server ``manage.py serve`` runs by
default (-> request), as serving.twisted_web does for Daphne: what the
server must do for the gateway that ASGI cannot say.

- A request body over ``HOPBASE_MAX_BODY_BYTES`` is refused while it is
  read (``HopBaseHttpTools``), the way serving.twisted_web refuses it
  under Daphne: a declared length at once, a chunked body as soon as what
  was read passes the limit. An API request is then handed on with no body
  and a Content-Length over the limit, so gateway.intake answers table E's
  413 in the caller's format; anything else gets a plain 413 here. What the
  client still sends is dropped unparsed; the answer carries ``Connection:
  close``, then the sending side is closed, and the connection
  ``LINGER_SECONDS`` later (closing at once, with unread data, would reset
  it over the answer). uvicorn itself never holds more than 64 KiB of a
  body the application has not taken (it pauses reading), and the API
  handler keeps at most the limit of it (serving.handler): a second line.
- A client that stops reading: uvicorn's ``send`` waits, before writing,
  while the connection's unsent bytes are over the transport's high-water
  mark. That mark is set to ``HOPBASE_MAX_UNSENT_BYTES``, so past it the
  stream learns it has fallen behind (gateway.relay.backpressure reads the
  transport's buffer) and ends with its interruption event, as under
  Daphne; what waits is bounded by the mark, plus one write.
- SIGTERM and SIGINT drain the process (rule D1, ``DrainingServer``): the
  socket keeps listening while requests in flight end and new ones are
  refused (503, ``/readyz`` too), and only then does uvicorn stop.
- A request's head is bounded in size and time (serving.request_heads):
  431 past 64 KiB, 408 when not complete within HOPBASE_HEAD_TIMEOUT.
- Anthropic's 529 goes out as ``529 Overloaded``, not with an empty reason.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn
from django.conf import settings
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from core import lifecycle, loggers
from serving import early_signals
from serving.lifecycle import shut_down
from serving.request_heads import HEAD_TIMED_OUT, HEAD_TOO_LARGE, MAX_HEAD_BYTES
from serving.twisted_web import LINGER_SECONDS, PLAIN_TOO_LARGE  # the same refusal under either server

log = logging.getLogger(loggers.UVICORN_WEB)

httptools_impl.STATUS_LINE[529] = b"HTTP/1.1 529 Overloaded\r\n"


class HopBaseHttpTools(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools), with the body limit, the
    head's bounds and the slow-client bound."""

    _body_read = 0
    _refused = False
    _in_head = True  # between requests, or inside a head not complete yet
    _head_bytes = 0
    _ends_seen = 0  # heads and messages that ended: a read during which one did is not all head
    _head_timer: asyncio.TimerHandle | None = None

    def _unsupported_upgrade_warning(self) -> None:
        # Not uvicorn's two warnings a request: the API handler answers a
        # WebSocket upgrade with 426 (serving.upgrades).
        pass

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=settings.HOPBASE_MAX_UNSENT_BYTES)
        self._head_timer = self.loop.call_later(settings.HOPBASE_HEAD_TIMEOUT, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # once refused, nothing more of this connection is parsed
            return
        if self._in_head and self._head_timer is None:
            self._head_timer = self.loop.call_later(settings.HOPBASE_HEAD_TIMEOUT, self._head_timed_out)
        ends_seen = self._ends_seen
        super().data_received(data)
        if self._in_head and self._ends_seen == ends_seen and not self.transport.is_closing():
            # No head or message ended in all of this, and no head is complete: every byte of it was head.
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._end_head(HEAD_TOO_LARGE, "over 64 KiB")

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._end_head(HEAD_TIMED_OUT, "not complete in time")

    def _end_head(self, answer: bytes, why: str) -> None:
        self._refused = True
        log.info("a request head was refused: %s (from %s)", why, self.client[0] if self.client else "?")
        self.transport.write(answer)
        # Closed at once, with the client's head still arriving, the connection could be reset over the answer.
        Lingering(self.transport, self.loop).close()

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._ends_seen += 1
        if not self._refused:
            super().on_message_complete()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._ends_seen += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        # A head that arrived in one read is measured whole here, before any request is made of it.
        if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > MAX_HEAD_BYTES:
            self._end_head(HEAD_TOO_LARGE, "over 64 KiB")
            return
        self._body_read = 0
        super().on_headers_complete()
        declared = declared_length(self.headers)
        if declared is not None and declared > settings.HOPBASE_MAX_BODY_BYTES and self.cycle is not None:
            self._refuse(f"declares {declared} bytes")

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_read += len(body)
        if self._body_read > settings.HOPBASE_MAX_BODY_BYTES:
            headers = [(name, value) for name, value in self.headers if name != b"content-length"]
            self.headers[:] = [*headers, (b"content-length", b"%d" % self._body_read)]
            self._refuse(f"passed {settings.HOPBASE_MAX_BODY_BYTES} bytes")
            return
        super().on_body(body)

    def _refuse(self, why: str) -> None:
        """The request, handed on with no body (an API path) or answered
        here with a plain 413; the connection closed once answered."""
        from serving.handler import API_PREFIXES

        self._refused = True
        cycle = self.cycle
        log.info("a request body over the limit was refused while read: it %s (from %s)", why,
                 self.client[0] if self.client else "?")
        cycle.transport = Lingering(self.transport, self.loop)  # type: ignore[assignment]
        cycle.waiting_for_100_continue = False  # the answer is the 413, not 100 Continue
        cycle.keep_alive = False
        cycle.body = bytearray()
        cycle.more_body = False
        self.flow.resume_reading()  # what still comes is read and dropped
        if not self.scope["path"].startswith(API_PREFIXES):
            cycle.disconnected = True  # the application's answer, if any, goes nowhere
            cycle.transport.write(PLAIN_TOO_LARGE)
            cycle.transport.close()
        cycle.message_event.set()


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isascii() and value.isdigit() else None
    return None


class Lingering:
    """A refused request's transport, as its cycle sees it: ``close()`` ends
    the sending side and closes the connection ``LINGER_SECONDS`` later,
    unless the client closed first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._transport.is_closing() or not self._transport.can_write_eof():
            self._transport.close()
            return
        self._transport.write_eof()
        self._loop.call_later(LINGER_SECONDS, self._transport.close)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining on SIGTERM or SIGINT before it stops
    (serving.lifecycle): uvicorn's own shutdown stops listening at once,
    and a connection queued on the socket would be reset. A second SIGINT
    stops at once."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Future[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if (sig := early_signals.pending()) is not None:
            self.handle_exit(sig, None)  # it came while starting (serving.early_signals): drain now

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Called by signal.signal, between two bytecodes of the loop's thread.
        if self._loop is None:
            self.should_exit = True  # not serving yet: nothing to drain
        elif self._drain is None:
            self._loop.call_soon_threadsafe(self._begin_drain)
        elif sig == signal.SIGINT:
            self.force_exit = True
            self.should_exit = True

    def _begin_drain(self) -> None:
        if self._drain is None:
            lifecycle.process.begin_drain()
            self._drain = asyncio.ensure_future(self._drained())

    async def _drained(self) -> None:
        try:
            await shut_down(lifecycle.process)
        finally:
            self.should_exit = True


def serve(application: Any, listener: socket.socket, keep_alive: float, backlog: int) -> None:
    """HopBase's ``application`` on ``listener`` (bound and listening), on
    uvloop with httptools, until drained."""
    # uvicorn's own lines (started, stopping) are not HopBase's: warnings only.
    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    config = uvicorn.Config(
        application,
        interface="asgi3",  # a plain function that returns what the server awaits (serving.handler)
        loop="uvloop",
        http=HopBaseHttpTools,
        ws="none",
        lifespan="off",  # Django has no lifespan handler
        log_config=None,  # Django's LOGGING, set up by hopbase.asgi
        access_log=False,  # HopBase logs each request itself; a line here would print Gemini's ?key=
        proxy_headers=False,  # the client's address is core.client_address's to decide (trusted proxies)
        server_header=False,
        backlog=backlog,  # the loop listens on the socket again, with this
        timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
        # After the drain (serving.lifecycle) only idle connections are left.
        timeout_graceful_shutdown=int(lifecycle.GRACE + lifecycle.UNWIND) + 1,
    )
    DrainingServer(config).run(sockets=[listener])
