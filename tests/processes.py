"""Real processes for integration tests: the upstream simulator and a Daphne
gateway, each started on a free port and stopped at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


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
        self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_until_serving(self.url + health_path, self.process)
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"{name} did not start:\n{self.log_path.read_text()[-3000:]}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
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


def start_gateway(env: dict[str, str]) -> Service:
    port = free_port()
    return Service(
        "gateway",
        [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "hopbase.asgi:application"],
        {**os.environ, **env},
        "/healthz",
        port,
    )
