#!/usr/bin/env python
"""HopBase soak: nothing served goes unrecorded or is charged twice, no slot
leaks and memory stays flat, through client hang-ups, misbehaving channels,
a Celery worker killed again and again, and Redis outages (issue 9).

Usage (from the project folder, with the project's virtualenv)::

    .venv/bin/python bench/soak.py [--duration SECONDS] [--concurrency N] [--seed N]
                                   [--database-url URL] [--redis-url URL] [--keep]

What it runs, on free loopback ports, all stopped on the way out (Ctrl-C too):

- a fresh PostgreSQL database of its own on the server of ``--database-url``
  (default ``$DATABASE_URL``, else ``postgres://postgres@127.0.0.1:5432``):
  the database that URL names if its name starts with ``hopbase_soak``,
  else ``hopbase_soak``; made afresh (migrated), dropped at the end;
- Redis at ``--redis-url`` (default ``$REDIS_URL``, else
  ``redis://127.0.0.1:6379/0``), reached by the gateways and the worker
  through a loopback TCP proxy the soak controls (``bench/tcp_proxy.py``, in
  a process of its own: ``bench/soak_proxy.py``).
  Give the soak a Redis database nothing else uses as a Celery broker: its
  worker consumes the default queue. Its counters live under key and
  channel ids drawn at random, so they are its own;
- the upstream simulator (``manage.py simulate_upstream``);
- two gateway processes started the contract's way (``daphne -v 0 -e
  tcp:…``), with short timers (``HOPBASE_STALL_TIMEOUT=1`` and others, shown
  in the output) and a spool directory of their own;
- a Celery worker (``celery -A hopbase worker --pool=solo``).

It sets up a tenant, a key limited to a number of open requests (so key
slots are taken and waited for), two channels per protocol, one of them with
a ``max_concurrency`` (so channel slots are too), and prices. Then, for
``--duration`` seconds (default 180), ``--concurrency`` clients (default 24)
each send one request after another, alternating between the gateways, in
all four client APIs, streaming and not: normal answers, client hang-ups
(mid-stream, in the hold, before a whole answer), stalls (``[sim
stall_after=N]``), mid-stream errors, cut connections, failures before the
first token, Responses follow-ups. Meanwhile the worker is killed (SIGKILL)
and restarted every few seconds, and Redis is made unreachable (connections
refused, or silently swallowed) for a few seconds at a time and restored.
The last part of the run is calm (everything restored), and the gateways'
RSS is read once the first part (the warm-up, with every kind of trouble
in it) is over.

At the end it stops the traffic, restores everything, waits for the
gateways to have nothing open, reads their RSS, drains them (SIGTERM), runs
``manage.py settle`` and ``manage.py checkledger``, and prints: requests
sent, request rows, rows missing (every request the client got an
``x-hopbase-request-id`` for has exactly one row, except answers given
before a key was read), double charges (ledger charges per request log
above one), leaked slots (leases Redis still counts for the key and the
channels after the gateways exited, each with when it was taken against
the outages) and each gateway's RSS after the warm-up and at the end. It
exits 1 unless rows missing, double charges and leaked slots are all zero,
checkledger passes, every row is settled, both gateways drained with exit
0, and each gateway's RSS grew less than 10 % after the warm-up.

``--keep`` keeps the temporary folder (process logs) and the database; a
failed run keeps the folder too.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

if __package__ in (None, ""):  # run as a script, python bench/soak.py: the project folder, for the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench import soak_books
from bench.processes import ROOT, Child, free_port, manage, raise_fd_limit, rss_mb
from bench.soak_proxy import ProxyProcess
from bench.soak_traffic import REQUEST_TIMEOUT, Traffic

BIN = Path(sys.executable).parent
DEFAULT_DURATION = 180.0
RSS_GROWTH_LIMIT = 10.0  # per cent, after the warm-up
# The gateways' settings: short timers, so stalls end and holds give up quickly.
GATEWAY_SETTINGS = {
    "HOPBASE_STALL_TIMEOUT": "1",
    "HOPBASE_HOLD_MAX": "2",
    "HOPBASE_FIRST_TOKEN_TIMEOUT": "2",
    "HOPBASE_KEEPALIVE_INTERVAL": "0.5",
    "HOPBASE_CAPACITY_WAIT": "1",
    "HOPBASE_DRAIN_TIMEOUT": "10",
    "HOPBASE_LOG_LEVEL": "WARNING",
}
# Every wait below is a hang detector, not a measurement.
WORKER_START = 60.0
IDLE_WITHIN = 30.0
DRAIN_WITHIN = float(GATEWAY_SETTINGS["HOPBASE_DRAIN_TIMEOUT"]) + 20.0
SIMULATOR_RECORDS_EVERY = 5.0  # the simulator keeps every request it answered: forget them now and then


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


# --------------------------------------------------------------------------- the worker


class Worker:
    """The Celery worker, started again after every kill (each start logs to
    a file of its own, where its readiness is read)."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.child: Child | None = None
        self.starts = 0
        self.kills = 0
        self.deaths: list[str] = []  # exits the soak did not cause

    def start(self) -> None:
        self.starts += 1
        args = [sys.executable, "-m", "celery", "-A", "hopbase", "worker", "--pool=solo", "--loglevel=INFO",
                "--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"soak{self.starts}-{os.getpid()}@%h"]
        self.child = Child(f"worker-{self.starts}", args, self.env, self.logdir)

    def running(self) -> bool:
        if self.child is None:
            return False
        if self.child.process.poll() is not None:
            self.deaths.append(f"{self.child.name} exited with {self.child.process.returncode}")
            self.child.stop()
            self.child = None
            return False
        return True

    def ready(self) -> bool:
        return self.running() and b" ready." in self.child.log_path.read_bytes()

    def wait_ready(self, within: float = WORKER_START) -> None:
        deadline = time.monotonic() + within
        while not self.ready():
            if self.child is None:
                raise RuntimeError(f"the worker died while starting: {self.deaths[-1]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker was not ready within {within:.0f} s:\n{self.child.log_tail()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL, to the worker and anything it started."""
        if self.child is None:
            return
        if self.child.process.poll() is None:
            os.killpg(self.child.pid, signal.SIGKILL)
            self.child.process.wait(10)
            self.kills += 1
        self.child.stop()
        self.child = None

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None


# --------------------------------------------------------------------------- chaos


@dataclass
class Chaos:
    """Redis outages and worker kills on a random schedule, until ``calm_at``
    (after which everything is as it should be)."""

    proxy: ProxyProcess
    worker: Worker
    rng: random.Random
    calm_at: float
    outages_on: bool = True
    kills_on: bool = True
    started: float = 0.0
    outages: list[str] = field(default_factory=list)
    # (mode, start, end) in seconds from the start of the traffic
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    _outage_until: float | None = None
    _next_outage: float = 0.0
    _next_kill: float = 0.0
    _restart_at: float | None = None

    def begin(self, now: float) -> None:
        self.started = now
        self._next_outage = now + self.rng.uniform(1.0, 2.5) if self.outages_on else float("inf")
        self._next_kill = now + self.rng.uniform(1.5, 3.5) if self.kills_on else float("inf")

    def step(self, now: float) -> None:
        # Redis: refused or silent for 1.5-4 s, then restored for 2-6 s.
        if self._outage_until is not None and now >= self._outage_until:
            self.proxy.restore()
            mode, begun, _ = self.windows[-1]
            self.windows[-1] = (mode, begun, now - self.started)
            self._outage_until = None
            self._next_outage = now + self.rng.uniform(2.0, 6.0)
            log("redis restored")
        elif self._outage_until is None and now >= self._next_outage:
            length = self.rng.uniform(1.5, 4.0)
            if now + length < self.calm_at:
                mode = "refused" if len(self.outages) % 2 == 0 else "silent"
                self.proxy.refuse() if mode == "refused" else self.proxy.silence()
                self.outages.append(mode)
                self.windows.append((mode, now - self.started, float("inf")))
                self._outage_until = now + length
                log(f"redis {mode} for {length:.1f} s")
            else:
                self._next_outage = float("inf")
        # The worker: killed every 2-6 s of its life, started again 0.3-2 s later.
        if self._restart_at is not None:
            if now >= self._restart_at:
                self.worker.start()
                self._restart_at = None
                self._next_kill = now + self.rng.uniform(2.0, 6.0)
        elif now >= self._next_kill and now < self.calm_at - 2.0:
            self.worker.kill()
            self._restart_at = now + self.rng.uniform(0.3, 2.0)
            log(f"worker killed (SIGKILL), restart in {self._restart_at - now:.1f} s")
        elif not self.worker.running():
            log(f"the worker exited by itself ({self.worker.deaths[-1]}); starting it again")
            self.worker.start()

    def when(self, moment: float) -> str:
        """Where a moment (seconds from the start) falls in the outages."""
        for mode, begun, ended in self.windows:
            if begun <= moment <= ended:
                return f"during a {mode} outage (+{begun:.1f} to +{ended:.1f} s)"
        before = [(mode, ended) for mode, _, ended in self.windows if ended < moment]
        if before:
            mode, ended = before[-1]
            return f"{moment - ended:.1f} s after a {mode} outage ended"
        return "before any outage"

    def restore(self) -> None:
        self.proxy.restore()
        if self._outage_until is not None:
            mode, begun, _ = self.windows[-1]
            self.windows[-1] = (mode, begun, time.monotonic() - self.started)
        self._outage_until = None
        if not self.worker.running():
            self.worker.start()
        self._restart_at = None


# --------------------------------------------------------------------------- the run


def gateway_state(url: str) -> dict:
    return httpx.get(url + "/readyz", timeout=5, trust_env=False).json()


def wait_idle(urls: list[str], within: float = IDLE_WITHIN) -> list[int]:
    """Wait until no gateway holds an open request; their counts if not.
    (A process counts the /readyz request asking it, too.)"""
    deadline = time.monotonic() + within
    while True:
        counts = [gateway_state(url)["open_requests"] - 1 for url in urls]
        if not any(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def redis_warnings(gateway: Child, calm_from: datetime.datetime, outages: int) -> str:
    """How many Redis outages a gateway saw (one warning each, by the
    docs/operations.md), against how many the soak made; and how many in the calm end."""
    calm = calm_from.strftime("%Y-%m-%d %H:%M:%S,%f")[:23]
    seen = [line for line in gateway.log_path.read_text(errors="replace").splitlines()
            if "hopbase.dependencies redis unreachable" in line]
    late = [line for line in seen if line[:23] >= calm]
    kinds = collections.Counter(line.split("unreachable (", 1)[1].split(":", 1)[0] for line in late)
    return (f"warnings:    {gateway.name} logged 'redis unreachable' {len(seen)} times for {outages} outages,"
            f" {len(late)} of them in the calm end" + (f" ({_counts(kinds)})" if kinds else ""))


def pct(before: float, after: float) -> float:
    return 100.0 * (after - before) / before if before else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION, help="seconds of traffic (default 180)")
    parser.add_argument("--concurrency", type=int, default=24, help="clients sending at once (default 24)")
    parser.add_argument("--seed", type=int, default=None, help="the random schedule's seed (default: a new one)")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/",
                        help="PostgreSQL server (and soak database name, if it starts with hopbase_soak)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0",
                        help="Redis for the gateways, the worker (its broker) and the limits")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and the database")
    parser.add_argument("--no-redis-outages", action="store_true", help="leave Redis alone (to tell causes apart)")
    parser.add_argument("--no-worker-kills", action="store_true", help="leave the worker alone (likewise)")
    args = parser.parse_args()
    if args.duration < 10 or args.concurrency < 2:
        parser.error("--duration must be at least 10 s and --concurrency at least 2")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    try:
        database_url = soak_books.soak_database_url(args.database_url)
    except ValueError as error:
        parser.error(str(error))
    redis_url = args.redis_url
    raise_fd_limit()
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # required; this run's own

    # The schedule: a warm-up with every kind of trouble in it, then more of
    # it, then a calm end (everything restored, traffic still flowing).
    warm_up = min(60.0, max(6.0, 0.3 * args.duration))
    calm = min(20.0, max(4.0, 0.15 * args.duration))
    key_concurrency = max(2, args.concurrency * 3 // 4)
    channel_concurrency = max(1, args.concurrency // 8)

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="hopbase-soak-"))
    children: list[Child] = []
    gateways: list[Child] = []
    proxy: ProxyProcess | None = None
    worker: Worker | None = None
    traffic: Traffic | None = None
    world = None
    database_made = False
    failed = False
    try:
        log(f"temporary folder {tmp}; database {soak_books.database_name(database_url)}; seed {seed}")
        soak_books.create_database(database_url)
        database_made = True
        soak_books.setup_django(database_url, redis_url)
        soak_books.migrate()

        base_env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBASE_")}
        base_env.update({"DATABASE_URL": database_url, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1",
                         "DJANGO_SETTINGS_MODULE": "hopbase.settings", "HOPBASE_SPOOL_DIR": str(tmp / "spool")})
        sim_port = free_port()
        sim_url = f"http://127.0.0.1:{sim_port}"
        children.append(Child("simulator", [sys.executable, "manage.py", "simulate_upstream", "--host", "127.0.0.1",
                                            "--port", str(sim_port)], base_env, tmp))
        children[-1].wait_ready(sim_url + "/_sim/health")
        world = soak_books.make_world(sim_url, key_concurrency, channel_concurrency)

        redis_parts = urlsplit(redis_url)
        proxy = ProxyProcess(redis_parts.hostname or "127.0.0.1", redis_parts.port or 6379)
        proxied = {**base_env, "REDIS_URL": through(redis_url, proxy.port)}
        gateway_env = {**proxied, **GATEWAY_SETTINGS}
        daphne = [str(BIN / "daphne")] if (BIN / "daphne").exists() else [sys.executable, "-m", "daphne"]
        urls = []
        for number in (1, 2):
            port = free_port()
            args_ = [*daphne, "-v", "0", "-e", f"tcp:port={port}:interface=127.0.0.1:backlog=4096",
                     "hopbase.asgi:application"]
            gateways.append(Child(f"gateway-{number}", args_, gateway_env, tmp))
            urls.append(f"http://127.0.0.1:{port}")
        for gateway, url in zip(gateways, urls, strict=True):
            gateway.wait_ready(url + "/readyz")
        worker = Worker({**proxied, "HOPBASE_LOG_LEVEL": "INFO"}, tmp)
        worker.start()
        worker.wait_ready()

        settings_lines = [
            "command:     " + shlex.join([Path(sys.executable).name, *sys.argv]),
            f"effective:   --duration {args.duration:g} --concurrency {args.concurrency} --seed {seed}"
            + (" --no-redis-outages" if args.no_redis_outages else "")
            + (" --no-worker-kills" if args.no_worker_kills else "")
            + f" (warm-up {warm_up:g} s, calm end {calm:g} s)",
            f"database:    {database_url}",
            f"redis:       {redis_url}, through a proxy on port {proxy.port}",
            "gateways:    2 x " + shlex.join([Path(daphne[0]).name, *daphne[1:], "-v", "0", "-e", "tcp:…",
                                              "hopbase.asgi:application"]),
            "             " + " ".join(f"{k}={v}" for k, v in GATEWAY_SETTINGS.items()),
            "worker:      celery -A hopbase worker --pool=solo",
            f"limits:      key concurrency {key_concurrency}; per protocol one channel with max_concurrency"
            f" {channel_concurrency} and one without",
        ]
        for line in settings_lines:
            log(line)

        # ---- traffic and chaos
        traffic = Traffic(urls, world.key, args.concurrency, seed)
        thread = threading.Thread(target=traffic.run, name="soak-traffic", daemon=True)
        thread.start()
        if not traffic.started.wait(30):
            raise RuntimeError("the traffic did not start")
        started = time.monotonic()
        started_redis = soak_books.redis_now(redis_url)
        end_at, warm_at = started + args.duration, started + warm_up
        chaos = Chaos(proxy, worker, random.Random(seed), calm_at=end_at - calm,
                      outages_on=not args.no_redis_outages, kills_on=not args.no_worker_kills)
        chaos.begin(started)
        calm_wall = datetime.datetime.now() + datetime.timedelta(seconds=end_at - calm - time.monotonic())
        rss_warm: list[float] | None = None
        rss_peak = [0.0 for _ in gateways]
        next_forget = started + SIMULATOR_RECORDS_EVERY
        while (now := time.monotonic()) < end_at:
            if not thread.is_alive():
                raise RuntimeError(f"the traffic stopped: {traffic.failure!r}")
            for gateway in gateways:
                if gateway.process.poll() is not None:
                    raise RuntimeError(f"{gateway.name} died with {gateway.process.returncode}:\n{gateway.log_tail()}")
            rss_peak = [max(peak, rss_mb(g.pid)) for peak, g in zip(rss_peak, gateways, strict=True)]
            if rss_warm is None and now >= warm_at:
                rss_warm = [rss_mb(g.pid) for g in gateways]
                log(f"warm-up over after {len(traffic.outcomes)} requests; RSS "
                    + ", ".join(f"{g.name} {r:.1f} MB" for g, r in zip(gateways, rss_warm, strict=True)))
            chaos.step(now)
            if now >= next_forget:
                with contextlib.suppress(httpx.HTTPError):  # only to bound the simulator's memory
                    httpx.delete(sim_url + "/_sim/records", timeout=5, trust_env=False)
                next_forget = now + SIMULATOR_RECORDS_EVERY
            time.sleep(0.1)  # the schedule's tick

        # ---- the end: stop the traffic, restore everything, let the gateways drain
        traffic.stop.set()
        log(f"traffic stopping after {len(traffic.outcomes)} requests")
        thread.join(REQUEST_TIMEOUT + 15)
        if thread.is_alive():
            raise RuntimeError("the traffic did not stop")
        if traffic.failure is not None:
            raise RuntimeError(f"the traffic failed: {traffic.failure!r}")
        chaos.restore()
        worker.wait_ready()
        open_counts = wait_idle(urls)
        if any(open_counts):
            raise RuntimeError(f"the gateways still hold requests {IDLE_WITHIN:.0f} s after the traffic: {open_counts}")
        assert rss_warm is not None
        rss_end = [rss_mb(g.pid) for g in gateways]
        leases_idle = soak_books.live_leases(redis_url, world)
        log("the gateways are idle; draining them (SIGTERM)")
        drained: list[int | None] = []
        for gateway in gateways:
            gateway.process.send_signal(signal.SIGTERM)
        for gateway in gateways:
            try:
                drained.append(gateway.process.wait(DRAIN_WITHIN))
            except subprocess.TimeoutExpired:
                drained.append(None)
        leases_after = soak_books.live_leases(redis_url, world)
        lease_times = soak_books.live_lease_times(redis_url, world)
        settle_env = {**base_env, "HOPBASE_LOG_LEVEL": "WARNING"}
        settled = manage(["settle"], settle_env).strip()
        checked = subprocess.run([sys.executable, "manage.py", "checkledger"], cwd=ROOT, env=settle_env,
                                 capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        worker.stop()
        kept = soak_books.books(world, traffic.outcomes)

        # ---- the report
        leaked = sum(leases_after.values())
        growth = [pct(w, e) for w, e in zip(rss_warm, rss_end, strict=True)]
        ledger_ok = checked.returncode == 0
        drained_ok = all(code == 0 for code in drained)
        rss_ok = all(g < RSS_GROWTH_LIMIT for g in growth)
        lines = [*settings_lines, "",
                 f"chaos:       {len(chaos.outages)} Redis outages ({chaos.outages.count('refused')} refused,"
                 f" {chaos.outages.count('silent')} silent); worker killed {worker.kills} times, started"
                 f" {worker.starts} times" + (f"; exited by itself: {'; '.join(worker.deaths)}" if worker.deaths else ""),
                 f"mix:         {_counts(kept.scenarios)}",
                 f"answers:     HTTP {_counts(kept.client_statuses)}; {_counts(kept.client_endings)}",
                 f"rows:        {_counts(kept.row_statuses)}",
                 f"settle:      {settled}",
                 f"checkledger: {'' if ledger_ok else 'FAILED: '}{(checked.stdout + checked.stderr).strip()}",
                 f"drain:       exit codes {drained}",
                 f"slots idle:  {sum(leases_idle.values())} leases live with no request open (before the drain)",
                 *(f"leak:        {name} lease {lease} taken at +{taken - started_redis:.1f} s,"
                   f" {chaos.when(taken - started_redis)}" for name, lease, taken in lease_times),
                 *(redis_warnings(gateway, calm_wall, len(chaos.outages)) for gateway in gateways),
                 "",
                 f"requests sent:        {kept.requests_sent}",
                 f"with a request id:    {kept.with_request_id} ({kept.refused_before_key} refused before the key"
                 f" was read; {kept.without_request_id} without an id: hung up or failed before the answer began)",
                 f"request rows:         {kept.rows} ({kept.rows_unseen_by_client} for requests the client saw no id for)",
                 f"rows missing:         {len(kept.rows_missing)}",
                 f"double charges:       {kept.double_charges}",
                 f"unsettled rows:       {kept.unsettled} (after manage.py settle)",
                 f"charges:              {kept.charges} entries, {kept.charged_usd} USD",
                 f"leaked slots:         {leaked} " + _counts(leases_after),
                 ]
        for gateway, warm, end, peak, grew in zip(gateways, rss_warm, rss_end, rss_peak, growth, strict=True):
            lines.append(f"rss {gateway.name}:        {warm:.1f} MB after warm-up, {end:.1f} MB at the end"
                         f" ({grew:+.1f} %), peak {peak:.1f} MB")
        verdict = not kept.rows_missing and kept.double_charges == 0 and leaked == 0 and ledger_ok and rss_ok \
            and drained_ok and kept.unsettled == 0
        if kept.rows_missing:
            lines.append("first rows missing:   " + " ".join(kept.rows_missing[:10]))
        lines.append("verdict:              " + ("PASS" if verdict else "FAIL: " + ", ".join(
            what for what, bad in (("rows missing", bool(kept.rows_missing)), ("double charges", kept.double_charges),
                                   ("leaked slots", leaked), ("checkledger", not ledger_ok),
                                   (f"RSS growth >= {RSS_GROWTH_LIMIT:g} %", not rss_ok),
                                   ("drain exit codes", not drained_ok), ("unsettled rows", kept.unsettled)) if bad)))
        print("\n".join(lines), flush=True)
        failed = not verdict
        return 0 if verdict else 1
    except KeyboardInterrupt:
        log("interrupted; stopping the processes")
        failed = True
        return 130
    except Exception as exc:
        log(f"failed: {exc}" if isinstance(exc, RuntimeError) else f"failed:\n{traceback.format_exc()}")
        failed = True
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish cleaning up
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if traffic is not None:
            traffic.stop.set()
        if worker is not None:
            worker.stop()
        for child in reversed(gateways + children):
            child.stop()
        if proxy is not None:
            proxy.stop()
        if world is not None:
            try:
                soak_books.forget_counters(redis_url, world)
            except Exception as error:  # cleaning up: say so, go on
                log(f"could not remove the soak's Redis counters: {error}")
        if failed:
            for child in gateways + children + ([worker.child] if worker and worker.child else []):
                log(f"--- {child.name} log tail ---\n{child.log_tail()}")
        if args.keep or failed:
            log(f"kept {tmp} (the processes' logs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if args.keep:
            log(f"kept the database {soak_books.database_name(database_url)}")
        elif database_made:
            soak_books.drop_database(database_url)


def _counts(counter) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counter.items(), key=lambda item: -item[1]))


if __name__ == "__main__":
    sys.exit(main())
