"""Structured logs: one JSON line per request from HopBase (no secret, the
key's prefix only), JSON for errors, plain text when asked; HopBase's own
refusals are not logged again as Django server errors."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import httpx
import pytest

from billing.finished import Finished
from billing.recorder import log_fields
from core.logs import JsonFormatter, TextFormatter
from core.usage import Usage
from core.vocabulary import ApiName, RequestStatus
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.processes import SERVERS, start_gateway
from tests.support.wire import call, wait_for_log


def finished() -> Finished:
    return Finished(
        request_id="req_1", created_at=datetime(2026, 12, 1, tzinfo=UTC), tenant_id=4, api_key_id=9,
        protocol=ApiName.MESSAGES, status=RequestStatus.COMPLETED, model="claude-x", stream=True, channel_id=2,
        attempts=2, usage=Usage(10, 5, input_reported=True, output_reported=True), ttft_ms=120, duration_ms=900,
        key_prefix="hb-abcdefgh", channel_name="anthropic-main",
    )


def record(message: str, fields: dict | None = None, exc_info=None) -> logging.LogRecord:
    made = logging.LogRecord("hopbase.requests", logging.INFO, __file__, 1, message, (), exc_info)
    if fields is not None:
        made.fields = fields
    return made


def test_a_request_line_is_one_json_object_with_the_requests_facts():
    line = json.loads(JsonFormatter().format(record("request req_1 completed", log_fields(finished()))))
    assert (line["level"], line["logger"], line["message"]) == ("INFO", "hopbase.requests", "request req_1 completed")
    assert {k: line[k] for k in ("request_id", "tenant_id", "key_prefix", "model", "channel", "status", "attempts",
                                 "ttft_ms", "duration_ms", "input_tokens", "output_tokens")} == {
        "request_id": "req_1", "tenant_id": 4, "key_prefix": "hb-abcdefgh", "model": "claude-x",
        "channel": "anthropic-main", "status": "completed", "attempts": 2, "ttft_ms": 120, "duration_ms": 900,
        "input_tokens": 10, "output_tokens": 5,
    }


def test_an_error_is_json_with_its_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        line = json.loads(JsonFormatter().format(record("failed", exc_info=sys.exc_info())))
    assert line["level"] == "INFO" and "ValueError: boom" in line["exception"]


def test_text_format_shows_the_fields_as_key_value():
    formatter = TextFormatter("%(levelname)s %(message)s")
    assert formatter.format(record("request req_1", {"status": "completed", "ttft_ms": 5})) == (
        "INFO request req_1 status=completed ttft_ms=5"
    )


@pytest.mark.gateway
@pytest.mark.usefixtures("committed_db")
@pytest.mark.parametrize("server", SERVERS)
def test_the_gateway_logs_json_lines_without_secrets_and_no_server_error_for_its_refusals(world, server):
    from django.conf import settings

    env = {**GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess(), "HOPBASE_LOG_FORMAT": "json"}
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    gateway = start_gateway(env, server)
    try:
        served = call("chat", world.key, "sim-model", "hi [sim tokens=2]", stream=False)
        ok = httpx.post(gateway.url + served.path, json=served.body, headers=served.headers)
        busy = call("messages", world.key, "all-busy", "hi", stream=False)
        refused = httpx.post(gateway.url + busy.path, json=busy.body, headers=busy.headers)
        assert (ok.status_code, refused.status_code) == (200, 529)
        assert refused.reason_phrase == "Overloaded"
        for response in (ok, refused):
            assert wait_for_log(response.headers["x-hopbase-request-id"]) is not None
    finally:
        gateway.stop()
    text = gateway.log_path.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    requests = {line["request_id"]: line for line in lines if line["logger"] == "hopbase.requests"}
    assert requests[ok.headers["x-hopbase-request-id"]]["status"] == "completed"
    assert requests[refused.headers["x-hopbase-request-id"]]["status"] == "failed"
    assert requests[ok.headers["x-hopbase-request-id"]]["key_prefix"] == world.key[:11]
    assert world.key not in text and "sk-upstream" not in text
    assert not [line for line in lines if line["logger"] == "django.request"]
