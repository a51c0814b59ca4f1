"""The soak's Redis proxy (bench/tcp_proxy.py) in a process of its own, so
that what the gateways send to Redis never waits for the soak's own
Python (its traffic, its bookkeeping) to let go of the GIL. Controlled
through a pipe; the same calls as ``TcpProxy``.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection

COMMAND_TIMEOUT = 10.0  # a hang detector


def _serve(commands: Connection, host: str, port: int) -> None:
    from bench.tcp_proxy import TcpProxy

    proxy = TcpProxy(host, port).start()
    commands.send(proxy.port)
    while True:
        try:
            command = commands.recv()
        except EOFError:  # the soak is gone
            command = "stop"
        if command == "stop":
            proxy.stop()
            commands.send("ok")
            return
        getattr(proxy, command)()
        commands.send("ok")


class ProxyProcess:
    def __init__(self, target_host: str, target_port: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._commands, theirs = context.Pipe()
        self.process = context.Process(target=_serve, args=(theirs, target_host, target_port), daemon=True,
                                       name="soak-redis-proxy")
        self.process.start()
        theirs.close()
        self.port: int = self._answer()

    def _answer(self):
        if not self._commands.poll(COMMAND_TIMEOUT):
            raise RuntimeError("the Redis proxy process did not answer")
        return self._commands.recv()

    def _do(self, command: str) -> None:
        self._commands.send(command)
        self._answer()

    def refuse(self) -> None:
        self._do("refuse")

    def silence(self) -> None:
        self._do("silence")

    def restore(self) -> None:
        self._do("restore")

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self._do("stop")
            except (OSError, EOFError, RuntimeError):
                pass
        self.process.join(COMMAND_TIMEOUT)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(COMMAND_TIMEOUT)
