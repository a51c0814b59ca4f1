"""What HopBase changes in Twisted's web server and reactor under Daphne."""

from __future__ import annotations

import io

from daphne.http_protocol import HTTPFactory as DaphneFactory
from twisted.web import http as twisted_http
from twisted.web.test.requesthelper import DummyChannel

import hopbase.asgi  # noqa: F401  (applies the changes, as Daphne's import of the application does)


def request_for_log() -> twisted_http.Request:
    request = twisted_http.Request(DummyChannel())
    request.method, request.uri, request.clientproto, request.code, request.sentLength = (
        b"POST", b"/v1/chat/completions", b"HTTP/1.1", 200, 12)
    return request


def test_twisted_writes_no_access_line_of_its_own_under_daphne():
    factory = DaphneFactory(server=None)
    factory._logFile = written = io.StringIO()
    factory._logDateTime = "01/Dec/2026:00:00:00 +0000"
    factory.log(request_for_log())
    assert written.getvalue() == ""


def test_plain_twisted_would_have_written_one():
    factory = twisted_http.HTTPFactory()
    factory._logFile = written = io.StringIO()
    factory._logDateTime = "01/Dec/2026:00:00:00 +0000"
    factory.log(request_for_log())
    assert '"POST /v1/chat/completions HTTP/1.1" 200 12' in written.getvalue()


def test_rate_limit_and_overload_statuses_have_their_names():
    assert twisted_http.RESPONSES[429] == b"Too Many Requests"
    assert twisted_http.RESPONSES[529] == b"Overloaded"


def test_content_type_parsing_is_remembered():
    parse = twisted_http._parseContentType
    assert parse(b"application/json; charset=utf-8") == parse(b"application/json; charset=utf-8")
    assert parse.cache_info().hits >= 1


def test_the_reactor_reads_a_socket_without_setting_a_log_context():
    from twisted.internet import asyncioreactor
    from twisted.python import context, log

    class Socket:
        def logPrefix(self) -> str:
            return "a socket's prefix"

    seen = []
    asyncioreactor.callWithLogger(Socket(), lambda *args: seen.append((args, context.get(log.ILogContext))), 1, True)
    assert seen == [((1, True), {"system": "-"})]  # Twisted's default, not the socket's prefix
