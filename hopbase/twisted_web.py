"""What HopBase changes in the Twisted web server and reactor under
Daphne, for every request it serves (-> request). Each change is a no-op
where Twisted or Daphne is not installed (the test client, management
commands)."""

from __future__ import annotations

import functools


def adjust() -> None:
    name_statuses()
    remember_content_types()
    skip_twisted_access_lines()
    call_sockets_without_log_context()


def name_statuses() -> None:
    """Daphne takes a response's reason phrase from Twisted (ASGI carries
    none), whose table lacks 429 and Anthropic's 529: they would go out as
    ``Unknown Status``."""
    try:
        from twisted.web import http as twisted_http
    except ImportError:
        return
    twisted_http.RESPONSES.setdefault(429, b"Too Many Requests")
    twisted_http.RESPONSES.setdefault(529, b"Overloaded")


def remember_content_types() -> None:
    """Twisted parses every POST's Content-Type with the email package (to
    decode form submissions, which Daphne never reads): about 0.1 ms a
    request, for the same few values over and over. The answer depends on
    the header's bytes alone, so recent ones are remembered."""
    try:
        from twisted.web import http as twisted_http
    except ImportError:
        return
    parse = twisted_http._parseContentType
    if not hasattr(parse, "cache_info"):
        twisted_http._parseContentType = functools.lru_cache(maxsize=64)(parse)


def skip_twisted_access_lines() -> None:
    """Twisted's HTTP factory formats a combined-log line for every request
    into Twisted's global log, beside Daphne's own access log (its
    ``--access-log``, written by Daphne, which this leaves alone). Daphne
    discards Twisted's log at its default verbosity and copies it into the
    ``daphne.server`` logger above that, so the line was either thrown away
    or a second access log: about 2 % of a request's CPU either way."""
    try:
        from daphne.http_protocol import HTTPFactory
    except ImportError:
        return
    HTTPFactory.log = _no_access_line


def _no_access_line(factory: object, request: object) -> None:
    """Twisted's ``HTTPFactory.log``, for Daphne's factory: nothing."""


def call_sockets_without_log_context() -> None:
    """Twisted's asyncio reactor calls a socket's ``doRead``/``doWrite``
    through ``callWithLogger``, which asks the socket for its log prefix and
    sets it as the ``system`` of Twisted's legacy log context for the call:
    about 0.7 % of a request's CPU, for a prefix that only tags Twisted's
    own log lines (which Daphne discards at its default verbosity). The
    reactor's ``_readOrWrite`` still logs a failure and drops the socket."""
    try:
        from twisted.internet import asyncioreactor
    except ImportError:
        return
    asyncioreactor.callWithLogger = _call_without_log_context


def _call_without_log_context(selectable: object, method, *args):
    """``callWithLogger`` for the reactor's ``_readOrWrite``: the call alone."""
    return method(*args)
