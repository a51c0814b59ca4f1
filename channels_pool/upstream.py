"""Talking to a channel: ``Attempt``, one upstream request (over the client
of ``channels_pool.http_client``).

The attempt's own task opens the request and holds the response open; the
relay reads the body from its own task, in ``next()`` (channels_pool.body),
timing keep-alives, stalls and the hold with waits that end without losing
a byte. Ending an attempt (cancelling its task) hangs up on the channel at
once; an attempt that completed has its task read the body's end, so the
connection goes back to the pool.

An answer the client takes whole (F4) is read the same way, but
``consume()`` has ``next()`` hand each event to the relay's function as it
is split, and give only the event that function keeps (the answer's end),
signals and failures.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

import httpx

from channels_pool.body import Body, FedBody, TimedOut, Waits, direct_body
from channels_pool.http_client import (
    TRANSPORT_ERRORS,
    chunk_reader,
    open_response,
    parsed_url,
    read_up_to,
    retry_after_seconds,
    timed_out,
)
from channels_pool.kinds import AuthFailed, BrokenStream, ClassifyFailure, UpstreamRequest
from channels_pool.parts import read_in_parts
from core.errors import UpstreamFailure
from core.sse import Event

log = logging.getLogger("hopbase.upstream")

MAX_ERROR_BODY = 64 * 1024
# A whole (non-event-stream) answer, such as a created Gemini cache or a
# batch of embeddings (2,048 vectors of 3,072 numbers as JSON: about 75 MB).
MAX_WHOLE_BODY = 128 * 1024 * 1024
RELEASE_GRACE_SECONDS = 5
# Bounds on what one attempt holds in memory: bytes read but not yet taken
# by the relay (past it, reading pauses: the provider waits; aiohttp's reader
# has its own, smaller), and one event the channel has not finished (past
# it, the channel is cut off).
MAX_UNREAD = 1024 * 1024
MAX_EVENT = 16 * 1024 * 1024
# Response headers from the channel that a client's SDK reads (request ids);
# rate-limit headers describe HopBase's account and stay here.
PASSED_BACK_HEADERS = ("x-request-id", "request-id")
# Where each provider names its request (kept on the request log).
PROVIDER_REQUEST_ID_HEADERS = (*PASSED_BACK_HEADERS, "x-goog-request-id")
KEPT_HEADERS = frozenset(name.encode() for name in PROVIDER_REQUEST_ID_HEADERS)

# What the operator is shown of a failure's cause, at most (never a client).
MAX_DETAIL = 300
# Takes an event as it is read; True keeps it (and what follows) for next().
Consumer = Callable[[Event], bool]
# What a body that cannot be read on raises: the transport's errors, and
# aiohttp's "Connection closed." for a connection gone under a waiting read.
CUT_ERRORS = (*TRANSPORT_ERRORS, RuntimeError)


class Signal(enum.Enum):
    """What ``Attempt.next()`` returns when it has no event to give."""

    TIMEOUT = "timeout"  # nothing arrived in time
    PROGRESS = "progress"  # bytes arrived, no complete event yet
    OPENED = "opened"  # the channel answered 200; its events follow
    END = "end"  # the channel closed its response normally


class Channel(Protocol):
    id: int
    name: str


class Attempt:
    """One request to one channel. ``next()`` yields its events in order,
    then ``Signal.END``; or a signal; or an ``UpstreamFailure`` as the last
    item. ``end()`` lets go of it: the connection goes back to the pool when
    the attempt ``completed``, otherwise the channel is hung up on. A whole
    answer asked for in parts (``parts``) is one event: their bodies as a JSON array."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        channel: Channel,
        request: UpstreamRequest | Sequence[UpstreamRequest],
        classify: ClassifyFailure,
        whole_body: bool = False,
    ) -> None:
        requests = [request] if isinstance(request, UpstreamRequest) else list(request)
        self.channel = channel
        self.status: int | None = None
        # The channel's response headers anyone asks for (request ids), by
        # lower-case name: looked up in httpx's Headers, each name is a scan
        # of them all.
        self._kept_headers: dict[str, str] = {}
        self.completed = False  # its terminal event arrived
        self._classify = classify
        self._whole_body = whole_body
        # What the attempt's task put for next(), in order (signals,
        # failures, a whole answer's one event); ``_arrived`` is set when an
        # item comes for a ``next()`` that is waiting.
        self._items: deque[Event | Signal | UpstreamFailure] = deque()
        self._arrived: asyncio.Future[None] | None = None
        # The streamed body, once the channel answered 200: read by next().
        self._body: Body | None = None
        self._splitter = requests[0].splitter()
        self._events: deque[Event] = deque()
        self._take: Consumer | None = None
        self._loop = loop = asyncio.get_running_loop()
        self._waits = Waits(loop)
        # Set when the body was read to its end, or by end() for a completed
        # attempt: its task reads what is left and closes the response.
        self._let_go: asyncio.Future[None] = loop.create_future()
        self.read_at = loop.time()  # when the channel last sent bytes
        self._task = loop.create_task(self._pump(http, requests))

    async def _pump(self, http: httpx.AsyncClient, requests: list[UpstreamRequest]) -> None:
        try:
            if len(requests) > 1:
                await self._read_parts(http, requests)
            else:
                if requests[0].authorize is not None:
                    await requests[0].authorize(requests[0], http)
                await self._read(http, requests[0])
        except AuthFailed as error:
            # The channel's credentials, not the request: the channel fails over.
            self._put(UpstreamFailure("auth", detail=str(error)[:MAX_DETAIL]))
        except asyncio.CancelledError:
            pass  # hung up on (``_hang_up``): the response was closed on the way out
        except Exception:
            # Whatever broke, the relay must hear of it rather than wait
            # on a reader that is gone.
            log.exception("upstream read failed on channel %s", self.channel.name)
            self._put(UpstreamFailure("internal", self.status))

    async def _open(self, http: httpx.AsyncClient, upstream: UpstreamRequest) -> httpx.Response | UpstreamFailure:
        # Built directly, not with build_request (which merges the client's
        # defaults, cookies and URL parts: ~4 % of a request's CPU). The relay
        # splits raw bytes, so the channel must send them uncompressed.
        request = httpx.Request(
            "POST", parsed_url(upstream.url), headers={**upstream.headers, "accept-encoding": "identity"},
            content=upstream.content, extensions={"timeout": http.timeout.as_dict()},
        )
        try:
            response = await open_response(http, request)
        except TRANSPORT_ERRORS as error:
            return UpstreamFailure("timeout" if timed_out(error) else "connect")
        self.status = response.status_code
        self._kept_headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for raw_name, value in response.headers.raw
            if (name := raw_name.lower()) in KEPT_HEADERS
        }
        return response

    async def _refused(self, response: httpx.Response) -> UpstreamFailure:
        body = await read_up_to(response, MAX_ERROR_BODY)
        failure = self._classify(response.status_code, body, retry_after_seconds(response.headers))
        return replace(failure, detail=failure.detail or body[:MAX_DETAIL].decode("utf-8", "replace"))

    async def _whole(self, response: httpx.Response, upstream: UpstreamRequest) -> bytes:
        body = await read_up_to(response, MAX_WHOLE_BODY)
        return upstream.answer(body, response.headers) if upstream.answer is not None else body

    async def _read(self, http: httpx.AsyncClient, upstream: UpstreamRequest) -> None:
        put = self._put
        response = await self._open(http, upstream)
        if isinstance(response, UpstreamFailure):
            put(response)
            return
        try:
            if response.status_code != 200:
                put(await self._refused(response))
                return
            if self._whole_body:
                put(Signal.OPENED)
                put(Event(await self._whole(response, upstream)))
                put(Signal.END)
                return
            body = direct_body(response)
            if body is None:
                await self._feed(response)
                return
            self._body = body
            put(Signal.OPENED)
            await self._let_go
            while await body.readany():  # the rest of a completed answer: the connection is pooled at its end
                pass
        except TRANSPORT_ERRORS:
            # A reset may reach here as any of them (httpx-aiohttp calls a
            # dropped connection a ConnectTimeout): all are a cut.
            put(UpstreamFailure("cut", self.status))
        finally:
            await response.aclose()

    async def _feed(self, response: httpx.Response) -> None:
        """Any other httpx stream than the gateway's own transport's,
        read into a body for next()."""
        self._body = fed = FedBody(MAX_UNREAD)
        self._put(Signal.OPENED)
        await fed.read_from(chunk_reader(response), TRANSPORT_ERRORS)

    async def _read_parts(self, http: httpx.AsyncClient, parts: list[UpstreamRequest]) -> None:
        async def read(upstream: UpstreamRequest) -> bytes | UpstreamFailure:
            if upstream.authorize is not None:
                await upstream.authorize(upstream, http)
            response = await self._open(http, upstream)
            if isinstance(response, UpstreamFailure):
                return response
            try:
                if response.status_code != 200:
                    return await self._refused(response)
                return await self._whole(response, upstream)
            except TRANSPORT_ERRORS:
                return UpstreamFailure("cut", response.status_code)
            finally:
                await response.aclose()

        bodies = await read_in_parts(parts, read)
        if isinstance(bodies, UpstreamFailure):
            self._put(bodies)
            return
        self.status = 200
        self._put(Signal.OPENED)
        self._put(Event(b"[" + b",".join(bodies) + b"]"))
        self._put(Signal.END)

    def _put(self, item: Event | Signal | UpstreamFailure) -> None:
        if self._take is None or not isinstance(item, Event):
            self._items.append(item)
        elif not self._offer([item]):
            return
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    def consume(self, take: Consumer) -> None:
        """From now on hand every event to ``take`` as it is read, those
        already read first; the first it keeps (returns True for) ends the
        handing over, and ``next()`` returns it, then whatever follows.
        Until then ``next()`` gives only signals and failures, and the
        reader judges the channel's silence by ``read_at``."""
        self._take = take
        self.read_at = self._loop.time()
        events, self._events = list(self._events), deque()
        if self._offer(events):
            return
        items = self._items
        while self._take is not None and items and isinstance(items[0], Event):
            self._offer([items.popleft()])

    def _split(self, chunk: bytes) -> list[Event] | None:
        """The events a read completes; None when the stream cannot be read
        on: an event past MAX_EVENT, or framing that is broken."""
        try:
            events = self._splitter.feed(chunk)
        except BrokenStream as error:
            log.warning("channel %s: %s", self.channel.name, error)
            return None
        if not events and self._splitter.pending_size > MAX_EVENT:
            return None
        return events

    def _offer(self, events: list[Event]) -> bool:
        """Hand ``events`` to the consumer; the one it keeps and those after
        it go ahead of anything queued, for ``next()``."""
        take = self._take
        assert take is not None
        for index, event in enumerate(events):
            if take(event):
                self._take = None
                self._items.extendleft(reversed(events[index:]))
                return True
        return False

    async def next(self, timeout: float) -> Event | Signal | UpstreamFailure:
        if self._events:
            return self._events.popleft()
        deadline = self._loop.time() + timeout
        while not self._items:
            body = self._body
            try:
                if body is None:
                    if deadline <= self._loop.time():
                        return Signal.TIMEOUT
                    await self._waits.until(deadline, self._item_arrived())
                    continue
                chunk = await self._waits.until(deadline, body.readany())
            except TimedOut:
                return Signal.TIMEOUT
            except CUT_ERRORS:
                self._body = None
                self._items.append(UpstreamFailure("cut", self.status))
                break
            if not chunk:
                self._body = None
                self._items.append(Signal.END)
                self._release()  # all read: the attempt's task closes it, the connection goes back
                break
            self.read_at = self._loop.time()
            events = self._split(chunk)
            if events is None:
                self._body = None
                self._hang_up()
                return UpstreamFailure("cut", self.status)
            if self._take is not None:
                self._offer(events)  # what it keeps is in the items now
            elif events:
                self._events.extend(events)
                return self._events.popleft()
            else:
                return Signal.PROGRESS
        return self._next_item()

    def _item_arrived(self) -> asyncio.Future[None]:
        self._arrived = arrived = self._loop.create_future()
        return arrived

    def _next_item(self) -> Event | Signal | UpstreamFailure:
        item = self._items.popleft()
        if item is Signal.END:
            # A last event the channel never terminated with a blank line.
            try:
                rest = self._splitter.finish()
            except BrokenStream:
                return UpstreamFailure("cut", self.status)  # it ended inside a frame
            if rest:
                self._items.appendleft(Signal.END)
                if self._take is None:
                    self._events.extend(rest[1:])
                    return rest[0]
                self._offer(rest)
                return self._items.popleft()
        return item

    def buffered_event(self) -> Event | None:
        """The next of the events already read and split, if there is one:
        the relay takes the events of one read together, without waiting."""
        events = self._events
        return events.popleft() if events else None

    def ready(self) -> bool:
        """Whether ``next()`` has something to return at once (more of what
        one upstream read carried): the relay sends those together."""
        return bool(self._events) or bool(self._items)

    def wake(self) -> None:
        """End a ``next()`` that is waiting, early (it returns TIMEOUT): the
        reader has something else to look at, such as a drain deadline."""
        self._waits.wake()

    def passed_back_headers(self) -> dict[str, str]:
        found = self._kept_headers
        return {name: found[name] for name in PASSED_BACK_HEADERS if name in found}

    def provider_request_id(self) -> str:
        found = self._kept_headers
        return next((found[name] for name in PROVIDER_REQUEST_ID_HEADERS if name in found), "")

    def end(self) -> None:
        """Let go of the channel: after the terminal event, let the attempt's
        task read the body's end so the connection goes back to the pool
        (hanging up if it has not within a few seconds); otherwise hang up
        at once."""
        self._waits.close()
        self._take = None  # it refers back to the relay's run, which refers to this
        if self._task.done():
            return
        if self.completed:
            self._release()
            self._loop.call_later(RELEASE_GRACE_SECONDS, self._hang_up)
        else:
            self._hang_up()

    def _release(self) -> None:
        if not self._let_go.done():
            self._let_go.set_result(None)

    def _hang_up(self) -> None:
        if not self._task.done():
            self._task.cancel()
