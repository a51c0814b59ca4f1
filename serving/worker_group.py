"""A ``manage.py serve`` worker among its peers, at the end of a drain
(rule D1; serving.lifecycle calls ``drained_with_peers`` last).

Each worker listens on a socket of its own in the port's ``SO_REUSEPORT``
group, and the kernel queues each new connection on one of them. A worker
that exited as soon as its own drain was over would close its socket, and
the kernel would reset every connection still queued there, though its
peers were still draining and answering. So a drained worker tells
``serve`` so (its pid, a line on the *drained* pipe) and goes on
listening, refusing new requests (503, serving.admission), until ``serve``
closes the *release* pipe: once every worker has drained or ended. A
worker whose ``serve`` is gone reads the end of the pipe too, and stops.

Outside ``serve`` (plain ``daphne``, tests) there are no peers and
nothing to wait for.
"""

from __future__ import annotations

import asyncio
import os


class WorkerGroup:
    """The two pipes ``serve`` hands a worker: where it says it has drained
    (the write end) and what it waits on before stopping (the read end)."""

    def __init__(self, drained_fd: int, release_fd: int) -> None:
        self.drained_fd = drained_fd
        self.release_fd = release_fd

    async def drained(self) -> None:
        """Tell ``serve`` this worker has drained; wait until it lets the
        workers go (or is gone)."""
        # One short write to a pipe is atomic: the peers' lines never mix.
        os.write(self.drained_fd, b"%d\n" % os.getpid())
        loop = asyncio.get_running_loop()
        released = loop.create_future()
        loop.add_reader(self.release_fd, lambda: released.done() or released.set_result(None))
        try:
            await released  # nothing is ever written: readable means closed
        finally:
            loop.remove_reader(self.release_fd)


group: WorkerGroup | None = None


def join(drained_fd: int, release_fd: int) -> None:
    """Called once by hopbase.serve_worker, before serving."""
    global group
    os.set_inheritable(drained_fd, False)
    os.set_inheritable(release_fd, False)
    group = WorkerGroup(drained_fd, release_fd)


async def drained_with_peers() -> None:
    if group is not None:
        await group.drained()
