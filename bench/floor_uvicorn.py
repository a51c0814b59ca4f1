"""The floor (bench/floor.py, the bare relay) on uvicorn, as ``manage.py
serve`` runs HopBase (serving.uvicorn_web): uvloop, httptools, no access
log, a 4096 backlog. ``python -m bench.floor_uvicorn --port P`` or, on a
socket made as serve makes its workers', ``--fd N``."""

from __future__ import annotations

import argparse
import logging
import socket

import uvicorn


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor_uvicorn")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int)
    where.add_argument("--fd", type=int)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = uvicorn.Config("bench.floor:application", host="127.0.0.1", port=args.port or 0, loop="uvloop",
                            http="httptools", ws="none", lifespan="off", log_config=None, access_log=False,
                            proxy_headers=False, server_header=False, backlog=4096)
    server = uvicorn.Server(config)
    server.run(sockets=[socket.socket(fileno=args.fd)] if args.fd is not None else None)


if __name__ == "__main__":
    main()
