#!/usr/bin/env python
"""Instructions per request, gateway against gateway: an A/B of a change
that this machine's noise would hide from CPU seconds.

Usage (from the project folder, with the project's virtualenv; needs
Debian's ``valgrind``)::

    .venv/bin/python bench/instructions.py OLD [NEW] [--requests N]
                                           [--concurrency C] [--tokens T]
                                           [--pace SECONDS] [--stream]
                                           [--server daphne|uvicorn]

OLD and NEW are checkouts of the project (NEW defaults to this one), e.g.
``git worktree add /tmp/old HEAD~3``. Each is served by one Daphne process
(with ``--server uvicorn``, one worker of ``manage.py serve``)
run under callgrind (about 50 times slower), on a SQLite database of its
own made with ``migrate`` and ``demo``, against one upstream simulator; after
40 warm-up calls the counters are zeroed, N non-stream Chat requests of T
tokens are made (streamed to the client with ``--stream``), C at a time,
and the instructions executed meanwhile are read back: the event loop's
thread, and all threads together.

The event loop's count repeats within about 0.5 % (the same checkout as
both old and new: 1.000×), so a change of 2 % there is real. All threads
together move by 5 %: the periodic jobs run on the clock, and under
callgrind a request takes 50 times longer. Timing is not what it was
either: upstream events arrive in fewer reads (two or three a request). A
change to what is done per read is judged with ``--pace``: the simulator
sends its tokens that many seconds apart (0.004 outlasts a read under
callgrind), so that every event is a read of its own, as from a provider
generating them. Paced, the count moves by a few per cent between runs (a
slow read under callgrind still lets two events meet): run it more than once.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.measure import Samples, Target, chat_body, interleaved  # noqa: E402
from bench.processes import ROOT, Child, free_port, gateway_env, manage  # noqa: E402
from hopbase.management.commands.serve import listening_sockets  # noqa: E402

WARM_UP = 40
UNDER_CALLGRIND_START = 300.0  # seconds for Django and Daphne to start, 50 times slower
CALL_TIMEOUT = 120.0


async def calls(target: Target, count: int, concurrency: int, body: bytes) -> None:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=CALL_TIMEOUT, trust_env=False) as client:
        async def one(t: Target, samples: Samples) -> None:
            async with client.stream("POST", t.base + "/v1/chat/completions", content=body,
                                     headers=t.chat_headers) as response:
                answer = await response.aread()
            if response.status_code != 200:
                raise RuntimeError(f"{t.name}: HTTP {response.status_code}: {answer[:300]!r}")
            samples.latency.append(0.0)

        await interleaved([target], count, concurrency, one)


def callgrind_total(dump: Path) -> int:
    found = re.search(r"^(?:summary|totals):\s+(\d+)", dump.read_text(errors="replace"), re.M)
    if found is None:
        raise RuntimeError(f"no instruction total in {dump}")
    return int(found.group(1))


def commit_of(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def measure(name: str, checkout: Path, sim_url: str, env: dict[str, str], tmp: Path,
            args: argparse.Namespace) -> tuple[float, float]:
    """Instructions per request of the gateway served from ``checkout``: its
    event loop's, and all its threads' together."""
    env = {**env, "DATABASE_URL": f"sqlite:///{tmp}/{name}.sqlite3"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    manage(["migrate", "--verbosity", "0"], env, cwd=checkout)
    key = manage(["demo", "--simulator-url", sim_url, "--gateway-url", url], env, cwd=checkout).splitlines()[3].strip()
    out = tmp / f"callgrind.{name}"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", "--dump-instr=no",
                "--separate-threads=yes"]
    if args.server == "uvicorn":
        # One of serve's workers (hopbase.serve_worker) on a socket made as
        # serve makes them.
        listener = listening_sockets("127.0.0.1", port, 1)[0]
        fd = listener.fileno()
        try:
            child = Child(name, [*valgrind, sys.executable, "-m", "hopbase.serve_worker", "--fd", str(fd)],
                          env, tmp, cwd=checkout, pass_fds=(fd,))
        finally:
            listener.close()
    else:
        daphne = [sys.executable, str(Path(sys.executable).parent / "daphne")]
        child = Child(name, [*valgrind, *daphne, "-v", "0", "-e", f"tcp:port={port}:interface=127.0.0.1",
                             "hopbase.asgi:application"], env, tmp, cwd=checkout)
    try:
        child.wait_ready(url + "/healthz", within=UNDER_CALLGRIND_START)
        target = Target(name, url, {"authorization": f"Bearer {key}", "content-type": "application/json"}, {})
        pace = f" pace={args.pace}" if args.pace else ""
        body = chat_body(f"Say hello. [sim tokens={args.tokens}{pace}]", stream=args.stream)
        asyncio.run(calls(target, WARM_UP, args.concurrency, body))
        subprocess.run(["callgrind_control", "--zero", str(child.pid)], check=True, capture_output=True)
        asyncio.run(calls(target, args.requests, args.concurrency, body))
        dumped = subprocess.run(["callgrind_control", "--dump", str(child.pid)], check=True, capture_output=True)
        # One file per thread (--separate-threads), "-01" the event loop's.
        dumps = {path.name.rsplit("-", 1)[1]: path for path in tmp.glob(f"callgrind.{name}.{child.pid}.1-*")}
        if "01" not in dumps:
            raise RuntimeError(f"callgrind wrote no dump: {dumped.stdout!r}")
        counts = {thread: callgrind_total(path) for thread, path in dumps.items()}
        return counts["01"] / args.requests, sum(counts.values()) / args.requests
    finally:
        child.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="a checkout of the project to compare against")
    parser.add_argument("new", type=Path, nargs="?", default=ROOT, help="the checkout compared (default: this one)")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=50, help="tokens of each non-stream answer")
    parser.add_argument("--pace", type=float, default=0.0, help="seconds between the simulator's tokens")
    parser.add_argument("--stream", action="store_true", help="streamed answers, not whole ones")
    parser.add_argument("--server", choices=("daphne", "uvicorn"), default="daphne",
                        help="plain daphne, or one worker of manage.py serve (uvicorn)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    for checkout in (args.old, args.new):
        if not (checkout / "manage.py").exists():
            parser.error(f"{checkout} is not a checkout of the project")

    tmp = Path(tempfile.mkdtemp(prefix="hopbase-instructions-"))
    # The hold's clocks, for a process 50 times slower than usual.
    env = gateway_env(f"sqlite:///{tmp}/sim.sqlite3", HOPBASE_FIRST_TOKEN_TIMEOUT="120", HOPBASE_HOLD_MAX="120",
                      HOPBASE_CONNECT_TIMEOUT="60")
    simulator = None
    try:
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        simulator = Child("simulator", [sys.executable, "manage.py", "simulate_upstream", "--host", "127.0.0.1",
                                        "--port", str(sim_port)], env, tmp)
        simulator.wait_ready(sim_url + "/_sim/health")
        results = []
        for name, checkout in (("old", args.old), ("new", args.new)):
            started = time.monotonic()
            counts = measure(name, checkout.resolve(), sim_url, env, tmp, args)
            results.append((name, checkout, counts))
            print(f"[instructions] {name} measured in {time.monotonic() - started:.0f} s", file=sys.stderr)
        paced = f" (tokens {args.pace} s apart)" if args.pace else ""
        kind = "streamed" if args.stream else "non-stream"
        server = "plain daphne" if args.server == "daphne" else "one serve worker (uvicorn)"
        print(f"{args.requests} {kind} Chat requests of {args.tokens} tokens{paced}, {args.concurrency} at a time,"
              f" each checkout's gateway ({server}) under callgrind:\n")
        print("| checkout | commit | event loop, per request | against old | all threads | against old |")
        print("|---|---|---:|---:|---:|---:|")
        old_loop, old_all = results[0][2]
        for name, checkout, (loop, every) in results:
            print(f"| {name}: {checkout} | {commit_of(checkout)} | {loop / 1e6:.2f} M | {loop / old_loop:.3f}×"
                  f" | {every / 1e6:.2f} M | {every / old_all:.3f}× |")
        return 0
    except RuntimeError as error:
        print(f"[instructions] failed: {error}", file=sys.stderr)
        return 1
    finally:
        if simulator is not None:
            simulator.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
