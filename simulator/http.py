"""The upstream simulator's HTTP/1.1 layer, written by hand on asyncio streams.

``simulator.server`` answers requests; this module reads them off
the socket (keep-alive, Content-Length or chunked bodies) and writes answers back
with exact control over every HTTP chunk, pause and hang-up, which a real web
framework would hide. While a response is being produced the socket is watched
for EOF, so a caller that hangs up is noticed within milliseconds even while
the handler is sleeping or stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote

MAX_HEAD = 64 * 1024
MAX_BODY = 32 * 1024 * 1024


def status_phrase(status: int) -> str:
    if status == 529:
        return "Overloaded"  # Anthropic's own status; http.HTTPStatus does not know it
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class ClientGone(Exception):
    """The caller hung up; stop working on its request."""


class BadRequest(Exception):
    pass


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    # The request target as sent, still percent-encoded: what a signature (SigV4) covers.
    raw_path: str = ""
    raw_query: str = ""

    def parsed_body(self) -> Any:
        """The body's JSON, or None for an empty or unreadable one."""
        try:
            return json.loads(self.body) if self.body else None
        except (ValueError, UnicodeDecodeError):
            return None


class Connection:
    """One client socket: buffered request reading, guarded writes, hang-up detection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.gone = asyncio.Event()
        self._on_hang_up: Callable[[], None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def _fill(self) -> bool:
        data = await self.reader.read(65536)
        self.buffer += data
        return bool(data)

    async def readline(self) -> bytes | None:
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > MAX_HEAD:
                raise BadRequest("header line too long")
            if not await self._fill():
                return None
        line = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        return line

    async def readexactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not await self._fill():
                raise ClientGone
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def watch(self, on_hang_up: Callable[[], None]) -> None:
        """While a response is produced, notice at once if the caller hangs up."""
        self._on_hang_up = on_hang_up

        async def watch() -> None:
            try:
                # httpx never pipelines, but if a next request arrives early keep its bytes.
                while data := await self.reader.read(65536):
                    self.buffer += data
            except OSError:
                pass
            self.hang_up()

        self._watcher = asyncio.create_task(watch())

    async def unwatch(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        self._on_hang_up = None

    def hang_up(self) -> None:
        if self.gone.is_set():
            return
        self.gone.set()
        if self._on_hang_up is not None:
            self._on_hang_up()

    async def write(self, data: bytes) -> None:
        if self.gone.is_set():
            raise ClientGone
        try:
            self.writer.write(data)
            await self.writer.drain()
        except OSError:
            self.hang_up()
            raise ClientGone from None

    async def sleep(self, seconds: float) -> None:
        """Sleep, but stop the moment the caller hangs up."""
        if seconds <= 0:
            if self.gone.is_set():
                raise ClientGone
            return
        try:
            await asyncio.wait_for(self.gone.wait(), seconds)
        except asyncio.TimeoutError:
            return
        raise ClientGone

    async def wait_for_hang_up(self) -> None:
        await self.gone.wait()
        raise ClientGone

    async def send_head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {status_phrase(status)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        await self.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


async def read_request(conn: Connection) -> Request | None:
    line = await conn.readline()
    while line in (b"\r\n", b"\n"):  # tolerated stray CRLF between requests
        line = await conn.readline()
    if not line:
        return None
    try:
        method, target, version = line.decode("latin-1").split()
    except ValueError:
        raise BadRequest("malformed request line") from None
    headers: dict[str, str] = {}
    size = len(line)
    while True:
        raw = await conn.readline()
        if raw is None:
            return None
        size += len(raw)
        if size > MAX_HEAD:
            raise BadRequest("headers too large")
        if raw in (b"\r\n", b"\n"):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        name = name.strip().lower()
        headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
    path, _, raw_query = target.partition("?")
    query = dict(parse_qsl(raw_query, keep_blank_values=True))
    if headers.get("expect", "").lower() == "100-continue":
        await conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await _read_body(conn, headers)
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
    return Request(method.upper(), unquote(path), query, headers, body, keep_alive, path, raw_query)


async def _read_body(conn: Connection, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_line = await conn.readline()
            if size_line is None:
                raise ClientGone
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadRequest("bad chunk size") from None
            if size == 0:
                while (trailer := await conn.readline()) not in (b"\r\n", b"\n"):
                    if trailer is None:
                        raise ClientGone
                return bytes(body)
            body += await conn.readexactly(size)
            await conn.readexactly(2)  # the CRLF after each chunk
            if len(body) > MAX_BODY:
                raise BadRequest("body too large")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise BadRequest("bad content-length") from None
    if length < 0 or length > MAX_BODY:
        raise BadRequest("bad content-length")
    return await conn.readexactly(length)


class BodyWriter:
    """Writes a response payload into ``sent`` and the socket, with optional seeded splitting.

    Streams are chunked (each piece is one HTTP chunk); whole bodies carry a
    Content-Length and each piece is simply a separate write.
    """

    def __init__(self, conn: Connection, sent: bytearray, chunked: bool, split: int | str | None) -> None:
        self.conn = conn
        self.sent = sent
        self.chunked = chunked
        self.rng = random.Random(split) if split is not None else None
        self.carry = b""  # the tail of an event held back to share a chunk with the next one

    def _cuts(self, data: bytes) -> set[int]:
        assert self.rng is not None
        if len(data) < 2:
            return set()
        rng = self.rng
        cuts = {rng.randint(1, len(data) - 1) for _ in range(rng.randint(1, 3))}
        # The boundaries naive relays get wrong: inside a UTF-8 character, between \r and \n.
        inside_char = [i for i in range(1, len(data)) if 0x80 <= data[i] < 0xC0]
        if inside_char and rng.random() < 0.6:
            cuts.add(rng.choice(inside_char))
        inside_crlf = [i + 1 for i in range(len(data) - 1) if data[i : i + 2] == b"\r\n"]
        if inside_crlf and rng.random() < 0.6:
            cuts.add(rng.choice(inside_crlf))
        return cuts

    async def event(self, data: bytes, pause: float = 0.0, may_hold: bool = False) -> None:
        """Write one event. ``pause`` waits halfway through it; ``may_hold`` lets a
        split tail wait for the next event, which the caller must then write or flush
        without sleeping in between."""
        payload = self.carry + data
        cuts = self._cuts(payload) if self.rng else set()
        middle = len(self.carry) + len(data) // 2 if pause > 0 and len(data) > 1 else None
        if middle is not None:
            cuts.add(middle)
        self.carry = b""
        bounds = [0, *sorted(cuts), len(payload)]
        pieces = [(start, payload[start:end]) for start, end in itertools.pairwise(bounds) if end > start]
        if may_hold and middle is None and self.rng is not None and self.rng.random() < 0.3:
            self.carry = pieces.pop()[1]
        for start, piece in pieces:
            if start == middle:
                await self.conn.sleep(pause)
            await self._write(piece)

    async def flush(self) -> None:
        if self.carry:
            carry, self.carry = self.carry, b""
            await self._write(carry)

    async def _write(self, piece: bytes) -> None:
        framed = b"%x\r\n%s\r\n" % (len(piece), piece) if self.chunked else piece
        await self.conn.write(framed)
        self.sent += piece
