"""A real Celery worker for the tests that need one (settlement, budget
alerts, spend): ``celery -A hopbase worker`` as a process of its own, on the
test database, consuming a queue of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

from django.conf import settings

from tests.conftest import database_url_for_subprocess
from tests.support.processes import ROOT
from tests.support.settlement_checks import wait_for


def worker_redis_url() -> str:
    # CI sets REDIS_URL; locally Redis runs on this machine all the same.
    return settings.REDIS_URL or "redis://127.0.0.1:6379/13"


class Worker:
    """``celery -A hopbase worker --pool=solo`` on the test database,
    consuming one queue of its own."""

    def __init__(self, broker: str, queue: str, env: dict[str, str] | None = None) -> None:
        self.log_path = ROOT / "var" / f"worker-{queue}-{uuid.uuid4().hex[:6]}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = open(self.log_path, "wb")
        full_env = {
            **os.environ,
            "DATABASE_URL": database_url_for_subprocess(),
            "REDIS_URL": broker,
            "HOPBASE_LOG_LEVEL": "INFO",
            **(env or {}),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "hopbase", "worker", "--pool=solo", "-Q", queue,
             "--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle",
             "-n", f"{queue}@%h"],
            cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            wait_for(self.ready, 30, "the worker to start")
        except AssertionError:
            self.stop()
            raise AssertionError(f"worker did not start:\n{self.log_path.read_text()[-3000:]}") from None

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")
        return b" ready." in self.log_path.read_bytes()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
