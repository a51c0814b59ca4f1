#!/usr/bin/env python
"""HopBase gateway overhead benchmark: what the gateway adds on top of its upstream.

Usage (from the project folder, with the project's virtualenv)::

    .venv/bin/python bench/run.py [--requests N] [--concurrency C] [--streams S]
                                  [--open-streams [S]] [--py-spy PATH] [--keep]
                                  [--production-shape]

Self-contained: it makes a fresh SQLite database in a temporary folder
(``DATABASE_URL=sqlite:////tmp/hopbase-bench-.../bench.sqlite3``; the
developer's ``db.sqlite3`` is never touched), runs ``manage.py migrate`` and
``manage.py demo`` against it, and starts on free loopback ports:

- the upstream simulator: ``python manage.py simulate_upstream --port P``;
- the gateway: ``daphne -v 0 -e tcp:port=P:interface=127.0.0.1:backlog=4096
  hopbase.asgi:application`` (verbosity 0 = no access log; a 4096 backlog so a
  burst of connections is not dropped), with production-like settings:
  ``HOPBASE_LOG_LEVEL=WARNING``, no ``REDIS_URL`` (in-process mode), every
  other setting at its default.

It also starts the floor, ``daphne … bench.floor:application`` (a bare relay:
Daphne + httpx over aiohttp, forwarding to the simulator), the same floor on
uvicorn (``python -m bench.floor_uvicorn``: uvloop, httptools, as ``serve``
runs HopBase), and ``manage.py serve --workers 2`` and ``--workers 1``
(uvicorn) on the same database. Then it measures:

1. one call at a time, gateway, floor and direct calls interleaved: added
   latency of a non-stream Chat request and added time to first token of a
   stream (p50 of gateway minus p50 of direct), held against what the floor
   adds the same way; and the non-stream call again over raw sockets
   (``bench.measure.RawConnection``, a reader that costs next to nothing a
   chunk), with the channel's own stream of the same answer timed as well:
   F4 makes the gateway read that stream where the floor relays the body,
   and the simulator writes 50 events more slowly than one body, so each
   relay is also held against the exchange it makes;
2. CPU per non-stream request of the floor and of the gateway process
   (``/proc/PID/stat`` utime+stime, all threads) for answers of 50 tokens,
   of 16 (the answer issue 13 was measured with) and of one (what a request
   costs apart from reading the channel's events: F4, the gateway reads the
   channel's stream where the floor relays one body), all six in the same
   alternating rounds of C concurrent keep-alive calls, one at a time so
   each process's CPU is its own; then one gateway process against both
   ``serve`` workers summed and against ``serve --workers 1`` (uvicorn in
   one process), 50 tokens, the same way, in the same rounds as the floor
   on uvicorn in one process against the same in two (``--fd`` on
   sockets made as ``serve`` makes its workers'): on two cores shared with
   the client and the simulator, splitting a load over two event loops
   costs any stack something per request; and, with no gateway
   at all, the same stream of 50 tokens and of one read by a bare aiohttp
   client in this process: F4's own share of the cost;
3. CPU per event of a long pass-through stream (``[sim tokens=200]``),
   gateway against floor, the same way;
4. CPU per translated stream: a Chat Completions stream for a model only an
   Anthropic channel serves, against the same stream (whole requests both)
   from an OpenAI channel, passed through;
5. CPU per stream over the demo's cloud channels (rule C): a Messages
   stream of about 50 events over a ``bedrock`` channel (SigV4 signed, the
   answer in AWS's event stream, decoded into Anthropic's events) and over
   a ``vertex`` channel (Claude; a service-account token, SSE), against the
   same stream over an ``anthropic`` channel, and a Gemini stream over a
   ``vertex`` channel against the same over a ``gemini`` channel, all
   passed through; then CPU per event of a paced stream (``[sim pace=…]``:
   each event a read of its own, as from a provider generating them), the
   Bedrock channel's event stream against the Anthropic channel's SSE;
6. CPU per embeddings request (a 1,536-number vector): the bare relay
   against the gateway passing an OpenAI channel's floats and its base64
   through, and translating a Vertex ``:predict`` answer into floats;
7. CPU per non-stream request of a key with two budgets (its own and its
   tenant's) and a TPM limit against the demo key, which has none: what
   admission under spend governance adds (in-process stores: no REDIS_URL);
8. issue 31, HopBase on each server against that server's floor in the
   same rounds (bench/servers.py): ``serve --workers 1`` (uvicorn) against
   the floor on uvicorn and plain ``daphne`` against the floor under
   Daphne, CPU per whole answer of 16 tokens (and ``serve`` against plain
   ``daphne``), CPU per paced stream of 200 events 1 ms apart (each a read
   of its own, 16 at once), and the latency each adds at C=1, p50 and p99;
   then the same latency read by raw sockets, with the simulator's own
   stream of the answer timed beside its body: the least that any gateway
   reading the channel's stream (F4) adds. With ``--production-shape``,
   ``serve --workers 1`` also runs as docker-compose.yml runs it, on
   PostgreSQL (a database of the run's own on 127.0.0.1:5432, dropped at
   the end) and Redis (database 15, emptied before and after) with a Celery
   worker settling its logs, in the same rounds;
9. with ``--open-streams [S]`` (default off; 10,000 when given bare): S
   streams opened at once over raw sockets against ``serve``, the time until
   all have their first token, both workers' RSS, and then, all closed at
   once, how many of the upstream requests the simulator saw hung up on.
   Each stream costs two descriptors in its worker; above 2,000 streams the
   upstream pool (``HOPBASE_UPSTREAM_MAX_CONNECTIONS``, and the bare
   relay's, ``BENCH_FLOOR_MAX_CONNECTIONS``) is raised to fit. Last of all,
   the same burst over the bare relay on uvicorn in two processes: what the
   stack and this machine allow any gateway.

``--py-spy PATH`` samples the gateway process with that py-spy binary (pip
install it, it is not a project dependency) during measures 2-6 (in
``--gil`` mode, so idle threads and the rounds of other targets add few
samples) and prints the hottest functions; the CPU figures of such a run
include py-spy's sampling overhead. ``--keep`` keeps the temporary folder (database, process
logs). Defaults finish in about a minute on a 2-core machine. Every process it
starts is stopped on the way out, Ctrl-C included.

Output: the exact command line and settings, then one Markdown table: each
target of issue 13, the floor it is held against, today's figure, the ratio
and the goal. The machine is shared and noisy: compare ratios within a run.

The pieces: ``bench/processes.py`` (the child processes, /proc readings,
py-spy), ``bench/measure.py`` (latency), ``bench/targets.py`` (CPU and open
streams), ``bench/servers.py`` (issue 31's, per server), ``bench/floor.py`` (the bare relay),
``bench/floor_uvicorn.py`` (it on uvicorn) and ``bench/report.py`` (the table).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script, python bench/run.py: the project folder, for the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.measure import NONSTREAM_DIRECTIVE, STREAM_DIRECTIVE, Target, log, measure
from bench.processes import (
    ROOT,
    START_TIMEOUT,
    Child,
    ProductionStores,
    Profiler,
    free_port,
    gateway_env,
    manage,
    raise_fd_limit,
)
from bench.report import gateway_log_summary, report
from bench.servers import measure_servers
from bench.targets import (
    CLOUD_STREAM,
    GEMINI_LEGS,
    LONG_STREAM,
    MESSAGES_LEGS,
    PACED_CONCURRENCY,
    PACED_STREAM,
    TRANSLATED_STREAM,
    measure_targets,
    open_streams,
    serve_workers,
)
from hopbase.management.commands.serve import listening_sockets

TRANSLATED_MODEL = "bench-translated"  # served only by an Anthropic channel: chat requests for it are translated
GOVERNED_TENANT = "bench-governed"

BIN = Path(sys.executable).parent


def start_serve(children: list[Child], name: str, workers: int, env: dict[str, str],
                tmp: Path) -> tuple[list[str], str]:
    """``manage.py serve`` with ``workers`` workers on a free port, added to
    ``children`` and answering: its command line and its address."""
    port = free_port()
    serve_args = [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port),
                  "--workers", str(workers)]
    children.append(Child(name, serve_args, env, tmp))
    url = f"http://127.0.0.1:{port}"
    children[-1].wait_ready(url + "/healthz")
    return serve_args, url


def demo_key(printed: str) -> str:
    """The API key ``manage.py demo`` prints on its fourth line."""
    demo = printed.splitlines()
    key = demo[3].strip() if len(demo) > 3 else ""
    if not key or " " in key:
        raise RuntimeError(f"could not read the demo key from line 4 of:\n{chr(10).join(demo[:6])}")
    return key


def start_production(stores: ProductionStores, children: list[Child], sim_url: str, tmp: Path) -> Target:
    """``serve --workers 1`` as docker-compose.yml runs it: on PostgreSQL and
    Redis, a Celery worker settling its logs (started here too, its CPU not
    the gateway's); its target, the serve process last in ``children``."""
    env = gateway_env(stores.database_url, REDIS_URL=stores.redis_url)
    manage(["migrate", "--verbosity", "0"], env)
    key = demo_key(manage(["demo", "--simulator-url", sim_url, "--gateway-url", "http://127.0.0.1"], env))
    celery = [sys.executable, "-m", "celery", "-A", "hopbase"]
    children.append(Child("celery-worker", [*celery, "worker", "--pool", "solo", "-l", "warning"], env, tmp))
    deadline = time.monotonic() + START_TIMEOUT
    while subprocess.run([*celery, "inspect", "ping", "--timeout", "1"], env=env, cwd=ROOT, capture_output=True,
                         timeout=START_TIMEOUT).returncode != 0:
        if children[-1].process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the Celery worker did not answer a ping:\n{children[-1].log_tail()}")
    _, url = start_serve(children, "serve1-production", 1, env, tmp)
    return Target("serve1-production", url, {"authorization": f"Bearer {key}", "content-type": "application/json"}, {})


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500, help="non-streaming requests per target for CPU (a quarter of them for latency)")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent client requests")
    parser.add_argument("--streams", type=int, default=150, help="long streams per target for CPU (half as many for time to first token)")
    parser.add_argument("--open-streams", type=int, nargs="?", const=10000, default=0,
                        help="open this many streams at once over serve --workers 2 (default off; 10000 if bare)")
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy binary: sample the gateway during its burst")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (database, logs)")
    parser.add_argument("--production-shape", action="store_true",
                        help="also serve --workers 1 on PostgreSQL and Redis with a Celery worker settling (issue 31's "
                             "rows): a database of its own on 127.0.0.1:5432, Redis database 15, emptied")
    args = parser.parse_args()
    if min(args.requests, args.concurrency, args.streams) < 1 or args.open_streams < 0:
        parser.error("counts must be positive")

    soft, hard = raise_fd_limit()
    # Each held stream: 2 fds in one of the two gateway processes, 1 in this client, 1 in the simulator.
    if args.open_streams and args.open_streams + 200 > soft:
        parser.error(f"--open-streams {args.open_streams} needs about {args.open_streams + 200} descriptors "
                     f"in each process; the limit is {soft}")

    # Ctrl-C and SIGTERM raise KeyboardInterrupt wherever the run is (asyncio.run's
    # own SIGINT handling only cancels the main task, which a finishing wait can
    # swallow on Python 3.11); the finally below stops every child.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)

    tmp = Path(tempfile.mkdtemp(prefix="hopbase-bench-"))
    env = gateway_env(f"sqlite:///{tmp}/bench.sqlite3")
    if args.open_streams > 2000:
        env["HOPBASE_UPSTREAM_MAX_CONNECTIONS"] = str(args.open_streams + 100)
        env["BENCH_FLOOR_MAX_CONNECTIONS"] = str(args.open_streams + 100)
    children: list[Child] = []
    profilers: list[Profiler] = []
    stores: ProductionStores | None = None
    try:
        if args.production_shape:
            stores = ProductionStores().make()
        sim_port, gw_port, floor_port = free_port(), free_port(), free_port()
        sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
        log(f"temporary folder {tmp}")
        manage(["migrate", "--verbosity", "0"], env)
        key = demo_key(manage(["demo", "--simulator-url", sim_url, "--gateway-url", gw_url], env))
        manage(["addchannel", "bench-anthropic", "--protocol", "anthropic", "--base-url", sim_url,
                "--api-key", "sk-simulated", "--models", TRANSLATED_MODEL], env)
        manage(["setprice", TRANSLATED_MODEL, "--input", "1", "--output", "2"], env)
        # A key under spend governance: its tenant's budget, its own, and a TPM limit, none ever reached.
        manage(["createtenant", GOVERNED_TENANT, "--balance", "1000000"], env)
        governed_key = manage(["createapikey", GOVERNED_TENANT, "--tpm", "1000000000", "--budget-usd", "1000000",
                               "--budget-period", "1d"], env).strip().splitlines()[-1]
        manage(["setbudget", "--tenant", GOVERNED_TENANT, "--usd", "1000000", "--period", "1mo"], env)

        sim_args = [sys.executable, "manage.py", "simulate_upstream", "--host", "127.0.0.1", "--port", str(sim_port)]
        daphne = [str(BIN / "daphne")] if (BIN / "daphne").exists() else [sys.executable, "-m", "daphne"]
        gw_args = [*daphne, "-v", "0", "-e", f"tcp:port={gw_port}:interface=127.0.0.1:backlog=4096",
                   "hopbase.asgi:application"]
        children.append(Child("simulator", sim_args, env, tmp))
        children[-1].wait_ready(sim_url + "/_sim/health")
        children.append(Child("gateway", gw_args, env, tmp))
        children[-1].wait_ready(gw_url + "/healthz")
        floor_args = [*daphne, "-v", "0", "-e", f"tcp:port={floor_port}:interface=127.0.0.1:backlog=4096",
                      "bench.floor:application"]
        children.append(Child("floor", floor_args, {**env, "BENCH_FLOOR_UPSTREAM": sim_url}, tmp))
        children[-1].wait_ready(f"http://127.0.0.1:{floor_port}/_sim/health")
        # The bare relay on uvicorn, as serve runs HopBase (issue 31).
        floor_uv_port = free_port()
        floor_uv_args = [sys.executable, "-m", "bench.floor_uvicorn", "--port", str(floor_uv_port)]
        children.append(Child("floor-uvicorn", floor_uv_args, {**env, "BENCH_FLOOR_UPSTREAM": sim_url}, tmp))
        children[-1].wait_ready(f"http://127.0.0.1:{floor_uv_port}/_sim/health")
        floor_uv_process = children[-1]
        # The bare relay on uvicorn over two processes, on sockets made as
        # serve makes its workers': what scaling out costs the stack itself.
        floor2_port = free_port()
        floor2_pids = []
        for number, listener in enumerate(listening_sockets("127.0.0.1", floor2_port, 2)):
            fd = listener.fileno()
            children.append(Child(f"floor2-{number}", [sys.executable, "-m", "bench.floor_uvicorn", "--fd", str(fd)],
                                  {**env, "BENCH_FLOOR_UPSTREAM": sim_url}, tmp, pass_fds=(fd,)))
            listener.close()
            floor2_pids.append(children[-1].pid)
        children[-1].wait_ready(f"http://127.0.0.1:{floor2_port}/_sim/health")
        # serve with one worker (uvicorn): the one process that two are held
        # against, and HopBase on uvicorn against its floor.
        serve1_args, serve1_url = start_serve(children, "serve1", 1, env, tmp)
        serve_args, serve_url = start_serve(children, "serve", 2, env, tmp)
        floor_url = f"http://127.0.0.1:{floor_port}"
        sim, gw, floor_process, *_, serve1_process, serve_process = children
        workers, serve1_workers = serve_workers(serve_process.pid), serve_workers(serve1_process.pid)
        production = start_production(stores, children, sim_url, tmp) if stores is not None else None
        production_workers = serve_workers(children[-1].pid) if production is not None else []
        log(f"simulator pid {sim.pid} at {sim_url}; gateway pid {gw.pid} at {gw_url}; floor pid "
            f"{floor_process.pid} at {floor_url}; serve workers {workers} at {serve_url}; "
            f"serve --workers 1 {serve1_workers} at {serve1_url}")

        shown_env = {k: v for k, v in env.items() if k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "PYTHONUNBUFFERED")
                     or k.startswith("HOPBASE_")}
        settings = [
            "command:   " + shlex.join([Path(sys.executable).name, *sys.argv]),
            f"effective: --requests {args.requests} --concurrency {args.concurrency} --streams {args.streams}"
            f" --open-streams {args.open_streams}" + (f" --py-spy {args.py_spy}" if args.py_spy else ""),
            "env:       " + " ".join(f"{k}={v}" for k, v in sorted(shown_env.items())) + " (REDIS_URL unset)",
            "gateway:   " + shlex.join([Path(gw_args[0]).name, *gw_args[1:]]),
            "floor:     " + shlex.join([Path(floor_args[0]).name, *floor_args[1:]]) + " (bench/floor.py)",
            "floor-uv:  " + shlex.join(["python", *floor_uv_args[1:]]) + " (bench/floor.py on uvicorn, uvloop, httptools)",
            "floor2:    two of python -m bench.floor_uvicorn --fd N, on SO_REUSEPORT sockets as serve's",
            "serve:     " + shlex.join(["python", *serve_args[1:]]),
            "serve1:    " + shlex.join(["python", *serve1_args[1:]]),
            "simulator: " + shlex.join(["python", *sim_args[1:]]),
            *([f"production: serve --workers 1 on {stores.database_url} and {stores.redis_url}, "
               "python -m celery -A hopbase worker --pool solo settling"] if stores is not None else []),
            f"machine:   {os.cpu_count()} CPUs, Python {platform.python_version()}, httpx {httpx.__version__},"
            f" RLIMIT_NOFILE {soft}/{hard}",
            f"bodies:    chat {NONSTREAM_DIRECTIVE} non-stream; chat streams (include_usage)"
            f" {STREAM_DIRECTIVE} and {LONG_STREAM}; translated {TRANSLATED_MODEL} {TRANSLATED_STREAM}",
            "clouds:    Messages and Gemini streams " + CLOUD_STREAM + ", model per channel: "
            + ", ".join(f"{leg} {model}" for leg, model in (*MESSAGES_LEGS, *GEMINI_LEGS))
            + f"; paced {PACED_STREAM} at {PACED_CONCURRENCY} at once",
        ]

        chat_headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        sim_headers = {"authorization": "Bearer sk-simulated", "content-type": "application/json"}
        gateway = Target("gateway", gw_url, chat_headers, {})
        direct = Target("direct", sim_url, sim_headers, {})
        floor = Target("floor", floor_url, sim_headers, {})
        served = Target("serve", serve_url, chat_headers, {})
        served1 = Target("serve1", serve1_url, chat_headers, {})
        governed = Target("governed", gw_url, {**chat_headers, "authorization": f"Bearer {governed_key}"}, {})
        floor2 = Target("floor2", f"http://127.0.0.1:{floor2_port}", sim_headers, {})
        floor_uv = Target("floor-uvicorn", f"http://127.0.0.1:{floor_uv_port}", sim_headers, {})
        pids = {"gateway": gw.pid, "simulator": sim.pid, "client": os.getpid()}
        cpu_pids = {"gateway": [gw.pid], "floor": [floor_process.pid], "serve": workers, "serve1": serve1_workers,
                    "floor2": floor2_pids, "governed": [gw.pid], "floor-uvicorn": [floor_uv_process.pid]}

        started = time.monotonic()
        results = asyncio.run(measure(args, gateway, floor, direct, sim_url, pids))
        profiler = Profiler(args.py_spy, gw.pid, tmp / "gateway-py-spy.txt") if args.py_spy else None
        if profiler is not None:
            profilers.append(profiler)
        targets = asyncio.run(measure_targets(args, gateway, floor, served, served1, floor_uv, floor2, direct, sim_url,
                                              cpu_pids, TRANSLATED_MODEL, governed))
        on_each = {t.name: t for t in (served1, floor_uv, gateway, floor)}
        if production is not None:
            on_each[production.name] = production
            cpu_pids[production.name] = production_workers
        targets["servers"] = asyncio.run(measure_servers(args, on_each, direct, sim_url, cpu_pids))
        if args.open_streams:
            # Last: the bare relay leaves its upstream requests open (it does
            # not pass the clients' leaving on) until it is stopped.
            log(f"the same {args.open_streams} streams over the bare relay in two processes")
            targets["open_floor"] = asyncio.run(open_streams(args.open_streams, floor2, sim_url, floor2_pids,
                                                             hangs_up=False))
        if profiler is not None:
            profiler.stop()
        settings.append(f"duration:  {time.monotonic() - started:.1f} s of measuring")
        for child in children:
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} died during the run:\n{child.log_tail()}")
        text = report(args, settings, results, targets)
        print(text + "\n" + gateway_log_summary(gw.log_path))
        if profiler is not None:
            print()
            print(profiler.report())
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
        if stores is not None:
            stores.remove()
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
