"""`manage.py serve`: several gateway processes on one port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import database_url_for_subprocess
from tests.processes import ROOT, free_port, wait_until_serving


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.gateway
@pytest.mark.usefixtures("world")
def test_it_runs_the_workers_on_one_port_and_stops_them_all():
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess()}
    service = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # so that a failed test can stop the workers too
    )
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/healthz", service)
        workers = children_of(service.pid)
        assert len(workers) == 2
        assert all(httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200 for _ in range(10))
        service.send_signal(signal.SIGTERM)
        assert service.wait(10) == 0
        assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text() for pid in workers)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait()
