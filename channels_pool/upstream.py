"""Talking to a channel: ``Attempt``, one upstream request read by its own
task into a queue (over the client of ``channels_pool.http_client``), so
that the relay times keep-alives, stalls and the hold with plain waits, and
ending an attempt (cancelling its task) hangs up on the channel at once.

An answer the client takes whole (F4) need not wake the relay for every
read: ``consume()`` has the reading task hand each event to the relay's
function as it is split, and ``next()`` gives only the event that function
keeps (the answer's end), signals and failures.
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

from channels_pool.http_client import (
    TRANSPORT_ERRORS,
    chunk_reader,
    open_response,
    parsed_url,
    read_up_to,
    retry_after_seconds,
    timed_out,
)
from channels_pool.masking import masked, provider_words
from channels_pool.parts import read_in_parts
from core import loggers
from core.errors import UpstreamFailure
from core.sse import Event
from providers.kind import AuthFailed, BrokenStream, ClassifyFailure, UpstreamRequest

log = logging.getLogger(loggers.UPSTREAM)

MAX_ERROR_BODY = 64 * 1024
# A whole (non-event-stream) answer, such as a created Gemini cache or a
# batch of embeddings (2,048 vectors of 3,072 numbers as JSON: about 75 MB).
MAX_WHOLE_BODY = 128 * 1024 * 1024
RELEASE_GRACE_SECONDS = 5
# Bounds on what one attempt holds in memory: bytes read but not yet taken
# by the relay (past it, reading pauses: the provider waits), and one event
# the channel has not finished (past it, the channel is cut off).
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
# What the pump reads, as a tuple (``bytes | Event`` is a new object each time).
READ = (bytes, Event)


class Signal(enum.Enum):
    """What ``Attempt.next()`` returns when it has no event to give."""

    TIMEOUT = "timeout"  # nothing arrived in time
    PROGRESS = "progress"  # bytes arrived, no complete event yet
    OPENED = "opened"  # the channel answered 200; its events follow
    END = "end"  # the channel closed its response normally


class Channel(Protocol):
    id: int
    name: str


def _set_if_waiting(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)


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
        # What the pump read, in order; ``_wake`` is set when an item arrives
        # for a ``next()`` that is waiting. (A future and a timer per wait
        # cost far less than ``wait_for`` on a queue, which makes a task for
        # every event.)
        self._items: deque[bytes | Event | Signal | UpstreamFailure] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._unread = 0
        self._room: asyncio.Future[None] | None = None  # the pump waits for the relay to catch up
        self._splitter = requests[0].splitter()
        self._events: deque[Event] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._take: Consumer | None = None
        self._loop = loop = asyncio.get_running_loop()
        # When the channel last sent bytes, kept once consume() is called
        # (until then the relay sees every read itself).
        self.read_at = loop.time()
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
        detail = failure.detail or provider_words(body.decode("utf-8", "replace"))  # shown to operators
        return replace(failure, detail=masked(detail, self.channel.secret)[:MAX_DETAIL])

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
            put(Signal.OPENED)
            if self._whole_body:
                put(Event(await self._whole(response, upstream)))
            else:
                # Not aiter_raw(): its layers (a chunker, a context per body)
                # cost more than the bytes of an event.
                read = chunk_reader(response)
                while chunk := await read():
                    put(chunk)
                    if self._unread > MAX_UNREAD:
                        self._room = asyncio.get_running_loop().create_future()
                        await self._room
            put(Signal.END)
        except TRANSPORT_ERRORS:
            # A reset mid-stream may reach here as any of them (httpx-aiohttp
            # calls a dropped connection a ConnectTimeout): all are a cut.
            put(UpstreamFailure("cut", self.status))
        finally:
            await response.aclose()

    async def _read_parts(self, http: httpx.AsyncClient, parts: list[UpstreamRequest]) -> None:
        async def read(upstream: UpstreamRequest) -> bytes | UpstreamFailure:
            if upstream.authorize is not None:
                await upstream.authorize(upstream, http)
            response = await self._open(http, upstream)
            if isinstance(response, UpstreamFailure):
                return response
            try:
                return await (self._refused(response) if response.status_code != 200 else self._whole(response, upstream))
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

    def _put(self, item: bytes | Event | Signal | UpstreamFailure) -> None:
        if isinstance(item, READ):
            if self._take is not None:
                self.read_at = self._loop.time()
                self._hand_over(item)
                return
            if isinstance(item, bytes):
                self._unread += len(item)
        self._items.append(item)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

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
        while self._take is not None and items and isinstance(items[0], READ):
            item = items.popleft()
            if isinstance(item, bytes):
                self._unread -= len(item)
            self._hand_over(item)
        if self._room is not None and self._unread <= MAX_UNREAD // 2:
            _set_if_waiting(self._room)
            self._room = None

    def _hand_over(self, item: bytes | Event) -> None:
        """What the channel sent, to the consumer: a whole body's one event,
        or the events a read completes."""
        events = [item] if isinstance(item, Event) else self._split(item)
        if events is None:
            self._take = None
            self._hang_up()
            self._items.appendleft(UpstreamFailure("cut", self.status))
            self.wake()
        elif events:
            self._offer(events)

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
                self.wake()
                return True
        return False

    async def next(self, timeout: float) -> Event | Signal | UpstreamFailure:
        if self._events:
            return self._events.popleft()
        if not self._items:
            if timeout <= 0:
                return Signal.TIMEOUT
            loop = self._loop
            deadline = loop.time() + timeout
            # One timer serves many waits: the reader's deadlines (keep-alive,
            # stall) move later with every event, so a timer due no later
            # than this one is kept, and its early TIMEOUT is one more the
            # reader already allows for (it looks at its clocks and waits
            # again), instead of a timer made and cancelled per chunk.
            timer = self._timer
            if timer is None or timer.when() > deadline:
                if timer is not None:
                    timer.cancel()
                self._timer = loop.call_at(deadline, self._timer_fired)
            self._wake = wake = loop.create_future()
            try:
                await wake
            finally:
                self._wake = None
            if not self._items:
                return Signal.TIMEOUT
        item = self._items.popleft()
        if isinstance(item, bytes):
            self._unread -= len(item)
            if self._room is not None and self._unread <= MAX_UNREAD // 2:
                _set_if_waiting(self._room)
                self._room = None
            events = self._split(item)
            if events is None:
                self._hang_up()
                self._items.clear()
                return UpstreamFailure("cut", self.status)
            if not events:
                return Signal.PROGRESS
            if len(events) > 1:  # one read, one event: as a paced stream has
                self._events.extend(events[1:])
            return events[0]
        if item is Signal.END:
            # A last event the channel never terminated with a blank line.
            try:
                rest = self._splitter.finish()
            except BrokenStream:
                return UpstreamFailure("cut", self.status)  # it ended inside a frame
            if rest:
                self._items.appendleft(Signal.END)
                if self._take is None:
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

    def _timer_fired(self) -> None:
        self._timer = None
        self.wake()

    def wake(self) -> None:
        """End a ``next()`` that is waiting, early (it returns TIMEOUT): the
        reader has something else to look at, such as a drain deadline."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def passed_back_headers(self) -> dict[str, str]:
        found = self._kept_headers
        return {name: found[name] for name in PASSED_BACK_HEADERS if name in found}

    def provider_request_id(self) -> str:
        found = self._kept_headers
        return next((found[name] for name in PROVIDER_REQUEST_ID_HEADERS if name in found), "")

    def end(self) -> None:
        """Let go of the channel: after the terminal event, let the pump read
        the body's end so the connection goes back to the pool (hanging up if
        it has not within a few seconds); otherwise hang up at once."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._take = None  # it refers back to the relay's run, which refers to this
        if self._task.done():
            return
        if self.completed:
            asyncio.get_running_loop().call_later(RELEASE_GRACE_SECONDS, self._hang_up)
        else:
            self._hang_up()

    def _hang_up(self) -> None:
        if not self._task.done():
            self._task.cancel()

