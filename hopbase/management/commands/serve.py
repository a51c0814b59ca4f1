"""serve [--host H] [--port N] [--workers N]: several Daphne processes on one
port.

One Daphne process is one event loop on one core, here uvloop's
(hopbase.serve_worker). Each worker is handed a listening socket of its
own (``--fd``), bound here to the one port with ``SO_REUSEPORT`` and a
large backlog: the kernel spreads new connections over the sockets by
their addresses. On one socket shared by all, the worker that woke first
would accept a whole burst (Twisted accepts up to a hundred per wake-up),
so the few keep-alive connections of a load balancer or an SDK's pool,
opened together, would all land on one worker.
The workers are stateless, so any number can share the port. Stops them all
on SIGINT or SIGTERM, and stops when any of them dies.
"""

from __future__ import annotations

import os
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

BACKLOG = 4096


def fresh_metrics_dir() -> Path:
    """Where the workers keep their metrics (prometheus-client's multiprocess
    mode), so that any of them answers a scrape with the totals of all: the
    operator's PROMETHEUS_MULTIPROC_DIR emptied, or a new folder."""
    given = settings.PROMETHEUS_MULTIPROC_DIR
    if given:
        shutil.rmtree(given, ignore_errors=True)
        Path(given).mkdir(parents=True)
        return Path(given)
    return Path(tempfile.mkdtemp(prefix="hopbase-metrics-"))


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


class Command(BaseCommand):
    help = "Run several Daphne gateway processes sharing one port."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)

    def handle(self, *args, host: str, port: int, workers: int, **options) -> None:
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        listeners = listening_sockets(host, port, workers)
        children: list[subprocess.Popen] = []
        asked_to_stop = False

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal asked_to_stop
            asked_to_stop = True
            for child in children:
                if child.poll() is None:
                    child.terminate()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        metrics_dir = fresh_metrics_dir()
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
        for listener in listeners:
            fd = listener.fileno()
            command = [sys.executable, "-m", "hopbase.serve_worker", "-v", "0", "--fd", str(fd),
                       "hopbase.asgi:application"]
            children.append(subprocess.Popen(command, pass_fds=[fd], env=env))
            # Its worker's alone from now on: held here too, it would stay in
            # the port's group after the worker died, taking connections no
            # one accepts.
            listener.close()
        self.stdout.write(f"HopBase serving on http://{host}:{port} with {workers} worker(s)")
        try:
            # The first worker to end (or a signal) ends the service; the
            # others, draining meanwhile, no longer count its open streams.
            pid, _ = os.wait()
            mark_process_dead(pid, str(metrics_dir))
        except ChildProcessError:
            pass
        finally:
            crashed = not asked_to_stop
            stop(signal.SIGTERM, None)
            for child in children:
                child.wait()
            if not settings.PROMETHEUS_MULTIPROC_DIR:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        if crashed:
            # A supervisor restarting on failure should see one.
            raise CommandError("a gateway worker exited; all workers stopped")
