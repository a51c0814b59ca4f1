"""A client that stops reading a stream (bounded memory, issue D): past
HOPBASE_MAX_UNSENT_BYTES that the server holds for it, the stream is ended
with the interruption event and logged ``interrupted``, instead of being
buffered without end."""

from __future__ import annotations

import socket
import time

import pytest
from django.utils import timezone

from billing.models import RequestLog
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.processes import SERVERS, start_gateway
from tests.support.wire import call, open_raw

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


@pytest.mark.parametrize("server", SERVERS)
def test_a_client_that_stops_reading_has_its_stream_ended_not_buffered(world, server):
    from django.conf import settings

    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess(), "HOPBASE_MAX_UNSENT_BYTES": "65536"}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    gateway = start_gateway(env, server)
    started = timezone.now()
    try:
        # About 20 MB of events, as fast as the simulator can send them.
        request = call("messages", world.key, "sim-model", "go [sim tokens=150000 pace=0]", stream=True)
        sock = open_raw(gateway.port, request, receive_buffer=4096)
        deadline = time.monotonic() + 30
        log = None
        while log is None and time.monotonic() < deadline:
            log = RequestLog.objects.filter(api_key__tenant_id=world.tenant_id, created_at__gte=started,
                                            error_kind="slow_client").first()
            time.sleep(0.1)
        assert log is not None, "the stream was never ended"
        assert log.status == "interrupted"
        received = read_all(sock)
        # The last chunk (HTTP/1.1 chunked framing) is the interruption event.
        assert received.endswith(b'"message":"Response stream interrupted, please retry"}}\n\n\r\n0\r\n\r\n')
        assert b"event: message_stop" not in received
    finally:
        gateway.stop()


def read_all(sock: socket.socket) -> bytes:
    # What the server's kernel still holds (megabytes under uvicorn) is read
    # through a wide window: through the 4 KB one that made the client slow,
    # a loaded machine's zero-window probes can take minutes.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.settimeout(30)
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)
