"""What HopBase changes in the Twisted web server and reactor under
Daphne, for every request it serves (-> request). Each change is a no-op
where Twisted or Daphne is not installed (the test client, management
commands)."""

from __future__ import annotations

import functools
import io
import logging
from typing import Any
from urllib.parse import unquote

from django.conf import settings

from core import loggers
from serving import upgrades
from serving.request_heads import HEAD_TIMED_OUT, HEAD_TOO_LARGE, MAX_HEAD_BYTES

log = logging.getLogger(loggers.TWISTED_WEB)

# After a body is refused: how long what the client still sends is read and
# dropped, so that it reads the 413 before the connection is closed.
LINGER_SECONDS = 2.0
PLAIN_TOO_LARGE = (
    b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 24\r\nConnection: close\r\n\r\nRequest body too large.\n"
)
_http: Any = None  # twisted.web.http, once the body limit is in place


def adjust() -> None:
    name_statuses()
    refuse_websocket_upgrades()
    bound_request_heads()
    limit_request_bodies()
    remember_content_types()
    skip_twisted_access_lines()
    call_sockets_without_log_context()


def name_statuses() -> None:
    """Daphne takes a response's reason phrase from Twisted (ASGI carries
    none), whose table lacks 429 and Anthropic's 529: they would go out as
    ``Unknown Status``."""
    try:
        from twisted.web import http as twisted_http
    except ImportError:
        return
    twisted_http.RESPONSES.setdefault(426, b"Upgrade Required")
    twisted_http.RESPONSES.setdefault(429, b"Too Many Requests")
    twisted_http.RESPONSES.setdefault(529, b"Overloaded")


def refuse_websocket_upgrades() -> None:
    """Daphne hands every WebSocket upgrade to its WebSocket protocol, which
    can refuse one only with a 403 (which clients retry): HopBase serves no
    WebSocket, so each is answered 426 before it is handed on
    (serving.upgrades)."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:
        return
    process = WebRequest.process

    def process_unless_an_upgrade(request) -> None:
        headers = [(name.lower(), value) for name, values in request.requestHeaders.getAllRawHeaders()
                   for value in values]
        if not upgrades.wants_websocket(headers):
            process(request)
            return
        request.channel.persistent = False  # a client that asked to upgrade is not kept
        for message in upgrades.ANSWER:
            request.handle_reply(message)

    WebRequest.process = process_unless_an_upgrade


def remember_content_types() -> None:
    """Twisted parses every POST's Content-Type with the email package (to
    decode form submissions, which Daphne never reads): about 0.1 ms a
    request, for the same few values over and over. The answer depends on
    the header's bytes alone, so recent ones are remembered."""
    try:
        from twisted.web import http as twisted_http
    except ImportError:
        return
    parse = twisted_http._parseContentType
    if not hasattr(parse, "cache_info"):
        twisted_http._parseContentType = functools.lru_cache(maxsize=64)(parse)


def skip_twisted_access_lines() -> None:
    """Twisted's HTTP factory formats a combined-log line for every request
    into Twisted's global log, beside Daphne's own access log (its
    ``--access-log``, written by Daphne, which this leaves alone). Daphne
    discards Twisted's log at its default verbosity and copies it into the
    ``daphne.server`` logger above that, so the line was either thrown away
    or a second access log: about 2 % of a request's CPU either way."""
    try:
        from daphne.http_protocol import HTTPFactory
    except ImportError:
        return
    HTTPFactory.log = _no_access_line


def _no_access_line(factory: object, request: object) -> None:
    """Twisted's ``HTTPFactory.log``, for Daphne's factory: nothing."""


def call_sockets_without_log_context() -> None:
    """Twisted's asyncio reactor calls a socket's ``doRead``/``doWrite``
    through ``callWithLogger``, which asks the socket for its log prefix and
    sets it as the ``system`` of Twisted's legacy log context for the call:
    about 0.7 % of a request's CPU, for a prefix that only tags Twisted's
    own log lines (which Daphne discards at its default verbosity). The
    reactor's ``_readOrWrite`` still logs a failure and drops the socket."""
    try:
        from twisted.internet import asyncioreactor
    except ImportError:
        return
    asyncioreactor.callWithLogger = _call_without_log_context


def _call_without_log_context(selectable: object, method, *args):
    """``callWithLogger`` for the reactor's ``_readOrWrite``: the call alone."""
    return method(*args)


