"""The latency measurements: calls through the gateway and straight to the simulator, interleaved."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from bench.processes import open_sockets

REQUEST_TIMEOUT = 30.0  # any single benchmark request

CHAT_MODEL = "gpt-4o-mini"
NONSTREAM_DIRECTIVE = "[sim tokens=50]"
STREAM_DIRECTIVE = "[sim tokens=20 pace=0.002]"
CHAT_CONTENT = re.compile(rb'"content":"[^"]')  # a non-empty content delta (the role preamble has "")


# --------------------------------------------------------------------------- measuring


@dataclass
class Target:
    name: str  # "gateway" or "direct"
    base: str
    chat_headers: dict[str, str]
    anthropic_headers: dict[str, str]


@dataclass
class Samples:
    latency: list[float] = field(default_factory=list)  # seconds, whole response
    ttft: list[float] = field(default_factory=list)  # seconds, first content byte
    errors: collections.Counter = field(default_factory=collections.Counter)


def chat_body(text: str, stream: bool) -> bytes:
    body: dict = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": text}]}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


async def call_whole(client: httpx.AsyncClient, target: Target, body: bytes, samples: Samples) -> None:
    started = time.perf_counter()
    try:
        response = await client.post(target.base + "/v1/chat/completions", content=body, headers=target.chat_headers)
    except httpx.HTTPError as exc:
        samples.errors[type(exc).__name__] += 1
        return
    elapsed = time.perf_counter() - started
    if response.status_code != 200 or b'"choices"' not in response.content:
        samples.errors[f"HTTP {response.status_code}"] += 1
        return
    samples.latency.append(elapsed)


async def call_stream(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes,
                      marker: re.Pattern[bytes], samples: Samples) -> None:
    started = time.perf_counter()
    first: float | None = None
    seen = bytearray()
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                samples.errors[f"HTTP {response.status_code}"] += 1
                return
            async for chunk in response.aiter_raw():
                if first is None:
                    seen += chunk
                    if marker.search(seen):
                        first = time.perf_counter() - started
    except httpx.HTTPError as exc:
        samples.errors[type(exc).__name__] += 1
        return
    if first is None:
        samples.errors["no content"] += 1
        return
    samples.ttft.append(first)
    samples.latency.append(time.perf_counter() - started)


class RawConnection:
    """One keep-alive HTTP/1.1 connection spoken with plain blocking socket
    calls: a reader whose own work per read (a few microseconds) stays off
    the time it measures, even for an answer that comes in 50 chunks, where
    an HTTP client's per-chunk layers would be counted as the answer's."""

    def __init__(self, base: str) -> None:
        url = urlsplit(base)
        self.host = url.netloc
        self.sock = socket.create_connection((url.hostname, url.port), timeout=REQUEST_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[float, int, bytes]:
        """Seconds from sending the request to the last byte of its answer,
        the answer's status and its body (chunks joined)."""
        lines = [f"POST {path} HTTP/1.1", f"host: {self.host}", f"content-length: {len(body)}",
                 *(f"{name}: {value}" for name, value in headers.items())]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        started = time.perf_counter()
        self.sock.sendall(request)
        status, answer = self._answer()
        return time.perf_counter() - started, status, answer

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    def _answer(self) -> tuple[int, bytes]:
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self._fill()
        head, self.buffer = self.buffer[:end].decode("latin-1").split("\r\n"), self.buffer[end + 4:]
        status = int(head[0].split()[1])
        fields = dict(line.lower().split(": ", 1) for line in head[1:])
        if "content-length" in fields:
            length = int(fields["content-length"])
            while len(self.buffer) < length:
                self._fill()
            answer, self.buffer = self.buffer[:length], self.buffer[length:]
            return status, answer
        parts, pos = [], 0  # chunked: each size line, its data, CRLF; a size of 0 ends it
        while True:
            while (line_end := self.buffer.find(b"\r\n", pos)) < 0:
                self._fill()
            size = int(self.buffer[pos:line_end].split(b";")[0], 16)
            while len(self.buffer) < line_end + 2 + size + 2:
                self._fill()
            if size == 0:
                self.buffer = self.buffer[line_end + 4:]
                return status, b"".join(parts)
            parts.append(self.buffer[line_end + 2:line_end + 2 + size])
            pos = line_end + 2 + size + 2


@dataclass
class RawCall:
    name: str
    base: str
    headers: dict[str, str]
    body: bytes
    complete: bytes  # what a whole answer holds


