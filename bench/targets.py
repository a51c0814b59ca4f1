"""The measurements behind issue 13's targets: CPU per request and per event
against the bare relay (bench/floor.py), the translated stream, two processes
under ``manage.py serve``, and many streams held open over them; and the
cloud channels' (rule C) against the vendors' own: a stream over Bedrock and
Vertex against the same over an Anthropic or Gemini channel, and Bedrock's
event stream against SSE, event by event."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx

from bench.measure import CHAT_CONTENT, REQUEST_TIMEOUT, Samples, Target, chat_body, interleaved, log
from bench.processes import cpu_seconds, rss_mb
from channels_pool.http_client import resume_only_where_paused
from core.sse import EventSplitter

# Alternating rounds per CPU comparison: the ratio is over all of them, and
# the range of the rounds' own shows how far this noisy machine moves one.
ROUNDS = 8
LONG_STREAM = "[sim tokens=200]"  # a long stream of small events, sent as fast as the simulator can
TRANSLATED_STREAM = "[sim tokens=48]"  # with its preamble and end, about 50 events
# Tokens of the non-stream answers measured: 50; 16, what issue 13 was
# measured with; one, what a request costs apart from its events.
WHOLE_ANSWERS = (50, 16, 1)
HOLD_PACE = 600  # seconds between tokens of a held-open stream
# The cloud rows use the demo's models (hopbase/management/commands/demo.py),
# each served by one channel only: (leg, model) per client API, the vendor's
# own channel first, the one the clouds are held against.
MESSAGES_LEGS = (("anthropic", "claude-sonnet-5-5"), ("bedrock", "bedrock-claude"), ("vertex claude", "vertex-claude"))
GEMINI_LEGS = (("gemini", "gemini-2.5-flash"), ("vertex gemini", "vertex-gemini"))
CLOUD_STREAM = TRANSLATED_STREAM  # about 50 events, as the translated stream
# 4 ms between tokens: each event a read of its own, as from a provider
# generating them (unpaced, a busy gateway finds several in one read, and
# what is done per read is hidden). Paced streams mostly wait, so more run
# at once to keep the rounds short.
PACED_STREAM = "[sim tokens=100 pace=0.004]"
PACED_CONCURRENCY = 16
ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}
SSE_DATA = re.compile(rb"^data:", re.MULTILINE)


async def quiet_cpu(pids: list[int], within: float = 5.0) -> dict[int, float]:
    """The processes' CPU seconds as they went idle: what a round set off
    in the background (the log writer's batch, 0.2 s after a record, and
    settlement) is counted in that round, not lost, nor counted in the
    next; the idle time after it is not (its timers would weigh on a short
    round). Idle: under a millisecond of CPU in the 0.3 s that followed;
    waited for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    readings = [{pid: cpu_seconds(pid) for pid in pids}]
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        readings = [*readings[-6:], {pid: cpu_seconds(pid) for pid in pids}]
        if len(readings) == 7 and sum(readings[-1].values()) - sum(readings[0].values()) < 0.001:
            return readings[0]
    return readings[-1]


async def cpu_rounds(targets: list[Target], pids: dict[str, list[int]], count: int, concurrency: int,
                     one: Callable[[Target, Samples], Awaitable[None]]) -> dict[str, dict]:
    """``count`` calls per target in ``ROUNDS`` alternating rounds, one target
    at a time; per target the calls done, their errors and the CPU seconds of
    the processes named in ``pids[target.name]`` (summed), in all and in each
    round (``rounds``: CPU seconds per call)."""
    totals = {t.name: {"done": 0, "cpu": 0.0, "errors": collections.Counter(), "per_pid": collections.Counter(),
                       "rounds": []} for t in targets}
    for round_ in range(ROUNDS):
        size = count // ROUNDS + (round_ < count % ROUNDS)
        # Every other round in the opposite order: no target always runs
        # right after the same other one.
        for target in targets if round_ % 2 == 0 else targets[::-1]:
            watched = pids[target.name]
            before = await quiet_cpu(watched)
            samples = (await interleaved([target], size, concurrency, one))[target.name]
            after = await quiet_cpu(watched)
            total = totals[target.name]
            in_round = 0.0
            for pid in watched:
                spent = after[pid] - before[pid]
                in_round += spent
                total["per_pid"][pid] += spent
            total["cpu"] += in_round
            total["rounds"].append(in_round / max(len(samples.latency), 1))
            total["done"] += len(samples.latency)
            total["errors"].update(samples.errors)
    return totals


