"""``manage.py serve``'s workers as a production server: the
listen backlog, keep-alive connections kept and then closed when idle, no
access line (Gemini's ``?key=``), under both servers; a worker that has
drained goes on answering until its peers have too, so none resets the
connections queued on its socket (serving.worker_group); and an operator's
PROMETHEUS_MULTIPROC_DIR keeps the files of processes still running."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from hopbase.management.commands.serve import fresh_metrics_dir
from hopbase.serve_worker import BACKLOG
from tests.support.drain_harness import DRAIN_TIMEOUT, WITHIN, InFlight, ServeGroup, send, tagged, wait_for_exit
from tests.support.processes import SERVERS
from tests.support.wire import call

LONG = "tokens=200 pace=0.05"  # still open at the drain's deadline
# The held stream's drain deadline: the window in which the test must see the
# first worker's "drained" line and call it, wide enough for a loaded machine
# (.ci/run once closed DRAIN_TIMEOUT's 3 s under Daphne).
PEER_DRAIN_TIMEOUT = 2 * DRAIN_TIMEOUT


def listen_backlogs(port: int) -> list[int]:
    """The backlog of each socket listening on ``port`` (``ss``: a listening
    socket's Send-Q is its backlog)."""
    listed = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=WITHIN)
    return [int(line.split()[2]) for line in listed.stdout.splitlines() if line.strip()]


def drained_workers(log_path: Path) -> int:
    """How many workers have logged the end of their own drain."""
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    return sum(1 for line in lines if line["logger"] == "hopbase.lifecycle" and line["message"] == "drained")


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer to a GET of /healthz (chunked or with a length)."""
    answer = b""
    while not (answer.endswith(b"\r\n0\r\n\r\n") or re.search(rb"content-length: \d+\r\n\r\n.+", answer, re.I | re.S)):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    return answer


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_each_worker_listens_with_the_backlog_and_writes_no_access_line(world, server):
    group = ServeGroup(workers=2, server=server)
    try:
        assert listen_backlogs(group.port) == [BACKLOG, BACKLOG]
        request = call("gemini", world.key, "sim-model", "hi [sim tokens=2]", stream=False)
        # The key in the query string, as Gemini's SDKs may send it.
        path = request.path + "?key=" + world.key
        headers = {name: value for name, value in request.headers.items() if name != "x-goog-api-key"}
        answered = httpx.post(group.url + path, json=request.body, headers=headers, timeout=WITHIN)
        assert answered.status_code == 200, answered.text
    finally:
        group.process.terminate()
        wait_for_exit(group.process)
        group.stop()
    text = group.log_path.read_text()
    assert world.key not in text
    assert "POST /v1" not in text and "generateContent" not in text


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
def test_uvicorn_keeps_a_connection_for_requests_then_closes_it_when_idle():
    group = ServeGroup(workers=1, server="uvicorn", options=("--keep-alive", "1"))
    try:
        sock = socket.create_connection(("127.0.0.1", group.port), timeout=WITHIN)
        for _ in range(3):  # one connection, several requests
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
        # Idle past --keep-alive: the server closes it (the wait is bounded by WITHIN).
        assert sock.recv(65536) == b""
        sock.close()
    finally:
        group.stop()


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_a_worker_that_drained_first_answers_until_its_peer_has_drained(world, server):
    """One worker holds a stream until the drain's deadline; the other has
    nothing open and drains at once, but keeps its socket and answers (503,
    table E) until serve lets both go: had it exited, the kernel would have
    reset the connections queued on its socket."""
    group = ServeGroup(workers=2, server=server, HOPBASE_DRAIN_TIMEOUT=str(PEER_DRAIN_TIMEOUT))
    try:
        held = InFlight(group.url, "chat", world.key, tagged(LONG))
        assert held.started.wait(WITHIN) and held.error is None
        terminated = time.monotonic()
        group.process.terminate()
        deadline = terminated + WITHIN
        while drained_workers(group.log_path) < 1:
            assert time.monotonic() < deadline, "no worker drained"
            time.sleep(0.02)
        seen = time.monotonic()
        # Until the held stream ends (at the drain's deadline), both sockets
        # listen, and every new connection (spread over both) is answered.
        answered = 0
        while not held.done.is_set():
            assert len(listen_backlogs(group.port)) == 2, "a drained worker stopped listening before its peer"
            assert send(group.url, "chat", world.key, stream=False).status_code == 503
            answered += 1
        assert answered > 0, (
            f"the held stream ended before the first worker's drain did: the first 'drained' line seen "
            f"{seen - terminated:.2f} s after SIGTERM, the held stream ended "
            f"{(held.ended_at or seen) - terminated:.2f} s after it ({held.error!r}); log:\n"
            + group.log_path.read_text()[-2000:])
        assert wait_for_exit(group.process) == 0
        held.wait()
        assert drained_workers(group.log_path) == 2
    finally:
        group.stop()


def application_loaded(pid: int) -> bool:
    """Whether the process has imported HopBase's application yet (orjson's
    library, which the request path loads, is in its memory map)."""
    return "orjson" in Path(f"/proc/{pid}/maps").read_text()


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (its SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE).group(1), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_a_sigterm_while_the_workers_start_is_a_drain_once_they_serve(world, server):
    """Stopped while its workers are still importing the application, serve
    ends as a drain: each worker starts, drains with nothing open and says
    so, instead of dying with what the kernel had queued on its socket."""
    group = ServeGroup(workers=2, server=server, started=False)
    try:
        deadline = time.monotonic() + WITHIN
        while len(workers := group.children()) < 2 or not all(catches_sigterm(pid) for pid in workers):
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.005)
        # The workers are still importing the application (a second or two).
        assert not any(application_loaded(pid) for pid in workers)
        group.process.terminate()
        assert wait_for_exit(group.process) == 0
        assert drained_workers(group.log_path) == 2, group.log_path.read_text()[-2000:]
    finally:
        group.stop()


def test_serve_keeps_the_metrics_files_of_processes_still_running(tmp_path, settings):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    live = tmp_path / f"counter_{os.getpid()}.db"
    dead = tmp_path / f"counter_{ended.pid}.db"
    dead_gauge = tmp_path / f"gauge_livesum_{ended.pid}.db"
    for file in (live, dead, dead_gauge):
        file.write_bytes(b"\0" * 8)
    settings.PROMETHEUS_MULTIPROC_DIR = str(tmp_path)
    assert fresh_metrics_dir() == tmp_path
    assert live.exists()
    assert not dead.exists() and not dead_gauge.exists()
