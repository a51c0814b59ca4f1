"""The HTTP client the gateway builds once per process to talk to channels
(-> channels_pool.upstream): httpx's API over aiohttp's transport, with the
gateway's limits and none of a browser's habits (cookies, redirects,
proxies from the environment)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import httpx
import yarl
from aiohttp.client_proto import ResponseHandler
from django.conf import settings
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import AiohttpResponseStream, map_aiohttp_exceptions


class _NoCookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        pass


_NO_COOKIES = _NoCookies()


class UpstreamClient(httpx.AsyncClient):
    """A provider's cookies are no business of the gateway's: one tenant's
    answer must not set what another tenant's request carries (and reading
    them cost a few percent of the CPU per request)."""

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, value: object) -> None:
        pass


def new_client() -> httpx.AsyncClient:
    """A pooled client for one event loop, with the gateway's limits.

    httpx's API over aiohttp's transport (``httpx-aiohttp``, as
    ``UpstreamTransport``): aiohttp parses
    HTTP in C, where httpcore and h11 spend about half the gateway's CPU per
    relayed event in Python. The transport builds its own aiohttp session
    from ``limits`` (it would ignore them if handed a session): at most
    ``max_connections`` open, idle ones kept ``keepalive_expiry`` seconds,
    a wait for a free one bounded by the ``pool`` timeout plus the
    ``connect`` timeout (aiohttp bounds the two together). aiohttp has no
    write timeout; a request body is at most a few MB written to a socket
    the kernel accepts at once."""
    limit = settings.HOPBASE_UPSTREAM_MAX_CONNECTIONS
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit, keepalive_expiry=30)
    return UpstreamClient(
        # No read timeout: long silences are the relay's to judge (hold,
        # slow start, stall), not the transport's.
        timeout=httpx.Timeout(
            connect=settings.HOPBASE_CONNECT_TIMEOUT, read=None, write=30, pool=settings.HOPBASE_CAPACITY_WAIT
        ),
        transport=UpstreamTransport(limits=limits, trust_env=False),
        follow_redirects=False,
        trust_env=False,
    )


class UpstreamTransport(AiohttpTransport):
    """httpx-aiohttp's transport, but the URL goes to aiohttp as httpx wrote
    it: given a string, aiohttp quotes it again, and ``%3D`` or ``%26`` in a
    Gemini model name would reach the channel as ``=`` or ``&``. (No proxy:
    the gateway's client never trusts the environment.)"""

    def get_client(self) -> aiohttp.ClientSession:
        session = super().get_client()
        resume_only_where_paused(session.connector)
        return session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        timeout = request.extensions.get("timeout", {})
        pool, connect = timeout.get("pool"), timeout.get("connect")
        with map_aiohttp_exceptions():
            response = await self.client.request(
                method=request.method,
                url=yarl.URL(str(request.url), encoded=True),
                # As pairs of strings (repeats kept as they are): aiohttp
                # would otherwise read httpx's Headers through items(),
                # which decodes every name and value through a property.
                headers=[(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw],
                data=request.content or None,
                allow_redirects=False,
                auto_decompress=False,
                compress=False,
                # aiohttp's ``connect`` bounds the wait for a free slot and
                # the new connection's handshake together: alone, the pool
                # wait would cut short a connect that is allowed longer.
                timeout=aiohttp.ClientTimeout(
                    sock_connect=connect, sock_read=timeout.get("read"),
                    connect=pool if pool is None or connect is None else pool + connect,
                ),
            ).__aenter__()
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=UpstreamResponseStream(response),
            request=request,
            extensions=extensions,
        )


class UpstreamResponseHandler(ResponseHandler):
    """aiohttp's protocol for a connection to a channel, but reading resumes
    only where it was paused. aiohttp 3.14 resumes after every piece of a
    body it hands out, paused or not (feeding its parser nothing and asking
    the socket to read on), and a channel sends each event as a piece of
    its own: several microseconds an event, for nothing."""

    def resume_reading(self, resume_parser: bool = True) -> None:
        if self._reading_paused or self._buffer_paused:
            super().resume_reading(resume_parser)


def resume_only_where_paused(connector: aiohttp.BaseConnector) -> None:
    """The connector's new connections speak ``UpstreamResponseHandler``
    (aiohttp keeps the protocol class only here: no argument sets it)."""
    connector._factory = functools.partial(UpstreamResponseHandler, loop=asyncio.get_running_loop())


class UpstreamResponseStream(AiohttpResponseStream):
    """A response body as aiohttp has it, each time all of it that has
    arrived (not in pieces of a fixed size: an upstream read is one item
    for the relay however it is cut)."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        body = self._aiohttp_response.content
        with map_aiohttp_exceptions():
            while chunk := await body.readany():
                yield chunk


async def open_response(http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """``http.send(request, stream=True)`` without the layers around the
    transport the gateway's requests never use: the auth flow, the redirect
    loop, event hooks, the cookie jar and a stream bound to the response for
    its timing (four coroutines and three objects a request: 1.5 % of the
    event loop's instructions for a 50-token answer). The transport is the
    client's own for the URL, so its pool and limits hold; the request goes
    as it was built."""
    response = await http._transport_for_url(request.url).handle_async_request(request)
    response.request = request
    return response


def chunk_reader(response: httpx.Response) -> Callable[[], Awaitable[bytes]]:
    """What reads a streamed response's body: each call, all of it that has
    arrived; ``b""`` at its end. For the gateway's own transport, aiohttp's
    reader itself, with no generator to resume for every upstream read (its
    errors are among ``TRANSPORT_ERRORS`` as they are); for any other httpx
    stream (the tests' fakes), the stream's iterator."""
    stream = response.stream
    if isinstance(stream, UpstreamResponseStream):
        return stream._aiohttp_response.content.readany
    chunks = aiter(stream)

    async def next_chunk() -> bytes:
        async for chunk in chunks:
            if chunk:
                return chunk
        return b""

    return next_chunk


# What the transport may raise for a failed exchange: httpx's own errors, and
# aiohttp's where httpx-aiohttp does not translate them (a malformed answer).
TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError, TimeoutError)


def timed_out(error: BaseException) -> bool:
    """Did the exchange fail by waiting too long (connect, pool), rather than
    by a refused or dropped connection? httpx-aiohttp maps every aiohttp
    connection error to ``httpx.ConnectTimeout``, so the aiohttp error it
    came from decides; httpx's own transports raise what they mean."""
    cause = error.__cause__ if isinstance(error, httpx.HTTPError) else None
    if isinstance(cause, aiohttp.ClientError | TimeoutError):
        return isinstance(cause, TimeoutError)
    return isinstance(error, httpx.TimeoutException | TimeoutError)


# Channel URLs already parsed: httpx parses a string URL on every request
# (about a tenth of a relayed request's own CPU), and a gateway calls the
# same few endpoints again and again. httpx.URL is immutable.
_parsed_urls: dict[str, httpx.URL] = {}
MAX_PARSED_URLS = 1024


def parsed_url(url: str) -> httpx.URL:
    parsed = _parsed_urls.get(url)
    if parsed is None:
        if len(_parsed_urls) >= MAX_PARSED_URLS:
            _parsed_urls.clear()
        parsed = _parsed_urls[url] = httpx.URL(url)
    return parsed


def retry_after_seconds(headers: httpx.Headers) -> int | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0, int(float(value)))
    except ValueError:
        return None


async def read_up_to(response: httpx.Response, limit: int) -> bytes:
    """The body, or its first ``limit`` bytes and a little more (read no further)."""
    chunks, size = [], 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)
