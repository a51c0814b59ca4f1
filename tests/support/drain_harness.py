"""Gateways of their own for the drain, readiness and overload tests: each
test starts one (with its own settings), signals it, and watches it end.
Requests in flight run on threads, so the test can act while they stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from django.conf import settings

from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.processes import BIN, ROOT, Service, free_port, gateway_command, wait_until_serving
from tests.support.relay_checks import new_tag
from tests.support.wire import Call, call

DRAIN_TIMEOUT = 3.0
# Every wait below is a hang detector, not a measurement.
WITHIN = 20.0
# Table E, per protocol: how to read the error's class from a body.
ERROR_CLASS = {
    "chat": lambda body: (body["error"]["type"], body["error"]["code"]),
    "responses": lambda body: (body["error"]["type"], body["error"]["code"]),
    "messages": lambda body: body["error"]["type"],
    "gemini": lambda body: body["error"]["status"],
}
UNAVAILABLE = {
    "chat": (503, ("server_error", "server_error")),
    "responses": (503, ("server_error", "server_error")),
    "messages": (503, "api_error"),
    "gemini": (503, "UNAVAILABLE"),
}
FULL = {
    "chat": (429, ("rate_limit_exceeded", "rate_limit_exceeded")),
    "responses": (429, ("rate_limit_exceeded", "rate_limit_exceeded")),
    "messages": (529, "overloaded_error"),
    "gemini": (429, "RESOURCE_EXHAUSTED"),
}


def gateway_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess(), **extra}
    if settings.REDIS_URL:
        env.setdefault("REDIS_URL", settings.REDIS_URL)
    else:
        env.pop("REDIS_URL", None)
    return env


def start_daphne(**extra: str) -> Service:
    """A gateway started the contract's way (``daphne -v 0 -e tcp:…``)."""
    port = free_port()
    endpoint = f"tcp:port={port}:interface=127.0.0.1:backlog=4096"
    args = [str(BIN / "daphne"), "-v", "0", "-e", endpoint, "hopbase.asgi:application"]
    return Service("drain-gateway", args, gateway_env(**extra), "/healthz", port)


def start_under(server: str, **extra: str) -> Service:
    """A gateway of the test's own under ``server`` (tests.support.processes.SERVERS):
    the contract's ``daphne``, or ``manage.py serve --workers 1``."""
    if server == "daphne":
        return start_daphne(**extra)
    port = free_port()
    return Service("drain-gateway", gateway_command(server, port), gateway_env(**extra), "/healthz", port)


class ServeGroup:
    """``manage.py serve --workers N --server S``, in a session of its own so
    that a failed test can stop the workers too."""

    def __init__(self, workers: int, server: str = "uvicorn", options: tuple[str, ...] = (), started: bool = True,
                 **extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = ROOT / "var" / f"serve-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(self.port), "--workers", str(workers),
             "--server", server, *options],
            cwd=ROOT, env=gateway_env(**extra), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if started:  # else the test takes the workers as they start
            wait_until_serving(self.url + "/healthz", self.process)
            self.workers = self.children()

    def children(self) -> list[int]:
        return [int(pid) for pid in Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()


def stop_for_good(service: Service) -> None:
    if service.process.poll() is None:
        service.process.kill()
        service.process.wait()
    service.stop()


class InFlight:
    """One request on a thread of its own: its status, headers and every
    byte, and when they ended. ``started`` is set at its first body bytes
    (a stream past its commit), or at its end."""

    def __init__(self, base_url: str, protocol: str, key: str, prompt: str, stream: bool = True, model: str = "sim-model") -> None:
        self.protocol = protocol
        self.request: Call = call(protocol, key, model, prompt, stream=stream)
        self.url = base_url + self.request.path
        self.started = threading.Event()
        self.done = threading.Event()
        self.status: int | None = None
        self.headers: httpx.Headers | None = None
        self.body = b""
        self.ended_at: float | None = None
        self.error: Exception | None = None
        self._hang_up = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.request.body, headers=self.request.headers, timeout=WITHIN) as r:
                self.status, self.headers = r.status_code, r.headers
                for chunk in r.iter_raw():
                    self.body += chunk
                    self.started.set()
                    if self._hang_up.is_set():
                        break
        except httpx.HTTPError as error:
            self.error = error
        finally:
            self.ended_at = time.monotonic()
            self.started.set()
            self.done.set()

    @property
    def request_id(self) -> str:
        assert self.headers is not None, self.error
        return self.headers["x-hopbase-request-id"]

    def hang_up(self) -> None:
        """Close the connection at the next bytes, as a client that leaves."""
        self._hang_up.set()

    def wait(self) -> InFlight:
        assert self.done.wait(WITHIN), f"{self.protocol} request still open after {WITHIN} s"
        assert self.error is None, self.error
        return self


def tagged(directives: str) -> str:
    """A prompt the simulator answers as ``directives`` say, under a tag of its own."""
    return f"hello [sim tag={new_tag()} {directives}]"


def tag_of(prompt: str) -> str:
    return prompt.split("tag=")[1].split()[0]


def send(base_url: str, protocol: str, key: str, prompt: str = "hello", stream: bool = True) -> httpx.Response:
    """One request on a connection of its own."""
    request = call(protocol, key, "sim-model", prompt, stream=stream)
    return httpx.post(base_url + request.path, json=request.body, headers=request.headers, timeout=WITHIN)


def assert_table_e(response: httpx.Response, protocol: str, expected: dict) -> None:
    """A refusal in the caller's own format, with the headers a client needs
    to go elsewhere and come back."""
    status, error_class = expected[protocol]
    assert response.status_code == status, response.text
    assert ERROR_CLASS[protocol](response.json()) == error_class, response.text
    assert response.headers["retry-after"] == "1"
    assert response.headers["connection"] == "close"
    assert response.headers["x-hopbase-request-id"].startswith("req_")


def wait_for_exit(process: subprocess.Popen, within: float = WITHIN) -> int:
    try:
        return process.wait(within)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the gateway did not exit within {within} s") from None


def readyz(base_url: str) -> tuple[int, dict]:
    response = httpx.get(base_url + "/readyz", timeout=WITHIN)
    return response.status_code, json.loads(response.content)


def wait_for_readyz(base_url: str, status: int) -> dict:
    """Poll /readyz (a fresh connection each time) until it answers
    ``status``; its body."""
    deadline = time.monotonic() + WITHIN
    while True:
        code, body = readyz(base_url)
        if code == status:
            return body
        assert time.monotonic() < deadline, f"/readyz still {code} {body}"
        time.sleep(0.02)
