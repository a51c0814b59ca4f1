"""The production topology without Docker (tests/processes/test_production_shape.py):
Debian's nginx on the deploy/nginx.conf that docker-compose.yml mounts, with
only its marked lines rewritten (listen address, upstream servers, user,
paths), in front of ``manage.py serve``, with a Celery worker and beat.

Every process runs in a session of its own, logs to a file, and is stopped
with SIGTERM (then SIGKILL to its whole group) within a bounded time.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.processes import ROOT, free_port

NGINX = Path("/usr/sbin/nginx")
TEMPLATE = ROOT / "deploy" / "nginx.conf"
# Where the official nginx image keeps its state; all of it moves to the test's directory.
IMAGE_PATHS = re.compile(r"/var/(?:log|cache)/nginx/|/var/run/")


def sub_once(pattern: str, replacement, text: str) -> str:
    """One rewrite of a line the template marks; anything else means the
    template changed under the test, which must say so, not test another file."""
    text, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"deploy/nginx.conf: expected exactly one match of {pattern!r}, found {count}"
    return text


def render(template: str, *, listen: str, upstreams: list[str], directory: Path) -> str:
    """deploy/nginx.conf for a process of this user on ``listen``, proxying to ``upstreams``."""
    # The image's workers run as `nginx`. As root here they would fall back to
    # `nobody`, who cannot enter the private test directory: keep root's own.
    user = "user root;" if os.geteuid() == 0 else ""
    text = sub_once(r"^user nginx;", user, template)
    text = sub_once(r"^(\s*listen\s+)80\b", rf"\g<1>{listen}", text)
    text = sub_once(
        r"^(\s*)server gateway:8000;.*$",
        lambda match: "\n".join(f"{match[1]}server {upstream};" for upstream in upstreams),
        text,
    )
    text, count = IMAGE_PATHS.subn(f"{directory}/", text)
    assert count >= 8, "deploy/nginx.conf: pid, logs and temp paths not found"
    assert not re.search(r"^[^#\n]*\s/(?:var|run|etc)/", text, flags=re.MULTILINE), "a path left outside the test"
    return text


class Process:
    """A child process in a session of its own, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open for the process's life)
        self.process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.output()[-3000:]}")
            if ready():
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no {what} within {timeout} s:\n{self.output()[-3000:]}")

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM, then SIGKILL to the whole group; the exit status of a clean stop."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
            with_children = self.process.returncode is None
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # whatever is left of its group
            except ProcessLookupError:
                pass
            self.process.wait(5)
            return None if with_children else self.process.returncode
        finally:
            self._log.close()


def answers(url: str, status: int = 200) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == status
        except httpx.HTTPError:
            return False

    return check


class Nginx(Process):
    """Debian's nginx on deploy/nginx.conf, in the foreground, with its pid,
    logs and temp files in ``directory``."""

    def __init__(self, directory: Path, upstreams: list[str]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = directory / "nginx.conf"
        self.config.write_text(
            render(TEMPLATE.read_text(), listen=f"127.0.0.1:{self.port}", upstreams=upstreams, directory=directory)
        )
        self.access_log = directory / "access.log"
        self.error_log = directory / "error.log"
        super().__init__(
            "nginx",
            [str(NGINX), "-p", str(directory), "-c", str(self.config), "-e", str(directory / "startup.log"),
             "-g", "daemon off;"],
            dict(os.environ),
            directory,
        )
        self.wait_until(answers(self.url + "/_nginx/health"), 10, "answer on /_nginx/health")

    def output(self) -> str:
        logs = [self.log_path, self.directory / "startup.log", self.error_log]
        return "\n".join(path.read_text(errors="replace") for path in logs if path.exists())


def serve(env: dict[str, str], log_dir: Path, workers: int = 2) -> tuple[Process, str]:
    """``manage.py serve --workers N``, as docker-compose.yml runs the gateway."""
    port = free_port()
    process = Process(
        "gateway",
        [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
        env,
        log_dir,
    )
    return process, f"127.0.0.1:{port}"


def celery(role: str, args: list[str], env: dict[str, str], log_dir: Path) -> Process:
    return Process(role, [sys.executable, "-m", "celery", "-A", "hopbase", role, *args], env, log_dir)
