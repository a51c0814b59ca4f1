"""Issue 31's measurements: HopBase on each server against that server's own
floor (bench/floor.py), in the same alternating rounds. Under uvicorn,
``manage.py serve --workers 1`` (serving.uvicorn_web) against the bare relay
on uvicorn (bench/floor_uvicorn.py); under Daphne, plain ``daphne`` against
the bare relay under ``daphne``: CPU per whole answer, CPU per paced stream
(each event a read of its own) and the latency each adds at C=1, with the
least that F4 lets any gateway add."""

from __future__ import annotations

import asyncio

import httpx

from bench.measure import (
    NONSTREAM_DIRECTIVE,
    REQUEST_TIMEOUT,
    RawCall,
    Samples,
    Target,
    call_whole,
    chat_body,
    interleaved,
    log,
    raw_latencies,
)
from bench.targets import PACED_CONCURRENCY, cpu_rounds

WHOLE = "[sim tokens=16]"  # the answer issue 31 was measured with
PACED = "[sim tokens=200 pace=0.001]"  # 200 events 1 ms apart: each its own read
# (server, HopBase's target, its floor's target): the names of the Targets.
PAIRS = (("uvicorn", "serve1", "floor-uvicorn"), ("daphne", "gateway", "floor"))
# serve --workers 1 on PostgreSQL and Redis (bench/run.py --production-shape).
PRODUCTION = "serve1-production"


async def measure_servers(args, targets: dict[str, Target], direct: Target, sim_url: str,
                          pids: dict[str, list[int]]) -> dict:
    """CPU per whole answer and per paced stream of every target in
    ``targets`` (by name, as in PAIRS), and the latency each adds at C=1."""
    out: dict = {}
    every = list(targets.values())
    limits = httpx.Limits(max_connections=PACED_CONCURRENCY, max_keepalive_connections=PACED_CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT, trust_env=False) as client:
        whole = chat_body("Say hello. " + WHOLE, stream=False)
        paced = chat_body("Tell a story. " + PACED, stream=True)

        async def one_whole(t: Target, s: Samples) -> None:
            await call_whole(client, t, whole, s)

        async def one_paced(t: Target, s: Samples) -> None:
            async with client.stream("POST", t.base + "/v1/chat/completions", content=paced,
                                     headers=t.chat_headers) as response:
                async for _ in response.aiter_raw():
                    pass
            if response.status_code == 200:
                s.latency.append(1.0)
            else:
                s.errors[f"HTTP {response.status_code}"] += 1

        await interleaved(every, 20, args.concurrency, one_whole)  # warm-up
        log(f"issue 31: CPU per whole answer ({WHOLE}) on each server: {', '.join(targets)}")
        out["whole"] = await cpu_rounds(every, pids, args.requests, args.concurrency, one_whole)
        await client.delete(sim_url + "/_sim/records")
        log(f"issue 31: CPU per paced stream ({PACED}, {PACED_CONCURRENCY} at once) on each server")
        out["paced"] = await cpu_rounds(every, pids, args.streams, PACED_CONCURRENCY, one_paced)
        await client.delete(sim_url + "/_sim/records")
        log("issue 31: added latency at C=1 on each server, direct calls interleaved")
        prompt = "Say hello in fifty words. " + NONSTREAM_DIRECTIVE
        body = chat_body(prompt, stream=False)

        async def one_serial(t: Target, s: Samples) -> None:
            await call_whole(client, t, body, s)

        out["serial"] = await interleaved([*every, direct], max(200, args.requests // 2), 1, one_serial)
        await client.delete(sim_url + "/_sim/records")
        # F4: a gateway reads the channel's stream of the answer, which the
        # simulator writes more slowly than the body the bare relay passes
        # on; both timed by raw sockets, beside the relays.
        log("issue 31: the same latency read by raw sockets, the simulator's stream of the answer beside its body")
        raw = [RawCall("direct", direct.base, direct.chat_headers, body, b'"choices"'),
               RawCall("direct stream", direct.base, direct.chat_headers, chat_body(prompt, stream=True), b"[DONE]"),
               *(RawCall(t.name, t.base, t.chat_headers, body, b'"choices"') for t in every)]
        out["raw"] = await asyncio.to_thread(raw_latencies, raw, max(200, args.requests // 2))
        await client.delete(sim_url + "/_sim/records")
    return out
