"""How far a stream's client has fallen behind (issue D, bounded memory).

A client that reads slowly (or not at all) leaves what was written to it
in the server's buffer, and ASGI gives the application no view of it; this
reads it from the server's own objects, a stream's ``send``
(``unsent_counter``):

- Daphne writes each chunk into Twisted's transport at once, and Twisted
  buffers the rest without end. Daphne's ``send`` is
  ``functools.partial(Server.handle_reply, protocol)``, whose protocol's
  channel's transport is Twisted's TCP connection: its unsent bytes are
  what it holds in ``dataBuffer`` past ``offset`` plus ``_tempDataLen``
  (Twisted internals, stable for many years).
- uvicorn's ``send`` is its request cycle's bound method, and the cycle's
  asyncio transport says its own buffer's size. uvicorn waits, before
  writing, while that is over the transport's high-water mark, which
  serving.uvicorn_web sets to ``HOPBASE_MAX_UNSENT_BYTES``: one write takes
  it past, and the stream then ends.

On any other server ``unsent_counter`` says None and nothing is bounded here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def unsent_counter(send: Callable[..., Any]) -> Callable[[], int] | None:
    """What says how many bytes written to ``send``'s client are still
    unsent, looked up once per response (a stream asks after every write);
    None where the server does not say."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is not None:  # uvicorn
        return transport.get_write_buffer_size
    args = getattr(send, "args", None)
    transport = getattr(getattr(args[0], "channel", None), "transport", None) if args else None
    if transport is None or not hasattr(transport, "dataBuffer"):
        return None

    def twisted_unsent() -> int:
        return len(transport.dataBuffer) - transport.offset + transport._tempDataLen

    return twisted_unsent
