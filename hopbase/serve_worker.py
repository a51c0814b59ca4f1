"""One ``manage.py serve`` worker: Daphne's own command line, on uvloop.

Daphne makes its event loop when ``daphne.server`` is imported, so the
plain ``daphne`` command always runs asyncio's loop (the operator contract
keeps that command working as it is). Here uvloop's policy is set first,
and the loop Daphne makes is uvloop's: the channels' connections (aiohttp,
on asyncio transports) are read and written in C rather than by asyncio's
Python transports, and the loop's own scheduling is cheaper. Twisted's
reactor drives its sockets through the loop's ``add_reader`` and
``add_writer``, which uvloop provides.
"""

from __future__ import annotations

import asyncio

import uvloop


def main() -> None:
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from daphne.cli import CommandLineInterface  # makes Daphne's loop: after the policy

    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    main()