One = Callable[[Target, Samples], Awaitable[None]]


def named_legs(legs: list[tuple[str, Target, One]], pids: dict[str, list[int]]
               ) -> tuple[list[Target], dict[str, list[int]], One]:
    """``cpu_rounds``' targets, pids and ``one`` for legs of their own names
    (one target called with different bodies, say): each leg's call."""
    ones = {name: one for name, _, one in legs}

    async def one_of_its_leg(t: Target, s: Samples) -> None:
        await ones[t.name](t, s)

    targets = [dataclasses.replace(target, name=name) for name, target, _ in legs]
    return targets, {name: pids[target.name] for name, target, _ in legs}, one_of_its_leg


async def bare_stream_reads(direct: Target, tokens: int, count: int, concurrency: int) -> float:
    """CPU seconds of this process per chat stream of ``tokens`` tokens read
    from the simulator by a bare aiohttp client, events split and nothing
    else: what reading a channel's stream costs any gateway on this stack
    (F4 makes the gateway read one for every non-stream answer)."""
    body = chat_body(f"Say hello. [sim tokens={tokens}]", stream=True)
    connector = aiohttp.TCPConnector(limit=concurrency)
    resume_only_where_paused(connector)  # read as the gateway reads
    async with aiohttp.ClientSession(connector=connector) as session:

        async def read_one() -> None:
            async with session.post(direct.base + "/v1/chat/completions", data=body,
                                    headers=direct.chat_headers) as response:
                splitter, events = EventSplitter(), 0
                while chunk := await response.content.readany():
                    events += len(splitter.feed(chunk))
                if events <= tokens:
                    raise RuntimeError(f"a {tokens}-token stream from the simulator had only {events} events")

        async def reader(calls: int) -> None:
            for _ in range(calls):
                await read_one()

        await reader(concurrency)  # warm-up: connections open
        started = time.process_time()
        await asyncio.gather(*(reader(count // concurrency) for _ in range(concurrency)))
        return (time.process_time() - started) / (count // concurrency * concurrency)


async def stream_events(client: httpx.AsyncClient, target: Target, body: bytes,
                        path: str = "/v1/chat/completions", headers: dict[str, str] | None = None) -> int:
    """Events in one stream's answer (its SSE data lines), or minus the status of a refusal."""
    response = await client.post(target.base + path, content=body, headers=headers or target.chat_headers)
    if response.status_code != 200:
        return -response.status_code
    return len(SSE_DATA.findall(response.content))


@dataclasses.dataclass(frozen=True)
class StreamCall:
    """One streamed request of a client API: where it goes and what it says."""

    path: str
    headers: dict[str, str]
    body: bytes


def messages_call(target: Target, model: str, directive: str) -> StreamCall:
    body = {"model": model, "max_tokens": 1024, "stream": True,
            "messages": [{"role": "user", "content": "Tell a story. " + directive}]}
    return StreamCall("/v1/messages", {**target.chat_headers, **ANTHROPIC_VERSION}, json.dumps(body).encode())


def gemini_call(target: Target, model: str, directive: str) -> StreamCall:
    body = {"contents": [{"role": "user", "parts": [{"text": "Tell a story. " + directive}]}]}
    return StreamCall(f"/v1beta/models/{model}:streamGenerateContent?alt=sse", target.chat_headers,
                      json.dumps(body).encode())


def one_stream_call(client: httpx.AsyncClient, call: StreamCall) -> One:
    """A whole stream of ``call``, read to its end, timed in ``s``."""
    async def one(t: Target, s: Samples) -> None:
        started = time.perf_counter()
        async with client.stream("POST", t.base + call.path, content=call.body, headers=call.headers) as response:
            async for _ in response.aiter_raw():
                pass
        if response.status_code == 200:
            s.latency.append(time.perf_counter() - started)
        else:
            s.errors[f"HTTP {response.status_code}"] += 1
    return one


async def cloud_rounds(client: httpx.AsyncClient, gateway: Target, pids: dict[str, list[int]], calls: dict[str, StreamCall],
                       count: int, concurrency: int) -> tuple[dict[str, int], dict[str, dict] | None]:
    """Each leg's events in one answer, then ``cpu_rounds`` over the legs, all
    on the one gateway process; no rounds if a leg is refused (its events
    negative: minus the status)."""
    events = {name: await stream_events(client, gateway, call.body, call.path, call.headers)
              for name, call in calls.items()}
    if min(events.values()) <= 0:
        return events, None
    legs = [(name, gateway, one_stream_call(client, call)) for name, call in calls.items()]
    targets, leg_pids, one = named_legs(legs, pids)
    await interleaved(targets, 10, concurrency, one)  # warm-up: a Vertex token, each channel's connections
    return events, await cpu_rounds(targets, leg_pids, count, concurrency, one)


async def measure_clouds(args, gateway: Target, sim_url: str, pids: dict[str, list[int]]) -> dict:
    """CPU per stream over the cloud channels against the vendors' own (the
    same answer, passed through on both), and per event of a paced stream:
    Bedrock's event stream decoded against Anthropic's SSE passed on."""
    out: dict = {}
    c = args.concurrency
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=PACED_CONCURRENCY), timeout=REQUEST_TIMEOUT,
                                 trust_env=False) as client:
        calls = {name: messages_call(gateway, model, CLOUD_STREAM) for name, model in MESSAGES_LEGS}
        calls |= {name: gemini_call(gateway, model, CLOUD_STREAM) for name, model in GEMINI_LEGS}
        log(f"CPU per stream of about 50 events: {', '.join(calls)}")
        out["cloud_events"], out["clouds"] = await cloud_rounds(client, gateway, pids, calls, args.streams, c)
        await client.delete(sim_url + "/_sim/records")
        paced = {f"{name} paced": messages_call(gateway, model, PACED_STREAM) for name, model in MESSAGES_LEGS[:2]}
        log(f"CPU per event of paced streams ({PACED_STREAM}): {', '.join(paced)}")
        out["paced_events"], out["paced"] = await cloud_rounds(client, gateway, pids, paced, args.streams,
                                                               PACED_CONCURRENCY)
        await client.delete(sim_url + "/_sim/records")
    return out


# Embeddings (issue 27): the demo's models, a 1,536-number vector each.
EMBEDDING_LEGS = (("passed through", "text-embedding-3-small"), ("translated", "vertex-embedding"))
EMBEDDING_DIMENSIONS = 1536
EMBEDDING_INPUT = "The quick brown fox jumps over the lazy dog"


def embedding_body(model: str, encoding: str) -> bytes:
    return json.dumps({"model": model, "input": EMBEDDING_INPUT, "dimensions": EMBEDDING_DIMENSIONS,
                       "encoding_format": encoding}).encode()


async def measure_embeddings(args, gateway: Target, floor: Target, sim_url: str, pids: dict[str, list[int]]) -> dict:
    """CPU per embeddings request, a 1,536-number answer: the bare relay
    against the gateway passing an OpenAI channel's floats and its base64
    through, and translating a Vertex ``:predict`` answer into floats."""
    c = args.concurrency
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT, trust_env=False) as client:

        def one_of(body: bytes) -> One:
            async def one(t: Target, s: Samples) -> None:
                started = time.perf_counter()
                response = await client.post(t.base + "/v1/embeddings", content=body, headers=t.chat_headers)
                if response.status_code == 200:
                    s.latency.append(time.perf_counter() - started)
                else:
                    s.errors[f"HTTP {response.status_code}"] += 1
            return one

        passed, translated = (model for _, model in EMBEDDING_LEGS)
        legs = [("floor float", floor, one_of(embedding_body(passed, "float"))),
                ("gateway float", gateway, one_of(embedding_body(passed, "float"))),
                ("gateway base64", gateway, one_of(embedding_body(passed, "base64"))),
                ("gateway translated", gateway, one_of(embedding_body(translated, "float")))]
        targets, leg_pids, one = named_legs(legs, pids)
        await interleaved(targets, 20, c, one)  # warm-up: connections, a Vertex token
        log(f"CPU per embeddings request ({EMBEDDING_DIMENSIONS} dimensions): " + ", ".join(name for name, *_ in legs))
        found = await cpu_rounds(targets, leg_pids, args.requests, c, one)
        await client.delete(sim_url + "/_sim/records")
    return found


def serve_workers(serve_pid: int) -> list[int]:
    with open(f"/proc/{serve_pid}/task/{serve_pid}/children") as f:
        return [int(pid) for pid in f.read().split()]


async def open_streams(count: int, target: Target, sim_url: str, worker_pids: list[int],
                       hangs_up: bool = True) -> dict:
    """``count`` chat streams opened at once over raw sockets (the client's
    own cost kept small), each held until its first content byte arrives;
    then all closed, and the simulator asked whether every upstream request
    saw its caller hang up (not asked of a relay that ``hangs_up`` False:
    the bare relay does not pass a client's leaving on, and leaves its
    upstream requests open until it is stopped)."""
    log(f"opening {count} streams at once")
    tag = f"hold{int(time.time())}"
    body = chat_body(f"Hold on. [sim tokens=3 pace={HOLD_PACE} tag={tag}]", stream=True)
    host, port = target.base.removeprefix("http://").split(":")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in target.chat_headers.items())
            + f"content-length: {len(body)}\r\n\r\n").encode() + body
    rss_before = sum(rss_mb(pid) for pid in worker_pids)
    writers: list[asyncio.StreamWriter] = []
    errors: collections.Counter = collections.Counter()
    opened_at: list[float] = []
    connected_at: list[float] = []

    async def hold() -> None:
        try:
            reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 16)
            connected_at.append(time.perf_counter())
            writers.append(writer)
            writer.write(head)
            seen = b""
            while not CHAT_CONTENT.search(seen):
                data = await reader.read(65536)
                if not data:
                    errors["closed early: " + (seen[:12].decode(errors="replace") or "no answer") + repr(seen[-160:])] += 1
                    return
                seen += data
            opened_at.append(time.perf_counter())
        except OSError as error:
            errors[type(error).__name__] += 1

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(hold()) for _ in range(count)]
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(120):
            await asyncio.gather(*tasks)
    result = {"count": count, "opened": len(opened_at), "errors": dict(errors),
              "open_seconds": (max(opened_at) - started) if opened_at else float("nan"),
              "connected": len(connected_at),
              "connect_seconds": (max(connected_at) - started) if connected_at else float("nan")}
    await asyncio.sleep(1.0)
    result["rss_mb"] = sum(rss_mb(pid) for pid in worker_pids)
    result["rss_before_mb"] = rss_before
    for task in tasks:
        task.cancel()
    for writer in writers:
        writer.transport.abort()
    if not hangs_up:
        return result
    # Every upstream request must see the gateway hang up.
    deadline = time.perf_counter() + 60
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, trust_env=False) as client:
        while True:
            records = (await client.get(sim_url + "/_sim/records", params={"tag": tag})).json()
            cancelled = sum(1 for r in records if r.get("client_closed_at") is not None)
            if cancelled >= len(records) or time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.5)
        await client.delete(sim_url + "/_sim/records")
    result.update(upstream=len(records), cancelled=cancelled)
    return result


