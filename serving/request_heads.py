"""Request heads bounded under either server (-> request), without nginx in
front: a head (request line and headers) over MAX_HEAD_BYTES is answered
431 and its connection closed; one not complete within HOPBASE_HEAD_TIMEOUT
of its first byte (or of the connection, for one that sends nothing) is
answered 408 and closed. Unbounded, one connection could make a worker hold
any amount of headers, and a few hundred half-sent heads its sockets.
serving.uvicorn_web and serving.twisted_web apply them; the answers are
plain text: no key has been read, so there is no caller's format yet."""

from __future__ import annotations

MAX_HEAD_BYTES = 64 * 1024


def _plain(status: bytes, text: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
            + b"%d" % len(text) + b"\r\nConnection: close\r\n\r\n" + text)


HEAD_TOO_LARGE = _plain(b"431 Request Header Fields Too Large", b"Request header fields too large.\n")
HEAD_TIMED_OUT = _plain(b"408 Request Timeout", b"The request's head was not received in time.\n")
