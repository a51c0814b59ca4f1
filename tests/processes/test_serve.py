"""`manage.py serve`: several gateway processes on one port."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import database_url_for_subprocess
from tests.support.processes import ROOT, SERVERS, free_port, wait_until_serving


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def connection_holders(pids: list[int], port: int) -> dict[int, int]:
    """Which of the processes holds each established connection to ``port``,
    by the connection's client port (from /proc: the socket inodes of each
    process's descriptors, and the kernel's table of TCP sockets)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes[target[len("socket:["):-1]] = pid
    holders = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        if state == "01" and int(local.split(":")[1], 16) == port and inode in inodes:
            holders[int(remote.split(":")[1], 16)] = inodes[inode]
    return holders


def open_together(port: int, count: int) -> list[socket.socket]:
    """``count`` connections to ``port``, opened at once (a burst, as a load
    balancer's or an SDK's pool opens them), each with one request answered
    and kept alive."""
    request = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
    selector = selectors.DefaultSelector()
    for sock in sockets:
        selector.register(sock, selectors.EVENT_WRITE)
    waiting, answered = set(sockets), {sock: b"" for sock in sockets}
    deadline = time.monotonic() + 20
    while waiting and time.monotonic() < deadline:
        for key, events in selector.select(timeout=1):
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:
                sock.send(request)
                selector.modify(sock, selectors.EVENT_READ)
            else:
                answered[sock] += sock.recv(65536)
                if b"\r\n\r\n" in answered[sock]:
                    selector.unregister(sock)
                    waiting.discard(sock)
    selector.close()
    assert not waiting, f"{len(waiting)} of {count} connections got no answer"
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answered.values())
    return sockets


def start_serve(port: int, workers: int, server: str = "uvicorn") -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess()}
    return subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", str(workers), "--server", server],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that a failed test can stop the workers too
    )


@contextlib.contextmanager
def serving(port: int, workers: int = 2, server: str = "uvicorn") -> Iterator[subprocess.Popen]:
    """``manage.py serve`` on ``port``, answering; stopped after."""
    service = start_serve(port, workers, server)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/healthz", service)
        yield service
    finally:
        stop(service)


def stop(service: subprocess.Popen) -> None:
    """Kill it with its workers if it has not stopped."""
    if service.poll() is None:
        os.killpg(service.pid, signal.SIGKILL)
    service.wait()
    service.stderr.close()


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
@pytest.mark.parametrize("server", SERVERS)
def test_it_runs_the_workers_on_one_port_and_stops_them_all(server):
    port = free_port()
    with serving(port, server=server) as service:
        workers = children_of(service.pid)
        assert len(workers) == 2
        assert all(f"--server {server}" in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ") for pid in workers)
        # Each runs its server on uvloop (hopbase.serve_worker), not asyncio's loop.
        assert all("/uvloop/loop." in Path(f"/proc/{pid}/maps").read_text() for pid in workers)
        assert all(httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200 for _ in range(10))
        service.send_signal(signal.SIGTERM)
        assert service.wait(10) == 0
        assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text() for pid in workers)


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
@pytest.mark.parametrize("server", SERVERS)
def test_keep_alive_connections_opened_together_spread_over_the_workers(server):
    port = free_port()
    with serving(port, server=server) as service:
        workers = children_of(service.pid)
        connections = open_together(port, 24)
        try:
            holders = connection_holders(workers, port)
            ours = {sock.getsockname()[1] for sock in connections}
            assert set(holders) >= ours
            # Spread by the kernel over the two sockets by address: all 24 on
            # one worker would happen once in 8 million runs.
            held = {pid: sum(1 for client in ours if holders[client] == pid) for pid in workers}
            assert all(count > 0 for count in held.values()), held
        finally:
            for sock in connections:
                sock.close()


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
def test_a_port_already_listened_on_is_refused():
    port = free_port()
    with serving(port):
        second = start_serve(port, 2)
        try:
            assert second.wait(30) != 0
            assert f"cannot listen on 127.0.0.1:{port}" in second.stderr.read().decode()
        finally:
            stop(second)
