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

The pieces: ``bench/processes.py`` (the child processes, /proc readings,
py-spy), ``bench/measure.py`` (the calls and the measurements) and
``bench/report.py`` (the table).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script, python bench/run.py: the project folder, for the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.measure import NONSTREAM_DIRECTIVE, STREAM_DIRECTIVE, Target, log, measure
from bench.processes import Child, Profiler, free_port, manage, raise_fd_limit
from bench.report import gateway_log_summary, report

BIN = Path(sys.executable).parent


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
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # required; this run's own
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
