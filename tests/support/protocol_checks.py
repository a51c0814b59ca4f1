"""What the protocol tests check, shared by tests/processes/test_protocols_*.py.

The gateway per protocol, seen through the official SDKs (P1–P7, S2–S4).

Each test calls a real Daphne gateway with the openai, anthropic or
google-genai SDK, checks what the SDK hands back (against a direct call to
the upstream simulator where that is the point), then checks the request
log the gateway committed and what the simulator recorded of the upstream
request (credentials swapped, nothing of the client's key leaking).

The simulator counts one whitespace-separated word of prompt text as one
input token, directive included, and answers ``tokens`` text tokens plus
``thinking`` thinking tokens, so every expected count here is computed from
the prompt, never read back from the gateway.
"""

from __future__ import annotations

import json
import time
import uuid

import anthropic
import openai
from google import genai
from google.genai import types

from billing.models import RequestLog
from tenants.models import ApiKey

UPSTREAM_SECRET = "sk-upstream-secret"
DIRECT_KEY = "sk-direct-to-simulator"
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = {"city": "Paris", "unit": "celsius"}
WEATHER_TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
    },
}
WEATHER_TOOL_ANTHROPIC = {
    "name": TOOL_NAME,
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
}
# Channel protocol of each request protocol, as RequestLog.protocol names it.
CHANNEL_PROTOCOL = {"chat": "openai", "responses": "openai", "messages": "anthropic", "gemini": "gemini"}


# --------------------------------------------------------------------------- helpers


def new_tag() -> str:
    return "p" + uuid.uuid4().hex[:12]


def prompt(tag: str, **directives: object) -> str:
    pairs = " ".join(f"{k}={v}" for k, v in {"tag": tag, **directives}.items())
    return f"Tell me something short and cheerful please [sim {pairs}]"


def words(*texts: str) -> int:
    """The simulator's tokenizer: one whitespace-separated word is one token."""
    return sum(len(text.split()) for text in texts)


def wait_for_log(request_id: str, timeout: float = 5.0):
    """The gateway writes a request's log row a moment after the response ends."""
    deadline = time.monotonic() + timeout
    while True:
        row = RequestLog.objects.filter(request_id=request_id).first()
        if row is not None:
            return row
        if time.monotonic() >= deadline:
            raise AssertionError(f"no RequestLog for {request_id} within {timeout} s")
        time.sleep(0.05)


def check_log(
    world,
    request_id: str | None,
    *,
    protocol: str,
    stream: bool,
    input_tokens: int,
    output_tokens: int,
    cache_read: int = 0,
    cache_write: int = 0,
    thinking: int = 0,
    model: str = "sim-model",
):
    assert request_id and request_id.startswith("req_"), request_id
    log = wait_for_log(request_id)
    assert log.status == "completed"
    assert log.protocol == protocol
    assert log.model == model
    assert log.stream is stream
    assert log.channel_id == world.channels[f"{CHANNEL_PROTOCOL[protocol]}-{model}-main"]
    assert log.attempts == 1
    key = ApiKey.objects.authenticate(world.key)
    assert (log.api_key_id, log.tenant_id) == (key.pk, key.tenant_id)
    assert (log.input_tokens, log.output_tokens) == (input_tokens, output_tokens)
    assert (log.cache_read_tokens, log.cache_write_tokens) == (cache_read, cache_write)
    assert log.thinking_tokens == thinking
    assert log.usage_estimated is False
    assert log.ttft_ms is not None
    assert log.ttft_ms <= log.duration_ms
    return log


def dump(model) -> dict:
    # Responses stream events hold parsed models pydantic warns about when dumping.
    return model.model_dump(mode="json", warnings=False)


def check_stream_headers(headers) -> None:
    headers = {name.lower(): value for name, value in headers.items()}
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["cache-control"] == "no-cache"
    assert "content-encoding" not in headers  # the SDKs ask for gzip; SSE must stay plain (0.1.4)
    assert headers["x-hopbase-request-id"].startswith("req_")


def upstream_record(sim_records, tag: str) -> dict:
    """The one request the gateway sent upstream for ``tag`` (direct calls use another key)."""
    records = [r for r in sim_records(tag) if r["api_key"] != DIRECT_KEY]
    assert len(records) == 1, records
    return records[0]


def check_credentials(record: dict, channel_protocol: str, client_key: str) -> None:
    """The channel secret in the provider's own auth header; the client's key nowhere."""
    headers = record["headers"]
    if channel_protocol == "openai":
        assert headers.get("authorization") == f"Bearer {UPSTREAM_SECRET}"
        assert "x-api-key" not in headers and "x-goog-api-key" not in headers
    elif channel_protocol == "anthropic":
        assert headers.get("x-api-key") == UPSTREAM_SECRET
        assert "authorization" not in headers and "x-goog-api-key" not in headers
    else:
        assert headers.get("x-goog-api-key") == UPSTREAM_SECRET
        assert "authorization" not in headers and "x-api-key" not in headers
    assert "key" not in record["query"]
    assert client_key not in json.dumps(headers)
    assert client_key not in json.dumps(record["query"])
    assert client_key not in record["path"]


def openai_client(gateway, key: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=20, **options)


def anthropic_client(gateway, key: str | None, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=20, **options)


def genai_client(base_url: str, key: str, api_version: str = "v1beta") -> genai.Client:
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=base_url, api_version=api_version))


class RequestIds:
    """An httpx response hook: the x-hopbase-request-id of each response, for
    the SDKs' stream helpers, which do not expose raw headers."""

    def __init__(self) -> None:
        self.ids: list[str | None] = []

    def __call__(self, response) -> None:
        self.ids.append(response.headers.get("x-hopbase-request-id"))

    @property
    def only(self) -> str | None:
        assert len(self.ids) == 1, self.ids
        return self.ids[0]


def hooked_openai(gateway, key: str) -> tuple[openai.OpenAI, RequestIds]:
    ids = RequestIds()
    http = openai.DefaultHttpxClient(event_hooks={"response": [ids]})
    return openai_client(gateway, key, http_client=http), ids