def raw_latencies(calls: list[RawCall], count: int) -> dict[str, Samples]:
    """``count`` exchanges per call, the calls interleaved, one at a time,
    each over a keep-alive connection of its own read by ``RawConnection``
    (blocking: run it in a thread of its own)."""
    results = {call.name: Samples() for call in calls}
    connections = {call.name: RawConnection(call.base) for call in calls}
    try:
        for _ in range(count):
            for call in calls:
                samples = results[call.name]
                try:
                    elapsed, status, answer = connections[call.name].post(
                        "/v1/chat/completions", call.headers, call.body)
                except OSError as exc:
                    samples.errors[type(exc).__name__] += 1
                    connections[call.name].close()
                    connections[call.name] = RawConnection(call.base)
                    continue
                if status != 200 or call.complete not in answer:
                    samples.errors[f"HTTP {status}"] += 1
                    continue
                samples.latency.append(elapsed)
    finally:
        for connection in connections.values():
            connection.close()
    return results


async def interleaved(targets: list[Target], count: int, concurrency: int, one) -> dict[str, Samples]:
    """``count`` calls per target, alternating targets, spread over ``concurrency`` workers."""
    results = {t.name: Samples() for t in targets}
    jobs = iter([targets[i % len(targets)] for i in range(count * len(targets))])

    async def worker() -> None:
        for target in jobs:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                await one(target, results[target.name])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def clear_simulator(client: httpx.AsyncClient, sim_url: str) -> None:
    # The simulator keeps a record (with the bytes sent) of every request; keep it small.
    with contextlib.suppress(httpx.HTTPError):
        await client.delete(sim_url + "/_sim/records")


# --------------------------------------------------------------------------- the run


async def measure(args: argparse.Namespace, gateway: Target, floor: Target, direct: Target, sim_url: str,
                  pids: dict[str, int]) -> dict:
    """Added latency and time to first token, one request at a time, calls
    through the gateway, through the floor and straight to the simulator
    interleaved."""
    out: dict = {}
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, trust_env=False) as client:
        whole_prompt = "Say hello in fifty words. " + NONSTREAM_DIRECTIVE
        whole = chat_body(whole_prompt, stream=False)
        chat_stream = chat_body("Tell a short story. " + STREAM_DIRECTIVE, stream=True)

        async def one_whole(t: Target, s: Samples) -> None:
            await call_whole(client, t, whole, s)

        async def one_chat_stream(t: Target, s: Samples) -> None:
            await call_stream(client, t.base + "/v1/chat/completions", t.chat_headers, chat_stream, CHAT_CONTENT, s)

        both = [gateway, floor, direct]
        # Warm-up: key and channel caches, the upstream pool, the log writer, both paths' code.
        for one in (one_whole, one_chat_stream):
            warm = await interleaved(both, 30, 1, one)
            bad = {k: dict(v.errors) for k, v in warm.items() if v.errors}
            if bad:
                raise RuntimeError(f"warm-up requests failed: {bad}")
        await clear_simulator(client, sim_url)
        sockets_before = open_sockets(pids["gateway"])
        log("latency, one at a time")
        out["whole_serial"] = await interleaved(both, max(50, args.requests // 4), 1, one_whole)
        log("time to first token, one at a time")
        out["chat_stream_serial"] = await interleaved(both, max(50, args.streams // 2), 1, one_chat_stream)
        # F4: the gateway reads the channel's stream where the bare relay
        # passes on its body; each is held against the exchange it makes.
        log("latency read by a raw socket: the simulator's body and stream, the bare relay, the gateway")
        raw = [RawCall("direct", direct.base, direct.chat_headers, whole, b'"choices"'),
               RawCall("direct stream", direct.base, direct.chat_headers, chat_body(whole_prompt, stream=True),
                       b"[DONE]"),
               RawCall("floor", floor.base, floor.chat_headers, whole, b'"choices"'),
               RawCall("gateway", gateway.base, gateway.chat_headers, whole, b'"choices"')]
        out["whole_raw"] = await asyncio.to_thread(raw_latencies, raw, max(50, args.requests // 4))
        await clear_simulator(client, sim_url)
        sent = sum(len(out[k]["gateway"].latency) + sum(out[k]["gateway"].errors.values())
                   for k in ("whole_serial", "chat_stream_serial", "whole_raw"))
    await asyncio.sleep(1.0)
    # Every request has ended: the gateway holds only its listening socket and idle upstream ones.
    out["sockets"] = {"before": sockets_before, "after": open_sockets(pids["gateway"]), "requests": sent}
    return out


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
