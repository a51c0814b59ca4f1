"""The clouds' versions of the vendors' grammars: what Azure, Bedrock and Vertex change.

- Azure OpenAI (``azure-chat``, ``azure-responses``): Chat streams open with
  a filter-only chunk (``"choices": []``, ``prompt_filter_results``, empty
  ``id`` and ``model``), every choice carries ``content_filter_results``,
  a chunk's keys come sorted as Azure's serializer writes them, and errors take
  Azure's shape (``{"error": {"code": "429", "message": …}}``; a refused
  prompt is a 400 with code ``content_filter`` and an ``innererror``).
- Anthropic on Bedrock (``bedrock-anthropic``): each Anthropic event, as
  JSON, base64-encoded in the ``bytes`` of an event-stream ``chunk``; the
  last (``message_stop``) carries ``amazon-bedrock-invocationMetrics``.
- Vertex (``vertex-gemini``, ``vertex-anthropic``): the vendors' own events;
  Vertex's quota refusals (429) come in Google's error shape whatever the
  publisher.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from simulator import eventstream
from simulator.wire.anthropic import AnthropicRenderer
from simulator.wire.common import PREAMBLE, Event, Script, dump, simulated_message
from simulator.wire.converse import BedrockRenderer
from simulator.wire.gemini import GeminiRenderer
from simulator.wire.openai import ChatRenderer, ResponsesRenderer, openai_error

# --------------------------------------------------------------------------- Azure OpenAI

_SAFE = {"filtered": False, "severity": "safe"}
CONTENT_FILTER_RESULTS = {"hate": _SAFE, "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}
FILTERED_RESULTS = {**CONTENT_FILTER_RESULTS, "violence": {"filtered": True, "severity": "medium"}}
_AZURE_CODES = {401: "401", 403: "403", 404: "DeploymentNotFound", 429: "429", 500: "InternalServerError",
                503: "ServiceUnavailable"}


def prompt_filter_results(filtered: bool = False) -> list[dict[str, Any]]:
    results = FILTERED_RESULTS if filtered else CONTENT_FILTER_RESULTS
    return [{"prompt_index": 0,
             "content_filter_results": {**results, "jailbreak": {"filtered": False, "detected": False}}}]


def azure_error(status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    # A 400 comes from the model behind Azure, in OpenAI's shape; the rest from Azure's own front door.
    if status == 400:
        return openai_error(status, reason, message)
    return {"error": {"code": reason or _AZURE_CODES.get(status, str(status)),
                      "message": message or simulated_message(status)}}


def content_filter_error() -> dict[str, Any]:
    """Azure's refusal of a prompt its content filter caught (``[sim content_filter=1]``)."""
    return {"error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management "
                   "policy (simulated by a [sim content_filter] directive).",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {"code": "ResponsibleAIPolicyViolation",
                       "content_filter_result": {**FILTERED_RESULTS, "jailbreak": {"filtered": False,
                                                                                   "detected": False}}},
    }}


class AzureChatRenderer(ChatRenderer):
    """Chat Completions as an Azure deployment answers; ``filter_finish`` ends it with
    finish_reason ``content_filter``, as when Azure's filter stops the output."""

    protocol = "azure-chat"
    grammar = "chat"
    request_id_header = "apim-request-id"

    def __init__(self, script: Script, filter_finish: bool = False) -> None:
        super().__init__(script)
        self.filter_finish = filter_finish

    @property
    def finish_reason(self) -> str:
        return "content_filter" if self.filter_finish else super().finish_reason

    def sse(self, payload: object, event: str | None = None) -> bytes:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        return f"data: {text}{self.nl}{self.nl}".encode()

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        for choice in choices:
            if choice.get("finish_reason") == "content_filter":
                choice["content_filter_results"] = FILTERED_RESULTS
            elif choice["delta"].get("content") or choice["delta"].get("reasoning_content"):
                choice["content_filter_results"] = CONTENT_FILTER_RESULTS
            else:
                choice["content_filter_results"] = {}  # the role chunk and the closing one
        chunk = super()._chunk(choices, usage)
        del chunk["service_tier"]
        return chunk

    def events(self) -> list[Event]:
        annotation = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
                      "prompt_filter_results": prompt_filter_results()}
        return [Event(self.sse(annotation), PREAMBLE), *super().events()]

    def body(self) -> dict[str, Any]:
        body = super().body()
        del body["service_tier"]
        results = FILTERED_RESULTS if self.filter_finish else CONTENT_FILTER_RESULTS
        for choice in body["choices"]:
            choice["content_filter_results"] = results
        body["prompt_filter_results"] = prompt_filter_results()
        return body

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return azure_error(status, reason, message)


class AzureResponsesRenderer(ResponsesRenderer):
    protocol = "azure-responses"
    grammar = "responses"
    request_id_header = "apim-request-id"

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return azure_error(status, reason, message)


# --------------------------------------------------------------------------- Anthropic on Bedrock


class BedrockAnthropicRenderer(BedrockRenderer, AnthropicRenderer):
    """Anthropic's events inside Bedrock's event stream, with Bedrock's errors."""

    protocol = "bedrock-anthropic"
    grammar = "anthropic"

    def _fresh_input(self) -> int:
        s = self.script
        return max(s.input_tokens - s.cached - s.cache_write, 0)

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None) -> dict[str, Any]:
        return {**super()._message(content, stop_reason), "id": f"msg_bdrk_{self.script.stem}"}

    def invocation_metrics(self) -> dict[str, int]:
        s = self.script
        return {"inputTokenCount": self._fresh_input(), "outputTokenCount": s.output_tokens,
                "invocationLatency": self.latency_ms, "firstByteLatency": 100,
                "cacheReadInputTokenCount": s.cached, "cacheWriteInputTokenCount": s.cache_write}

    def events(self) -> list[Event]:
        out: list[Event] = []
        # Bedrock forwards no pings: its stream has keep-alives of its own.
        for payload, kind in (item for item in self.payloads() if item[0]["type"] != "ping"):
            if payload["type"] == "message_stop":
                payload = {**payload, "amazon-bedrock-invocationMetrics": self.invocation_metrics()}
            part = {"bytes": base64.b64encode(dump(payload).encode()).decode(), "p": eventstream.padding(len(out))}
            out.append(Event(eventstream.event("chunk", part), kind))
        return out

    def headers(self, stream: bool) -> dict[str, str]:
        if stream:
            return {"x-amzn-bedrock-content-type": "application/json"}
        # InvokeModel reports its usage in headers too.
        return {"x-amzn-bedrock-input-token-count": str(self._fresh_input()),
                "x-amzn-bedrock-output-token-count": str(self.script.output_tokens),
                "x-amzn-bedrock-invocation-latency": str(self.latency_ms)}


# --------------------------------------------------------------------------- Vertex AI


class VertexGeminiRenderer(GeminiRenderer):
    protocol = "vertex-gemini"
    grammar = "gemini"
    request_id_header = ""  # Vertex names no request id
    service = "aiplatform.googleapis.com"

    def usage(self, final: bool) -> dict[str, Any]:
        return {**super().usage(final), "trafficType": "ON_DEMAND"}


class VertexAnthropicRenderer(AnthropicRenderer):
    protocol = "vertex-anthropic"
    grammar = "anthropic"
    request_id_header = ""

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None) -> dict[str, Any]:
        return {**super()._message(content, stop_reason), "id": f"msg_vrtx_{self.script.stem}"}

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        if status == 429:  # Vertex's quota, not Anthropic's rate limit, refuses first
            return VertexGeminiRenderer(self.script).error_body(status, reason, message)
        return super().error_body(status, reason, message)
