"""The gateway's real HTTP client (channels_pool.http_client.new_client: httpx
over aiohttp) against a plain socket server: a cut mid-stream is still an
interruption, a hang-up closes the upstream connection at once, connections
go back to the pool, the pool's limit holds, and the relay's waits on the
body, ended early, lose nothing of it."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from channels_pool.http_client import UpstreamResponseHandler, new_client
from channels_pool.upstream import Attempt, Signal
from core.errors import UpstreamFailure, failure_from_status
from core.sse import Event
from providers.kind import UpstreamRequest

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Server:
    """Answers each request with ``answer(writer)``; counts connections and
    notes when each one is closed by the client."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.targets: list[bytes] = []  # each request line's target, as sent
        self.heads: list[bytes] = []
        self.connections = 0
        self.requests = 0
        self.closed: list[float] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.targets.append(head.split(b" ")[1])
                self.heads.append(head)
                length = next(
                    int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.requests += 1
                if not await self.answer(reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.append(time.monotonic())
            writer.close()


async def whole_stream(reader, writer) -> bool:
    writer.write(HEAD + chunk(EVENT) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def whole_stream_setting_a_cookie(reader, writer) -> bool:
    writer.write(HEAD.replace(b"\r\n\r\n", b"\r\nSet-Cookie: session=tenant-a; Path=/\r\n\r\n", 1)
                 + chunk(EVENT) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def cut_after_one_event(reader, writer) -> bool:
    writer.write(HEAD + chunk(EVENT))
    await writer.drain()
    return False  # the connection is dropped mid-stream


async def one_event_then_silence(reader, writer) -> bool:
    writer.write(HEAD + chunk(EVENT))
    await writer.drain()
    await reader.read()  # until the gateway hangs up
    return False


def start(http, url: str) -> Attempt:
    channel = type("Channel", (), {"id": 1, "name": "local"})()
    return Attempt(http, channel, UpstreamRequest(url + "/chat/completions", {}, b"{}"),
                   lambda status, body, retry: failure_from_status(status, retry_after=retry))


async def read_all(attempt: Attempt) -> list:
    items = []
    while True:
        item = await attempt.next(5)
        items.append(item)
        if item is Signal.END or isinstance(item, UpstreamFailure) or item is Signal.TIMEOUT:
            return items


async def past_its_first_event(answer) -> tuple[Server, httpx.AsyncClient, Attempt]:
    """An attempt against a server answering ``answer``, read up to its
    first event (``EVENT``)."""
    server = Server(answer)
    url = await server.start()
    http = new_client()
    attempt = start(http, url)
    assert await attempt.next(5) is Signal.OPENED
    first = await attempt.next(5)
    assert isinstance(first, Event) and first.raw == EVENT
    return server, http, attempt


def one_attempt(answer) -> list:
    """Everything one attempt yields against a server answering ``answer``."""

    async def scenario():
        server = Server(answer)
        url = await server.start()
        http = new_client()
        items = await read_all(start(http, url))
        await http.aclose()
        return items

    return asyncio.run(scenario())


def test_it_reads_a_stream_and_returns_the_connection_to_the_pool():
    async def scenario():
        server = Server(whole_stream)
        url = await server.start()
        http = new_client()
        for _ in range(3):
            attempt = start(http, url)
            items = await read_all(attempt)
            assert items[0] is Signal.OPENED and items[-1] is Signal.END
            assert [item.raw for item in items if isinstance(item, Event)] == [EVENT, b"data: [DONE]\n\n"]
            attempt.completed = True
            await attempt._task
            attempt.end()
        await http.aclose()
        return server

    server = asyncio.run(scenario())
    assert server.requests == 3
    assert server.connections == 1  # one kept-alive connection served all three


def test_a_cut_mid_stream_is_an_interruption():
    items = one_attempt(cut_after_one_event)
    assert items[0] is Signal.OPENED
    assert isinstance(items[1], Event)
    assert isinstance(items[-1], UpstreamFailure) and items[-1].kind == "cut"


def test_a_hang_up_closes_the_upstream_connection_at_once():
    async def scenario():
        server, http, attempt = await past_its_first_event(one_event_then_silence)
        hung_up = time.monotonic()
        attempt.end()  # not completed: the client went away
        for _ in range(100):
            if server.closed:
                break
            await asyncio.sleep(0.01)
        await http.aclose()
        return server.closed[0] - hung_up if server.closed else None

    delay = asyncio.run(scenario())
    assert delay is not None and delay < 0.5


def test_a_refused_connection_is_a_connect_failure():
    async def scenario():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        http = new_client()
        items = await read_all(start(http, f"http://127.0.0.1:{port}/v1"))
        await http.aclose()
        return items

    items = asyncio.run(scenario())
    assert isinstance(items[-1], UpstreamFailure) and items[-1].kind == "connect"


def test_the_pool_limit_holds_and_a_wait_for_a_connection_times_out(settings):
    settings.HOPBASE_UPSTREAM_MAX_CONNECTIONS = 2
    settings.HOPBASE_CAPACITY_WAIT = 0.3
    settings.HOPBASE_CONNECT_TIMEOUT = 0.2

    async def scenario():
        server = Server(one_event_then_silence)
        url = await server.start()
        http = new_client()
        held = [start(http, url) for _ in range(2)]
        for attempt in held:
            assert await attempt.next(5) is Signal.OPENED
        third = await read_all(start(http, url))
        connections = server.connections
        for attempt in held:
            attempt.end()
        await asyncio.sleep(0.05)
        fourth = start(http, url)  # a slot is free again
        opened = await fourth.next(5)
        fourth.end()
        await http.aclose()
        return connections, third, opened

    connections, third, opened = asyncio.run(scenario())
    assert connections == 2
    assert isinstance(third[-1], UpstreamFailure) and third[-1].kind == "timeout"
    assert opened is Signal.OPENED


def test_a_slow_connect_may_take_the_connect_timeout_not_just_the_capacity_wait(settings):
    # aiohttp bounds the wait for a free slot and the handshake together: a
    # handshake slower than the capacity wait (a provider's full accept
    # queue, a burst) must still have the whole connect timeout.
    settings.HOPBASE_CAPACITY_WAIT = 0.3
    settings.HOPBASE_CONNECT_TIMEOUT = 10

    async def scenario():
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        listener.setblocking(False)
        fillers = []
        for _ in range(3):  # the accept queue full: the next SYN is dropped and sent again a second later
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(listener.getsockname())
            fillers.append(filler)
        server = Server(whole_stream)
        http = new_client()
        port = listener.getsockname()[1]
        attempt = start(http, f"http://127.0.0.1:{port}/v1")
        await asyncio.sleep(0.5)  # past the capacity wait, then the queue is served
        server.server = await asyncio.start_server(server._serve, sock=listener)
        for filler in fillers:
            filler.close()
        items = await read_all(attempt)
        await http.aclose()
        server.server.close()
        return items

    items = asyncio.run(scenario())
    assert items[0] is Signal.OPENED and items[-1] is Signal.END


@pytest.mark.parametrize("status", [429, 500])
def test_an_error_answer_is_classified_with_its_body(status):
    body = b'{"error": {"message": "no"}}'

    async def answer(reader, writer) -> bool:
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(body), body))
        await writer.drain()
        return True

    items = one_attempt(answer)
    assert isinstance(items[-1], UpstreamFailure) and items[-1].status == status


def test_the_url_reaches_the_channel_as_written():
    # aiohttp would quote a string URL again: %3D and %26 would arrive as = and &.
    path = "/v1beta/models/odd%3Fkey%3Dstolen%26x%2F..:streamGenerateContent?alt=sse"

    async def scenario():
        server = Server(whole_stream)
        url = await server.start()
        http = new_client()
        attempt = Attempt(http, type("Channel", (), {"id": 1, "name": "local"})(),
                          UpstreamRequest(url.removesuffix("/v1") + path, {}, b"{}"), lambda status, body, retry: failure_from_status(status, retry_after=retry))
        await read_all(attempt)
        await http.aclose()
        return server.targets

    assert asyncio.run(scenario()) == [path.encode()]


def test_a_cookie_one_answer_sets_is_never_sent_on_another_request():
    async def scenario():
        server = Server(whole_stream_setting_a_cookie)
        url = await server.start()
        http = new_client()
        for _ in range(2):
            await read_all(start(http, url))
        await http.aclose()
        return server.heads

    first, second = asyncio.run(scenario())
    assert b"cookie" not in first.lower() and b"cookie" not in second.lower()


def test_a_stream_read_slower_than_it_comes_pauses_the_socket_and_resumes_it(monkeypatch):
    # aiohttp's flow control still works with reading resumed only where it
    # was paused (UpstreamResponseHandler): every byte arrives.
    pieces = [b"data: " + b"x" * 1000 + b"\n\n"] * 2000  # 2 MB, far past aiohttp's buffer

    async def a_long_stream(reader, writer) -> bool:
        writer.write(HEAD + b"".join(chunk(piece) for piece in pieces) + b"0\r\n\r\n")
        await writer.drain()
        return True

    pauses = []
    pause = UpstreamResponseHandler.pause_reading
    monkeypatch.setattr(UpstreamResponseHandler, "pause_reading", lambda self: (pauses.append(1), pause(self)))

    async def scenario():
        server = Server(a_long_stream)
        url = await server.start()
        http = new_client()
        received = 0
        async with http.stream("POST", url + "/chat/completions", content=b"{}") as response:
            assert isinstance(http._transport.client.connector._factory(), UpstreamResponseHandler)
            async for part in response.aiter_raw():
                received += len(part)
                await asyncio.sleep(0.001)  # a reader slower than the socket
        await http.aclose()
        return received

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == sum(map(len, pieces))
    assert pauses  # the socket was paused, and read on to the end


async def events_apart(reader, writer) -> bool:
    """One event, a pause, then the rest of the answer."""
    writer.write(HEAD + chunk(EVENT))
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.write(chunk(EVENT) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


def test_waits_ended_early_by_their_deadline_or_wake_lose_nothing_of_the_body():
    # The relay's waits end at its clocks and at a drain's word, while the
    # channel's bytes keep arriving: none may be lost or left behind.
    async def scenario():
        _, http, attempt = await past_its_first_event(events_apart)
        ended = [await attempt.next(0.02), await attempt.next(0.02)]  # by their deadline
        asyncio.get_running_loop().call_later(0.02, attempt.wake)
        ended.append(await attempt.next(5))  # by wake()
        rest = await read_all(attempt)
        attempt.completed = True
        attempt.end()
        await attempt._task
        await http.aclose()
        return ended, rest, asyncio.current_task().cancelling()

    ended, rest, cancelling = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert ended == [Signal.TIMEOUT] * 3
    assert [item.raw for item in rest if isinstance(item, Event)] == [EVENT, b"data: [DONE]\n\n"]
    assert rest[-1] is Signal.END
    assert cancelling == 0  # the early ends left no cancellation behind


def test_a_wait_on_the_body_cancelled_from_outside_is_cancelled_not_timed_out():
    # A client leaving (B1) cancels the relay's task mid-wait: that must
    # reach the relay as a cancellation, even when a deadline ends the wait
    # at the same moment.
    async def scenario():
        _, http, attempt = await past_its_first_event(one_event_then_silence)
        reader = asyncio.create_task(attempt.next(30))
        await asyncio.sleep(0.01)
        attempt.wake()  # ended early and cancelled from outside, together
        reader.cancel()
        outcome = await asyncio.gather(reader, return_exceptions=True)
        attempt.end()
        await http.aclose()
        return outcome[0]

    assert isinstance(asyncio.run(asyncio.wait_for(scenario(), 10)), asyncio.CancelledError)