def limit_request_bodies() -> None:
    """Twisted reads a request's whole body (in memory, or a temporary file
    past 100 kB) before Daphne sees the request, and Daphne then puts all of
    it on the application's queue at once: a client could make a process
    hold any amount. Here a body over ``HOPBASE_MAX_BODY_BYTES`` is refused
    while it is read: a declared length over it at once, before the body
    (and without a ``100 Continue``); a chunked body as soon as what was read
    passes it, what was kept dropped. A request to the API is then handed on
    with no body and a Content-Length over the limit (a chunked one's: what
    was read), so the API answers it as it always has (gateway.intake: table
    E's 413 in the caller's format, once its key is read, logged like any
    refusal, P8); anything else gets a plain 413 here. What the client still
    sends is read and dropped. The answer goes out with ``Connection:
    close``, then the connection's sending side is closed, and LINGER_SECONDS
    later the connection (closing at once, with unread data, would reset it
    over the answer). So a request holds at most the limit, plus one read.
    HTTP/2 (Daphne over TLS with h2 installed, not HopBase's shape) is left
    as it was: the API's own checks stay, a second line."""
    global _http
    try:
        from daphne.http_protocol import WebRequest
        from twisted.web import http
    except ImportError:
        return
    _http = http
    WebRequest.gotLength = _got_length
    WebRequest.handleContentChunk = _handle_content_chunk
    WebRequest.requestReceived = _request_received
    WebRequest.hopbase_body_read = 0
    WebRequest.hopbase_refused = False


def _got_length(request, length: int | None) -> None:
    """``Request.gotLength``: the headers are in, and the declared length
    (None when chunked)."""
    if length is not None and length > settings.HOPBASE_MAX_BODY_BYTES and _over_http1(request):
        request.content = io.BytesIO()
        _refuse(request, f"declares {length} bytes")
        return
    _http.Request.gotLength(request, length)


def _handle_content_chunk(request, data: bytes) -> None:
    """``Request.handleContentChunk``: the next part of the body, counted."""
    if request.hopbase_refused:
        return
    request.hopbase_body_read += len(data)
    if request.hopbase_body_read > settings.HOPBASE_MAX_BODY_BYTES and _over_http1(request):
        request.content.close()
        request.content = io.BytesIO()
        request.requestHeaders.setRawHeaders(b"content-length", [b"%d" % request.hopbase_body_read])
        _refuse(request, f"passed {settings.HOPBASE_MAX_BODY_BYTES} bytes")
        return
    _http.Request.handleContentChunk(request, data)


def _request_received(request, command: bytes, path: bytes, version: bytes) -> None:
    """``Request.requestReceived``, which the channel calls when the body
    ends: a refused request was handed on (or answered) already."""
    if not request.hopbase_refused:
        _http.Request.requestReceived(request, command, path, version)


def _over_http1(request) -> bool:
    return isinstance(request.channel, _http.HTTPChannel) and request.channel.transport is not None


def _refuse(request, why: str) -> None:
    from serving.handler import API_PREFIXES

    request.hopbase_refused = True
    request.requestHeaders.removeHeader(b"expect")  # the answer is the 413, not 100 Continue
    channel = request.channel
    # Nothing more of this connection is parsed: what comes is dropped.
    channel.dataReceived = channel.rawDataReceived = channel.lineReceived = _drop
    channel.persistent = False  # once answered, the channel calls loseConnection
    channel.writeHeaders = functools.partial(_write_headers_closing, channel)
    channel.loseConnection = functools.partial(_close_after_answer, channel)
    peer = getattr(channel.transport.getPeer(), "host", "?")
    log.info("a request body over the limit was refused while read: it %s (from %s)", why, peer)
    if unquote(channel._path.decode("latin-1")).startswith(API_PREFIXES):
        _http.Request.requestReceived(request, channel._command, channel._path, channel._version)
    else:
        channel.transport.write(PLAIN_TOO_LARGE)
        channel.loseConnection()


