"""serve [--host H] [--port N] [--workers N] [--server uvicorn|daphne]
[--keep-alive S]: several gateway processes on one port.

One worker is one event loop on one core, uvloop's (hopbase.serve_worker),
running HopBase on uvicorn (the default: about half Daphne's CPU per
request and per streamed event) or, with ``--server daphne``, on Daphne as
before. Each worker is handed a listening socket of its own (``--fd``),
bound here to the one port with ``SO_REUSEPORT`` and a large backlog: the
kernel spreads new connections over the sockets by their addresses. On one
socket shared by all, the worker that woke first would accept a whole
burst, so the few keep-alive connections of a load balancer or an SDK's
pool, opened together, would all land on one worker.
The workers are stateless, so any number can share the port. On SIGINT or
SIGTERM they all drain (rule D1) and stop together once every one has
drained (serving.worker_group: a worker that stopped early would reset the
connections queued on its socket); it stops them all when any of them dies.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client.multiprocess import mark_process_dead

from core import loggers
from hopbase.serve_worker import BACKLOG


def fresh_metrics_dir() -> Path:
    """Where the workers keep their metrics (prometheus-client's multiprocess
    mode), so that any of them answers a scrape with the totals of all: a
    new folder, or the operator's PROMETHEUS_MULTIPROC_DIR rid of the files
    of processes that have ended. A file of a running process is kept: it
    may be another ``serve``'s, sharing the folder (its counts then add to
    this one's)."""
    given = settings.PROMETHEUS_MULTIPROC_DIR
    if not given:
        return Path(tempfile.mkdtemp(prefix="hopbase-metrics-"))
    folder = Path(given)
    folder.mkdir(parents=True, exist_ok=True)
    live = set()
    for file in folder.glob("*.db"):
        # prometheus-client names each file after its process: counter_1234.db
        pid = file.stem.rpartition("_")[2]
        if pid.isascii() and pid.isdigit() and process_exists(int(pid)):
            live.add(pid)
        else:
            file.unlink(missing_ok=True)
    if live:
        logging.getLogger(loggers.SERVE).warning(
            "PROMETHEUS_MULTIPROC_DIR %s holds the metrics of running processes %s: kept, and added to this "
            "serve's totals", folder, ", ".join(sorted(live)))
    return folder


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets listening on ``host:port`` together. A port already
    listened on is refused, even by sockets that would share it (another
    ``serve`` on the same port would silently take half its connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sockets: list[socket.socket] = []
    try:
        probe.bind((host, port))
        port = probe.getsockname()[1]
        probe.close()
        for _ in range(count):
            listener = socket.socket(family)
            sockets.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            listener.bind((host, port))
            listener.listen(BACKLOG)
    except OSError as error:
        probe.close()
        for listener in sockets:
            listener.close()
        raise CommandError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sockets


class Stopping(Exception):
    """Raised by the signal handler to leave the wait for a worker's end."""


class Command(BaseCommand):
    help = "Run several gateway processes sharing one port (uvicorn by default, or Daphne)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
        parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn")
        # Longer than a load balancer's own idle timeout (60 s on the common
        # ones), so that it, not the gateway, closes an idle connection: one
        # closed by the server as a request is sent on it fails that request.
        parser.add_argument("--keep-alive", type=float, default=75.0,
                            help="seconds an idle client connection is kept open (uvicorn; Daphne keeps them)")

    def handle(self, *args, host: str, port: int, workers: int, server: str, keep_alive: float, **options) -> None:
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        listeners = listening_sockets(host, port, workers)
        children: list[subprocess.Popen] = []
        stopping = False

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal stopping
            if not stopping:
                stopping = True
                raise Stopping

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        metrics_dir = fresh_metrics_dir()
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        drained_read, drained_write = os.pipe()
        release_read, release_write = os.pipe()
        crashed = False
        try:
            for listener in listeners:
                fd = listener.fileno()
                command = [sys.executable, "-m", "hopbase.serve_worker", "--server", server, "--fd", str(fd),
                           "--keep-alive", str(keep_alive), "--drained-fd", str(drained_write),
                           "--release-fd", str(release_read)]
                children.append(subprocess.Popen(command, pass_fds=[fd, drained_write, release_read], env=env))
                # Its worker's alone from now on: held here too, it would stay in
                # the port's group after the worker died, taking connections no
                # one accepts.
                listener.close()
            os.close(drained_write)
            os.close(release_read)
            self.stdout.write(f"HopBase serving on http://{host}:{port} with {workers} {server} worker(s)")
            self.stdout.flush()
            # The first worker to end (or a signal) ends the service.
            pid, _ = os.wait()
            crashed = True
            mark_process_dead(pid, str(metrics_dir))
        except Stopping:
            pass
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for child in children:
                if child.poll() is None:
                    child.terminate()
            wait_until_drained(children, drained_read)
            os.close(release_write)  # every worker may stop now
            os.close(drained_read)
            for child in children:
                child.wait()
                mark_process_dead(child.pid, str(metrics_dir))
            if not settings.PROMETHEUS_MULTIPROC_DIR:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        if crashed:
            # A supervisor restarting on failure should see one.
            raise CommandError("a gateway worker exited; all workers stopped")


def wait_until_drained(children: list[subprocess.Popen], drained: int) -> None:
    """Until every worker has said it drained (serving.worker_group) or has
    ended. Each worker's drain is bounded (HOPBASE_DRAIN_TIMEOUT and the
    flushes after it), so this is too."""
    said: set[int] = set()
    buffered = b""
    while not all(child.pid in said or child.poll() is not None for child in children):
        # Woken by a line, or every so often to see a worker that ended.
        if select.select([drained], [], [], 0.2)[0]:
            data = os.read(drained, 4096)
            if not data:
                return  # every worker has ended
            buffered += data
            *lines, buffered = buffered.split(b"\n")
            said.update(int(line) for line in lines if line.isascii() and line.isdigit())
