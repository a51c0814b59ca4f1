"""The demo's data (manage.py demo, run by bin/demo): a key that works with
the SDKs at once, and failover to watch without any setup."""

from __future__ import annotations

import io
import re
import time

import openai
import pytest
from django.core.management import call_command

from tests.wire import wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]


def test_the_demo_shows_failover_out_of_the_box(gateway, simulator):
    out = io.StringIO()
    call_command("demo", simulator_url=simulator.url, gateway_url=gateway.url, stdout=out)
    printed = out.getvalue()
    secret = re.search(r"\bhb-[\w-]+", printed).group(0)
    assert "failover-demo" in printed and "/admin/" in printed and "createsuperuser" in printed
    assert "HOPBASE_STALL_TIMEOUT=" in printed
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=secret, max_retries=0)
    deadline = time.monotonic() + 10  # the gateway reads new channels within its config TTL
    while True:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="failover-demo", messages=[{"role": "user", "content": "hello"}]
            )
            break
        except openai.NotFoundError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert raw.parse().choices[0].message.content
    log = wait_for_log(raw.headers["x-hopbase-request-id"])
    assert (log.status, log.attempts, log.channel.name) == ("completed", 2, "demo-openai-steady")
