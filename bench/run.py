#!/usr/bin/env python
"""HopBase gateway overhead benchmark: what the gateway adds on top of its upstream.

Usage (from the project folder, with the project's virtualenv)::

    .venv/bin/python bench/run.py [--requests N] [--concurrency C] [--streams S]
                                  [--open-streams [S]] [--py-spy PATH] [--keep]

Self-contained: it makes a fresh SQLite database in a temporary folder
(``DATABASE_URL=sqlite:////tmp/hopbase-bench-.../bench.sqlite3``; the
developer's ``db.sqlite3`` is never touched), runs ``manage.py migrate`` and
``manage.py demo`` against it, and starts two processes on free loopback ports:

- the upstream simulator: ``python manage.py simulate_upstream --port P``;
- the gateway: ``daphne -v 0 -e tcp:port=P:interface=127.0.0.1:backlog=4096
  hopbase.asgi:application`` (verbosity 0 = no access log; a 4096 backlog so a
  burst of connections is not dropped), with production-like settings:
  ``HOPBASE_LOG_LEVEL=WARNING``, no ``REDIS_URL`` (in-process mode), every
  other setting at its default.

Then it measures, from one shared ``httpx.AsyncClient`` (keep-alive, at most C
connections), interleaving gateway and direct calls (gateway, direct, gateway,
... handed to C workers) so machine noise hits both alike:

1. non-streaming Chat Completions (``[sim tokens=50]``): latency p50/p99 via
   the gateway and directly against the simulator with the same body, once
   serially (C=1) and once at concurrency C; "added" = gateway - direct;
2. streaming Chat Completions (with ``stream_options.include_usage`` so both
   paths ask the simulator for the same stream) and Anthropic Messages
   (``[sim tokens=50 pace=0.002]``): time to first content byte (the first
   chunk carrying a non-empty ``content`` delta / a ``content_block_delta``)
   and total time, p50/p99;
3. N non-streaming requests at concurrency C sent only to the gateway, and N
   only to the simulator for reference, in 4 alternating rounds (direct,
   gateway, direct, ...): requests/s, and CPU time per request of
   the gateway process (``/proc/PID/stat`` utime+stime, all its threads,
   including the request-log writer), of the simulator and of this client;
4. with ``--open-streams [S]`` (default off; 2000 when given without a number):
   S concurrent slow Chat streams (``[sim tokens=3 pace=600]``, held open until
   measured, then closed), and the gateway's RSS growth (``/proc/PID/status``
   VmRSS) and open descriptors per stream. Each stream costs two sockets in
   the gateway; the soft ``RLIMIT_NOFILE`` is raised to the hard limit here
   and inherited by the children. Above 2000 streams the gateway's upstream
   pool (``HOPBASE_UPSTREAM_MAX_CONNECTIONS``, default 2000) is raised to fit.

``--py-spy PATH`` samples the gateway with that py-spy binary (install it in a
throwaway venv, it is not a project dependency) during the burst rounds (in
``--gil`` mode, so idle threads and the idle gateway during direct rounds add
no samples) and prints the hottest functions; the CPU figures of such a run
include py-spy's sampling overhead. ``--keep`` keeps the temporary folder (database, process
logs). Defaults finish in about a minute on a 2-core machine. Every process it
starts is stopped on the way out, Ctrl-C included.

Output: the exact command line and settings, then a Markdown table (what,
gateway, direct, added) plus requests/s and CPU ms per request.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
REQUEST_TIMEOUT = 30.0  # any single benchmark request
START_TIMEOUT = 60.0  # a child process becoming ready
BURST_ROUNDS = 4  # alternating direct/gateway bursts for throughput and CPU
CLEANUP_TIMEOUT = 60.0  # the gateway letting go of held streams' sockets after the clients hang up

CHAT_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-haiku-5-5"
NONSTREAM_DIRECTIVE = "[sim tokens=50]"
STREAM_DIRECTIVE = "[sim tokens=20 pace=0.002]"
OPEN_STREAM_PACE = 600  # seconds between tokens of a held-open stream: far longer than the measurement
CHAT_CONTENT = re.compile(rb'"content":"[^"]')  # a non-empty content delta (the role preamble has "")
ANTHROPIC_CONTENT = re.compile(rb"content_block_delta")


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the benchmark itself is killed outright."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
        )
        self.pid = self.process.pid

    def wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1, trust_env=False).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not answer {url} within {START_TIMEOUT:.0f} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def open_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def raise_fd_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def manage(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


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


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --------------------------------------------------------------------------- py-spy


class Profiler:
    def __init__(self, py_spy: str, pid: int, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--gil",
             "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        time.sleep(1.0)  # let it attach before the burst starts

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def report(self, top: int = 25) -> str:
        if not self.out.exists():
            return f"py-spy wrote nothing ({self.process.stderr.read().decode(errors='replace')[-500:] if self.process.stderr else ''})"
        own: collections.Counter = collections.Counter()
        inclusive: collections.Counter = collections.Counter()
        total = 0
        for line in self.out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
            if not frames:
                continue
            total += n
            own[_short(frames[-1])] += n
            for name in {_short(f) for f in frames}:
                inclusive[name] += n
        lines = [f"py-spy --gil: {total} samples of the gateway (whichever thread holds the GIL, so ~ its Python CPU) during the burst rounds; raw stacks in {self.out}",
                 "", "| self % | function |", "|---:|---|"]
        lines += [f"| {100 * n / total:.1f} | `{name}` |" for name, n in own.most_common(top)]
        lines += ["", "| inclusive % | function |", "|---:|---|"]
        lines += [f"| {100 * n / total:.1f} | `{name}` |" for name, n in inclusive.most_common(top * 2)]
        return "\n".join(lines)


def _short(frame: str) -> str:
    """'func (path/to/site-packages/pkg/mod.py:12)' -> 'func (pkg/mod.py:12)'."""
    frame = re.sub(r"\(.*?site-packages/", "(", frame)
    frame = frame.replace(str(ROOT) + "/", "")
    return re.sub(r":\d+\)$", ")", frame)  # group by function, not by line


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


# --------------------------------------------------------------------------- the report


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def report(args: argparse.Namespace, settings: list[str], res: dict) -> str:
    c = args.concurrency
    rows: list[tuple[str, str, str, str]] = []

    def latency_rows(label: str, key: str, attr: str) -> None:
        gw, dr = res[key]["gateway"], res[key]["direct"]
        for q in (0.5, 0.99):
            g, d = percentile(getattr(gw, attr), q), percentile(getattr(dr, attr), q)
            rows.append((f"{label} p{round(q * 100)}", ms(g), ms(d), f"{(g - d) * 1000:+.2f} ms"))

    latency_rows("chat non-stream latency, C=1", "whole_serial", "latency")
    latency_rows(f"chat non-stream latency, C={c}", "whole", "latency")
    latency_rows(f"chat stream TTFT, C={c}", "chat_stream", "ttft")
    latency_rows(f"chat stream total, C={c}", "chat_stream", "latency")
    latency_rows(f"anthropic stream TTFT, C={c}", "anth_stream", "ttft")
    latency_rows(f"anthropic stream total, C={c}", "anth_stream", "latency")
    bg, bd = res["burst_gateway"], res["burst_direct"]
    rps_g, rps_d = bg["done"] / bg["wall"], bd["done"] / bd["wall"]
    rows.append((f"chat non-stream throughput, C={c}", f"{rps_g:.0f} req/s", f"{rps_d:.0f} req/s",
                 f"{(1 / rps_g - 1 / rps_d) * 1000:+.2f} ms/req wall"))
    rows.append(("CPU per request: gateway process", ms(bg["cpu"]["gateway"]), "—", ms(bg["cpu"]["gateway"])))
    rows.append(("CPU per request: simulator process", ms(bg["cpu"]["simulator"]), ms(bd["cpu"]["simulator"]),
                 f"{(bg['cpu']['simulator'] - bd['cpu']['simulator']) * 1000:+.2f} ms"))
    rows.append(("CPU per request: bench client", ms(bg["cpu"]["client"]), ms(bd["cpu"]["client"]),
                 f"{(bg['cpu']['client'] - bd['cpu']['client']) * 1000:+.2f} ms"))
    total_g = sum(bg["cpu"].values())
    total_d = sum(bd["cpu"].values())
    rows.append(("CPU per request: all three", ms(total_g), ms(total_d), f"{(total_g - total_d) * 1000:+.2f} ms"))
    if "open" in res:
        o = res["open"]
        n = max(o["opened"], 1)
        rows.append((f"open streams: {o['opened']}/{o['count']} held (opened in {o['open_seconds']:.1f} s)",
                     f"RSS {o['rss_before']:.0f} -> {o['rss_open']:.0f} MB", "—",
                     f"{(o['rss_open'] - o['rss_before']) * 1024 / n:.1f} KB/stream"))
        rows.append(("open streams: gateway sockets",
                     f"{o['fds_before']} -> {o['fds_open']}", "—", f"{(o['fds_open'] - o['fds_before']) / n:.2f} sockets/stream"))
        rows.append((f"open streams: all hung up; {o['cleanup_seconds']:.1f} s later",
                     f"RSS {o['rss_closed']:.0f} MB, {o['fds_closed']} sockets", "—",
                     "" if o["fds_closed"] <= o["fds_before"] + 4 else f"gave up after {CLEANUP_TIMEOUT:.0f} s"))
    sk = res["sockets"]
    rows.append((f"gateway sockets still open after {sk['requests']} requests ended",
                 f"{sk['before']} -> {sk['after']}", "—", f"{(sk['after'] - sk['before']) * 100 / max(sk['requests'], 1):+.1f} per 100 req"))

    lines = ["## HopBase gateway overhead", "", "```", *settings, "```", "",
             "| what | gateway | direct | added |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c_} | {d} |" for a, b, c_, d in rows]
    errors = []
    for key in ("whole_serial", "whole", "chat_stream", "anth_stream"):
        for name, samples in res[key].items():
            if samples.errors:
                errors.append(f"{key}/{name}: {dict(samples.errors)}")
    for key in ("burst_gateway", "burst_direct"):
        if res[key]["errors"]:
            errors.append(f"{key}: {dict(res[key]['errors'])}")
    if "open" in res and res["open"]["errors"]:
        errors.append(f"open streams: {res['open']['errors']}")
    lines += ["", "errors: " + ("; ".join(errors) if errors else "none")]
    counts = {k: len(res[k]["gateway"].latency) for k in ("whole_serial", "whole", "chat_stream", "anth_stream")}
    lines.append(f"samples per target: {counts}; bursts: {bg['done']} gateway, {bd['done']} direct requests")
    return "\n".join(lines)


def gateway_log_summary(path: Path) -> str:
    """Warnings and errors the gateway logged, counted by kind."""
    kinds: collections.Counter = collections.Counter()
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            match = re.match(r"\S+ \S+ (WARNING|ERROR|CRITICAL) (\S+) (.*)", line)
            if match:
                message = re.sub(r"<.*>|\b\d+\b|'[^']*'", "…", match.group(3))
                if len(message) > 90:
                    message = message[:40] + " … " + message[-45:]
                kinds[f"{match.group(1)} {match.group(2)}: {message}"] += 1
            elif line.startswith("Traceback"):
                kinds["traceback"] += 1
    if not kinds:
        return "gateway log: no warnings"
    return "gateway log: " + "; ".join(f"{n}x {kind}" for kind, n in kinds.most_common(6))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="non-streaming requests per target (and per burst)")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent client requests")
    parser.add_argument("--streams", type=int, default=150, help="streaming requests per protocol per target")
    parser.add_argument("--open-streams", type=int, nargs="?", const=2000, default=0,
                        help="hold this many streams open and measure the gateway's memory (default off; 2000 if bare)")
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy binary: sample the gateway during its burst")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (database, logs)")
    args = parser.parse_args()
    if min(args.requests, args.concurrency, args.streams) < 1 or args.open_streams < 0:
        parser.error("counts must be positive")

    soft, hard = raise_fd_limit()
    # Each held stream: 2 fds in the gateway, 1 in this client, 1 in the simulator, plus headroom.
    if args.open_streams and args.open_streams * 2 + 200 > soft:
        parser.error(f"--open-streams {args.open_streams} needs about {args.open_streams * 2 + 200} descriptors "
                     f"in the gateway; the limit is {soft}")

    # Ctrl-C and SIGTERM raise KeyboardInterrupt wherever the run is (asyncio.run's
    # own SIGINT handling only cancels the main task, which a finishing wait can
    # swallow on Python 3.11); the finally below stops every child.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)

    tmp = Path(tempfile.mkdtemp(prefix="hopbase-bench-"))
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update({
        "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
        "HOPBASE_LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "hopbase.settings",
        "PYTHONUNBUFFERED": "1",
    })
    for name in list(env):
        if name.startswith("HOPBASE_") and name != "HOPBASE_LOG_LEVEL":
            del env[name]  # every other setting at its default
    if args.open_streams > 2000:
        env["HOPBASE_UPSTREAM_MAX_CONNECTIONS"] = str(args.open_streams + 100)
    children: list[Child] = []
    profilers: list[Profiler] = []
    try:
        sim_port, gw_port = free_port(), free_port()
        sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
        log(f"temporary folder {tmp}")
        manage(["migrate", "--verbosity", "0"], env)
        demo = manage(["demo", "--simulator-url", sim_url, "--gateway-url", gw_url], env).splitlines()
        key = demo[3].strip() if len(demo) > 3 else ""
        if not key or " " in key:
            raise RuntimeError(f"could not read the demo key from line 4 of:\n{chr(10).join(demo[:6])}")

        sim_args = [sys.executable, "manage.py", "simulate_upstream", "--host", "127.0.0.1", "--port", str(sim_port)]
        daphne = [str(BIN / "daphne")] if (BIN / "daphne").exists() else [sys.executable, "-m", "daphne"]
        gw_args = [*daphne, "-v", "0", "-e", f"tcp:port={gw_port}:interface=127.0.0.1:backlog=4096",
                   "hopbase.asgi:application"]
        children.append(Child("simulator", sim_args, env, tmp))
        children[-1].wait_ready(sim_url + "/_sim/health")
        children.append(Child("gateway", gw_args, env, tmp))
        children[-1].wait_ready(gw_url + "/healthz")
        sim, gw = children
        log(f"simulator pid {sim.pid} at {sim_url}; gateway pid {gw.pid} at {gw_url}")

        shown_env = {k: v for k, v in env.items() if k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONUNBUFFERED")
                     or k.startswith("HOPBASE_")}
        settings = [
            "command:   " + shlex.join([Path(sys.executable).name, *sys.argv]),
            f"effective: --requests {args.requests} --concurrency {args.concurrency} --streams {args.streams}"
            f" --open-streams {args.open_streams}" + (f" --py-spy {args.py_spy}" if args.py_spy else ""),
            "env:       " + " ".join(f"{k}={v}" for k, v in sorted(shown_env.items())) + " (REDIS_URL unset)",
            "gateway:   " + shlex.join([Path(gw_args[0]).name, *gw_args[1:]]),
            "simulator: " + shlex.join(["python", *sim_args[1:]]),
            f"machine:   {os.cpu_count()} CPUs, Python {platform.python_version()}, httpx {httpx.__version__},"
            f" RLIMIT_NOFILE {soft}/{hard}",
            f"bodies:    chat {NONSTREAM_DIRECTIVE} non-stream; chat (include_usage) and anthropic streams"
            f" {STREAM_DIRECTIVE}",
        ]

        gateway = Target("gateway", gw_url, {"authorization": f"Bearer {key}", "content-type": "application/json"},
                         {"x-api-key": key, "anthropic-version": "2023-06-01", "content-type": "application/json"})
        direct = Target("direct", sim_url, {"authorization": "Bearer sk-simulated", "content-type": "application/json"},
                        {"x-api-key": "sk-simulated", "anthropic-version": "2023-06-01",
                         "content-type": "application/json"})
        pids = {"gateway": gw.pid, "simulator": sim.pid, "client": os.getpid()}

        def profiler_factory() -> Profiler | None:
            if not args.py_spy:
                return None
            profilers.append(Profiler(args.py_spy, gw.pid, tmp / "gateway-py-spy.txt"))
            return profilers[-1]

        started = time.monotonic()
        results = asyncio.run(measure(args, gateway, direct, sim_url, pids, profiler_factory))
        settings.append(f"duration:  {time.monotonic() - started:.1f} s of measuring")
        for child in children:
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} died during the run:\n{child.log_tail()}")
        text = report(args, settings, results)
        print(text + "\n" + gateway_log_summary(gw.log_path))
        if "profile" in results:
            print()
            print(results["profile"])
            args.keep = True  # the raw stacks live in the temporary folder
        return 0
    except KeyboardInterrupt:
        log("interrupted; stopping the processes")
        return 130
    except RuntimeError as exc:
        log(f"failed: {exc}")
        for child in children:
            log(f"--- {child.name} log tail ---\n{child.log_tail()}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish cleaning up
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for profiler in profilers:
            profiler.stop()
        for child in reversed(children):
            child.stop()
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