async def measure_targets(args, gateway: Target, floor: Target, served: Target, served1: Target, floor1: Target,
                          floor2: Target, direct: Target, sim_url: str, pids: dict[str, list[int]],
                          translated_model: str, governed: Target) -> dict:
    """Issue 13's and after: ``floor`` is the bare relay under Daphne (as the
    gateway), ``floor1`` and ``floor2`` the bare relay on serve's server in
    one process and in two."""
    out: dict = {}
    c = args.concurrency
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT, trust_env=False) as client:
        long = chat_body("Tell a long story. " + LONG_STREAM, stream=True)

        def one_whole_of(body: bytes) -> Callable[[Target, Samples], Awaitable[None]]:
            async def one(t: Target, s: Samples) -> None:
                started = time.perf_counter()
                response = await client.post(t.base + "/v1/chat/completions", content=body, headers=t.chat_headers)
                if response.status_code == 200:
                    s.latency.append(time.perf_counter() - started)
                else:
                    s.errors[f"HTTP {response.status_code}"] += 1
            return one

        def one_stream(body: bytes) -> Callable[[Target, Samples], Awaitable[None]]:
            async def one(t: Target, s: Samples) -> None:
                started = time.perf_counter()
                async with client.stream("POST", t.base + "/v1/chat/completions", content=body,
                                         headers=t.chat_headers) as response:
                    async for _ in response.aiter_raw():
                        pass
                if response.status_code == 200:
                    s.latency.append(time.perf_counter() - started)
                else:
                    s.errors[f"HTTP {response.status_code}"] += 1
            return one

        whole = {tokens: chat_body(f"Say hello. [sim tokens={tokens}]", stream=False) for tokens in WHOLE_ANSWERS}
        for target in (floor, gateway, served, served1, floor1, floor2):  # warm-up
            await interleaved([target], 20, c, one_whole_of(whole[50]))
        # Every answer size, floor and gateway, in the same alternating
        # rounds: each ratio is taken over the same stretch of the machine's
        # (noisy) time.
        log(f"CPU per non-stream request of {', '.join(map(str, WHOLE_ANSWERS))} tokens: floor, one gateway process")
        legs = [(f"{target.name} {tokens}", target, one_whole_of(body))
                for tokens, body in whole.items() for target in (floor, gateway)]
        targets, leg_pids, one = named_legs(legs, pids)
        out["whole"] = await cpu_rounds(targets, leg_pids, args.requests, c, one)
        await client.delete(sim_url + "/_sim/records")
        log("CPU per non-stream request: one gateway process, serve --workers 1 and 2; the floor in one process, in two")
        out["serve"] = await cpu_rounds([gateway, served1, served, floor1, floor2], pids, args.requests, c,
                                        one_whole_of(whole[50]))
        await client.delete(sim_url + "/_sim/records")
        log("CPU per non-stream request of one token: the demo key, a key with two budgets and a TPM limit")
        await interleaved([governed], 20, c, one_whole_of(whole[1]))  # warm-up: its budgets' windows seeded
        out["governed"] = await cpu_rounds([gateway, governed], pids, args.requests, c, one_whole_of(whole[1]))
        await client.delete(sim_url + "/_sim/records")

        log("CPU per chat stream read by a bare aiohttp client: 50 tokens, one token")
        out["bare_reads"] = {tokens: await bare_stream_reads(direct, tokens, args.requests, c) for tokens in (50, 1)}

        out["long_events"] = await stream_events(client, direct, long)
        log(f"CPU per streamed event: {out['long_events']}-event pass-through streams")
        out["long"] = await cpu_rounds([floor, gateway], pids, args.streams, c, one_stream(long))
        await client.delete(sim_url + "/_sim/records")

        # The same stream passed through and translated, each a whole request
        # (issue 12: translation within 2x of pass-through).
        passed = chat_body("Tell a story. " + TRANSLATED_STREAM, stream=True)
        translated = json.dumps({**json.loads(passed), "model": translated_model}).encode()
        out["translated_events"] = await stream_events(client, gateway, translated)
        if out["translated_events"] > 0:
            log(f"CPU per stream of {out['translated_events']} events: passed through, translated")
            legs = [("passed", gateway, one_stream(passed)), ("translated", gateway, one_stream(translated))]
            targets, leg_pids, one = named_legs(legs, pids)
            out["translation"] = await cpu_rounds(targets, leg_pids, args.streams, c, one)
            await client.delete(sim_url + "/_sim/records")
    out.update(await measure_clouds(args, gateway, sim_url, pids))
    out["embeddings"] = await measure_embeddings(args, gateway, floor, sim_url, pids)
    if args.open_streams:
        out["open"] = await open_streams(args.open_streams, served, sim_url, pids["serve"])
    return out
