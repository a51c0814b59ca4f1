"""The measurements: interleaved gateway/direct calls, bursts with CPU per request, held-open streams."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass, field

import httpx

from bench.processes import cpu_seconds, open_sockets, rss_mb

REQUEST_TIMEOUT = 30.0  # any single benchmark request
BURST_ROUNDS = 4  # alternating direct/gateway bursts for throughput and CPU
CLEANUP_TIMEOUT = 60.0  # the gateway letting go of held streams' sockets after the clients hang up

CHAT_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-haiku-5-5"
NONSTREAM_DIRECTIVE = "[sim tokens=50]"
STREAM_DIRECTIVE = "[sim tokens=20 pace=0.002]"
OPEN_STREAM_PACE = 600  # seconds between tokens of a held-open stream: far longer than the measurement
CHAT_CONTENT = re.compile(rb'"content":"[^"]')  # a non-empty content delta (the role preamble has "")
ANTHROPIC_CONTENT = re.compile(rb"content_block_delta")


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


def anthropic_body(text: str) -> bytes:
    return json.dumps({
        "model": ANTHROPIC_MODEL, "max_tokens": 256, "stream": True,
        "messages": [{"role": "user", "content": text}],
    }).encode()


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


async def measure(args: argparse.Namespace, gateway: Target, direct: Target, sim_url: str,
                  pids: dict[str, int], profiler_factory) -> dict:
    out: dict = {}
    c = args.concurrency
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT, trust_env=False) as client:
        whole = chat_body("Say hello in fifty words. " + NONSTREAM_DIRECTIVE, stream=False)
        chat_stream = chat_body("Tell a short story. " + STREAM_DIRECTIVE, stream=True)
        anth_stream = anthropic_body("Tell a short story. " + STREAM_DIRECTIVE)

        async def one_whole(t: Target, s: Samples) -> None:
            await call_whole(client, t, whole, s)

        async def one_chat_stream(t: Target, s: Samples) -> None:
            await call_stream(client, t.base + "/v1/chat/completions", t.chat_headers, chat_stream, CHAT_CONTENT, s)

        async def one_anth_stream(t: Target, s: Samples) -> None:
            await call_stream(client, t.base + "/v1/messages", t.anthropic_headers, anth_stream, ANTHROPIC_CONTENT, s)

        both = [gateway, direct]
        # Warm-up: key and channel caches, the upstream pool, the log writer, both paths' code.
        for one in (one_whole, one_chat_stream, one_anth_stream):
            warm = await interleaved(both, 30, c, one)
            bad = {k: dict(v.errors) for k, v in warm.items() if v.errors}
            if bad:
                raise RuntimeError(f"warm-up requests failed: {bad}")
        await clear_simulator(client, sim_url)
        if args.open_streams:
            # Right after the warm-up: a baseline heap with every code path loaded.
            out["open"] = await open_streams(args.open_streams, gateway, pids["gateway"])
        await asyncio.sleep(1.0)
        sockets_before = open_sockets(pids["gateway"])

        log("non-streaming, serial")
        out["whole_serial"] = await interleaved(both, max(50, args.requests // 4), 1, one_whole)
        log(f"non-streaming, concurrency {c}")
        out["whole"] = await interleaved(both, args.requests, c, one_whole)
        await clear_simulator(client, sim_url)
        log("chat streams")
        out["chat_stream"] = await interleaved(both, args.streams, c, one_chat_stream)
        await clear_simulator(client, sim_url)
        log("anthropic streams")
        out["anth_stream"] = await interleaved(both, args.streams, c, one_anth_stream)
        await clear_simulator(client, sim_url)

        # Bursts against one target at a time: throughput and CPU per request.
        # Direct and gateway bursts alternate in rounds, so a slow spell of the
        # machine hits both; the totals over all rounds are reported.
        log(f"bursts: {BURST_ROUNDS} rounds of direct-only then gateway-only requests")
        totals = {t.name: {"wall": 0.0, "done": 0, "errors": collections.Counter(),
                           "cpu": dict.fromkeys(pids, 0.0)} for t in (direct, gateway)}
        profiler = profiler_factory()
        try:
            for round_ in range(BURST_ROUNDS):
                size = args.requests // BURST_ROUNDS + (round_ < args.requests % BURST_ROUNDS)
                for target in (direct, gateway):
                    total = totals[target.name]
                    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    started = time.perf_counter()
                    burst = (await interleaved([target], size, c, one_whole))[target.name]
                    total["wall"] += time.perf_counter() - started
                    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    for name in pids:
                        total["cpu"][name] += after[name] - before[name]
                    total["done"] += len(burst.latency)
                    total["errors"].update(burst.errors)
                    await clear_simulator(client, sim_url)
        finally:
            if profiler is not None:
                profiler.stop()
        if profiler is not None:
            out["profile"] = profiler.report()
        for name, total in totals.items():
            total["cpu"] = {k: v / max(total["done"], 1) for k, v in total["cpu"].items()}
            out[f"burst_{name}"] = total
        sent = sum(len(out[k]["gateway"].latency) + sum(out[k]["gateway"].errors.values())
                   for k in ("whole_serial", "whole", "chat_stream", "anth_stream"))
        sent += out["burst_gateway"]["done"] + sum(out["burst_gateway"]["errors"].values())
    # Every request has ended and this client's C keep-alive connections are all
    # the gateway should still hold, plus its listening socket and idle upstream ones.
    await asyncio.sleep(2.0)
    out["sockets"] = {"before": sockets_before, "after": open_sockets(pids["gateway"]), "requests": sent}
    return out


async def open_streams(count: int, gateway: Target, gateway_pid: int) -> dict:
    log(f"opening {count} concurrent streams")
    body = chat_body(f"Hold on. [sim tokens=3 pace={OPEN_STREAM_PACE}]", stream=True)
    limits = httpx.Limits(max_connections=count + 16, max_keepalive_connections=0)
    timeout = httpx.Timeout(REQUEST_TIMEOUT, read=None)
    rss_before, fds_before = rss_mb(gateway_pid), open_sockets(gateway_pid)
    opened = 0
    all_open, release = asyncio.Event(), asyncio.Event()
    errors: collections.Counter = collections.Counter()
    gate = asyncio.Semaphore(256)  # connections being set up at once

    def settled() -> None:
        if opened + sum(errors.values()) >= count:
            all_open.set()

    async def hold(client: httpx.AsyncClient) -> None:
        nonlocal opened
        try:
            async with gate:
                stream = client.stream("POST", gateway.base + "/v1/chat/completions", content=body,
                                       headers=gateway.chat_headers)
                response = await stream.__aenter__()
            try:
                if response.status_code != 200:
                    errors[f"HTTP {response.status_code}"] += 1
                    return
                # Keep a reference to the iterator: a dropped one is finalized,
                # and that closes the response (and the connection) at once.
                chunks = response.aiter_raw()
                seen = bytearray()
                try:
                    while not CHAT_CONTENT.search(seen):
                        seen += await chunks.__anext__()
                except StopAsyncIteration:
                    errors["ended early"] += 1
                    return
                opened += 1
                settled()
                await release.wait()
                await chunks.aclose()
            finally:
                await stream.__aexit__(None, None, None)
        except httpx.HTTPError as exc:
            errors[type(exc).__name__] += 1
        finally:
            settled()

    result: dict = {"count": count}
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        started = time.perf_counter()
        tasks = [asyncio.create_task(hold(client)) for _ in range(count)]
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(180):
                    await all_open.wait()
            result["open_seconds"] = time.perf_counter() - started
            await asyncio.sleep(1.0)  # let the allocator settle
            result.update(opened=opened, errors=dict(errors), rss_before=rss_before, rss_open=rss_mb(gateway_pid),
                          fds_before=fds_before, fds_open=open_sockets(gateway_pid))
        finally:
            release.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(60):
                    await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                task.cancel()
    # The gateway notices the hang-ups, cancels its views and hangs up upstream.
    closed_at = time.perf_counter()
    deadline = closed_at + CLEANUP_TIMEOUT
    while open_sockets(gateway_pid) > fds_before + 4 and time.perf_counter() < deadline:
        await asyncio.sleep(0.25)
    result["cleanup_seconds"] = time.perf_counter() - closed_at
    result["rss_closed"] = rss_mb(gateway_pid)
    result["fds_closed"] = open_sockets(gateway_pid)
    return result


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

