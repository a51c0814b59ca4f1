"""Periodic jobs: one named job, one daemon thread, a fixed pause between runs.

Each job has a thread of its own, so one job's slowness (a database outage
waited out, a long sweep) or exception never delays or ends another. A run
that raises is logged (with its traceback the first time in a row, then one
line per failure) and the job simply runs again at its next tick.

Before each run the thread drops a broken or aged database connection
(``core.snapshots.refresh_connection``: no request signal ever does it
here); when the thread ends it closes its connections.

    job = Periodic("health", write_health, interval=1.0, run_on_stop=True).start()
    ...
    job.stop()  # tests; a process simply exits (daemon threads)

``run_on_stop`` runs the job once more while stopping, for jobs that hold
something in memory worth writing before a clean exit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Self

from django.db import connections

from core import loggers
from core.snapshots import refresh_connection

log = logging.getLogger(loggers.PERIODIC)


class BackgroundThread:
    """One named daemon thread and its stop signal: started once, asked to
    stop, waited for. A subclass's ``_loop`` is the thread's work, which
    ends once ``_stopping`` is set."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Start the thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"hopbase-{self.name}", daemon=True)
                self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the thread to end after what it is doing, without waiting."""
        self._stopping.set()

    def stop(self, timeout: float = 10) -> bool:
        """Ask the thread to end and wait up to ``timeout`` seconds for it;
        True when it has ended."""
        self.request_stop()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _loop(self) -> None:
        raise NotImplementedError


class Periodic(BackgroundThread):
    def __init__(
        self,
        name: str,
        job: Callable[[], object],
        interval: float,
        *,
        first_delay: float | None = None,
        run_on_stop: bool = False,
    ) -> None:
        super().__init__(name)
        self._job = job
        self._interval = interval
        # By default the first run waits one interval, like every other.
        self._first_delay = interval if first_delay is None else first_delay
        self._run_on_stop = run_on_stop
        self._failures_in_a_row = 0

    def _loop(self) -> None:
        try:
            if not self._stopping.wait(self._first_delay):
                while True:
                    self._run_once()
                    if self._stopping.wait(self._interval):
                        break
            if self._run_on_stop:
                self._run_once()
        finally:
            connections.close_all()

    def _run_once(self) -> None:
        try:
            refresh_connection()
            self._job()
        except Exception as error:
            self._failures_in_a_row += 1
            if self._failures_in_a_row == 1:
                log.exception("periodic job %s failed; it runs again in %.3g s", self.name, self._interval)
            else:
                log.warning(
                    "periodic job %s failed again (%d in a row): %s: %s",
                    self.name, self._failures_in_a_row, type(error).__name__, error,
                )
        else:
            if self._failures_in_a_row:
                log.info("periodic job %s recovered after %d failures", self.name, self._failures_in_a_row)
            self._failures_in_a_row = 0
