"""How far a stream's client has fallen behind (issue D, bounded memory).

Daphne writes each chunk a stream yields into Twisted's transport at once;
a client that reads slowly (or not at all) makes Twisted buffer the rest in
memory, without end, and ASGI gives the application no view of it. Daphne's
``send`` is ``functools.partial(Server.handle_reply, protocol)``, whose
protocol's channel's transport is Twisted's TCP connection: its unsent
bytes are what it holds in ``dataBuffer`` past ``offset`` plus
``_tempDataLen``. Those are Twisted internals, stable for many years; on
any other server (or transport) ``unsent_bytes`` says None and nothing is
bounded here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def unsent_bytes(send: Callable[..., Any]) -> int | None:
    args = getattr(send, "args", None)
    if not args:
        return None
    transport = getattr(getattr(args[0], "channel", None), "transport", None)
    try:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen
    except (AttributeError, TypeError):
        return None
