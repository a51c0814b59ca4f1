"""One ``manage.py serve`` worker: HopBase on uvicorn (the default) or on
Daphne, on uvloop either way, serving the listening socket ``serve``
hands it (``--fd``).

uvicorn, with uvloop and httptools, spends about half of Daphne's CPU per
request and per streamed event on the same bare relay (bench/floor.py:
docs/performance.md); serving.uvicorn_web gives it what HopBase changes in
Twisted under Daphne (serving.twisted_web, serving.lifecycle).

``--server daphne`` runs Daphne's own command line. Daphne makes its event
loop when ``daphne.server`` is imported, so the plain ``daphne`` command
always runs asyncio's loop (the operator contract keeps that command
working as it is). Here uvloop's policy is set first, and the loop Daphne
makes is uvloop's: Twisted's reactor drives its sockets through the loop's
``add_reader`` and ``add_writer``, which uvloop provides.

``--drained-fd`` and ``--release-fd`` are the pipes of serving.worker_group.
A stop signal that arrives while the worker starts is obeyed once it
serves (serving.early_signals).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys

import uvloop

from serving import early_signals

BACKLOG = 4096  # connections the kernel queues on each worker's socket
APPLICATION = "hopbase.asgi:application"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hopbase.serve_worker")
    parser.add_argument("--server", choices=("uvicorn", "daphne"), default="uvicorn")
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket")
    parser.add_argument("--keep-alive", type=float, default=75.0, help="seconds an idle connection is kept (uvicorn)")
    parser.add_argument("--drained-fd", type=int)
    parser.add_argument("--release-fd", type=int)
    args = parser.parse_args(argv)
    early_signals.hold()
    if args.drained_fd is not None and args.release_fd is not None:
        from serving import worker_group

        worker_group.join(args.drained_fd, args.release_fd)
    if args.server == "daphne":
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        from daphne.cli import CommandLineInterface  # makes Daphne's loop: after the policy
        from twisted.internet import reactor  # Daphne's, installed by that import

        # Twisted's own handlers are in place once it runs: a stop that came
        # while starting is obeyed then, as a SIGTERM is (serving.lifecycle).
        reactor.callWhenRunning(lambda: early_signals.pending() and reactor.stop())
        CommandLineInterface().run(["-v", "0", "--fd", str(args.fd), APPLICATION])
        return
    import hopbase.asgi  # sets Django up, which serving.uvicorn_web's imports need
    from serving import uvicorn_web

    uvicorn_web.serve(hopbase.asgi.application, socket.socket(fileno=args.fd), args.keep_alive, BACKLOG)


if __name__ == "__main__":
    main(sys.argv[1:])
