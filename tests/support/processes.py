"""Real processes for integration tests: the upstream simulator and a
gateway, each started on a free port and stopped at the end. A gateway runs
under either server (``SERVERS``): plain ``daphne``, the contract's
command, or ``manage.py serve --workers 1``, uvicorn in a worker of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]  # tests/support/ -> the project
BIN = Path(sys.executable).parent
SERVERS = ("daphne", "uvicorn")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(url: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


class Service:
    def __init__(self, name: str, args: list[str], env: dict[str, str], health_path: str, port: int) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = ROOT / "var" / f"{name}-{port}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")
        # A session of its own: a kill reaches serve's worker too.
        self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            wait_until_serving(self.url + health_path, self.process)
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"{name} did not start:\n{self.log_path.read_text()[-3000:]}") from None

    @property
    def serving_pid(self) -> int:
        """The process that serves the requests: serve's one worker, or this one."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return int(children[0]) if len(children) == 1 and "serve" in self.process.args else self.process.pid

    def kill(self) -> None:
        """SIGKILL, to every process of it (serve and its worker)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def start_simulator() -> Service:
    port = free_port()
    return Service(
        "simulator",
        [sys.executable, "manage.py", "simulate_upstream", "--port", str(port)],
        dict(os.environ),
        "/_sim/health",
        port,
    )


def gateway_command(server: str, port: int) -> list[str]:
    if server == "daphne":
        return [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "hopbase.asgi:application"]
    return [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "1", "--server", server]


def start_gateway(env: dict[str, str], server: str = "daphne") -> Service:
    port = free_port()
    return Service("gateway", gateway_command(server, port), {**os.environ, **env}, "/healthz", port)