def bound_request_heads() -> None:
    """Twisted answers a head over 16 KiB with a plain 400 and lets a
    half-sent head wait for as long as the channel's idle time-out (hours
    under Daphne, and any byte resets it). Here, as under uvicorn
    (serving.request_heads): 431 past 64 KiB, a line or the whole head, and
    408 when the head is not complete within HOPBASE_HEAD_TIMEOUT of its
    first byte (or of the connection)."""
    try:
        from twisted.web import http as twisted_http
    except ImportError:
        return
    channel = twisted_http.HTTPChannel
    if getattr(channel, "hopbase_heads_bounded", False):
        return
    channel.hopbase_heads_bounded = True
    channel.totalHeadersSize = MAX_HEAD_BYTES
    channel.MAX_LENGTH = MAX_HEAD_BYTES  # one line of it (LineReceiver's own limit)
    channel.hopbase_head_timer = None
    line_received, data_received = channel.lineReceived, channel.dataReceived
    connection_made, connection_lost = channel.connectionMade, channel.connectionLost
    all_headers_received = channel.allHeadersReceived

    def lineReceived(self, line: bytes) -> None:  # noqa: N802 (Twisted's names)
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            _end_head(self, HEAD_TOO_LARGE, "over 64 KiB")
            return
        line_received(self, line)

    def lineLengthExceeded(self, line: bytes) -> None:  # noqa: N802
        _end_head(self, HEAD_TOO_LARGE, "a line over 64 KiB")

    def dataReceived(self, data: bytes) -> None:  # noqa: N802
        if self.hopbase_head_timer is None and self._HTTPChannel__first_line:  # a head begins
            _start_head_timer(self)
        data_received(self, data)

    def allHeadersReceived(self) -> None:  # noqa: N802
        _stop_head_timer(self)
        all_headers_received(self)

    def connectionMade(self) -> None:  # noqa: N802
        connection_made(self)
        _start_head_timer(self)

    def connectionLost(self, reason: object) -> None:  # noqa: N802
        _stop_head_timer(self)
        connection_lost(self, reason)

    channel.lineReceived, channel.lineLengthExceeded, channel.dataReceived = (
        lineReceived, lineLengthExceeded, dataReceived)
    channel.allHeadersReceived, channel.connectionMade, channel.connectionLost = (
        allHeadersReceived, connectionMade, connectionLost)


def _start_head_timer(channel) -> None:
    from twisted.internet import reactor

    channel.hopbase_head_timer = reactor.callLater(settings.HOPBASE_HEAD_TIMEOUT, _head_timed_out, channel)


def _stop_head_timer(channel) -> None:
    timer, channel.hopbase_head_timer = channel.hopbase_head_timer, None
    if timer is not None and timer.active():
        timer.cancel()


def _head_timed_out(channel) -> None:
    channel.hopbase_head_timer = None
    if channel.transport is not None:
        _end_head(channel, HEAD_TIMED_OUT, "not complete in time")


def _end_head(channel, answer: bytes, why: str) -> None:
    """Answer a head refused before any request was made of it, and close."""
    _stop_head_timer(channel)
    channel.dataReceived = channel.lineReceived = _drop  # nothing more of it is parsed
    peer = getattr(channel.transport.getPeer(), "host", "?")
    log.info("a request head was refused: %s (from %s)", why, peer)
    channel.transport.write(answer)
    # Closed at once, with the client's head still arriving, the connection could be reset over the answer.
    _linger(channel.transport)


def _drop(*args: object) -> None:
    """What a refused request's connection does with what it still receives."""


def _write_headers_closing(channel, version: bytes, code: bytes, reason: bytes, headers) -> None:
    """``HTTPChannel.writeHeaders`` for a refused request's answer."""
    if not headers.hasHeader(b"connection"):
        headers.setRawHeaders(b"connection", [b"close"])
    _http.HTTPChannel.writeHeaders(channel, version, code, reason, headers)


def _close_after_answer(channel) -> None:
    """``HTTPChannel.loseConnection`` for a refused request's connection:
    the answer, then the end of what is sent, then (LINGER_SECONDS later,
    unless the client closed first) the connection."""
    channel._networkProducer.unregisterProducer()
    _linger(channel.transport)


def _linger(transport) -> None:
    """End what is sent, then the connection LINGER_SECONDS later (unless
    the client closed first), so that the client reads the answer before
    what it still sends is refused."""
    from twisted.internet import reactor

    try:
        transport.loseWriteConnection()
    except (AttributeError, NotImplementedError):
        transport.loseConnection()
        return
    reactor.callLater(LINGER_SECONDS, transport.loseConnection)
