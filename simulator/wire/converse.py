"""Amazon Bedrock: the Converse grammar, and what every Bedrock answer shares.

``BedrockRenderer`` is Bedrock's side of any grammar: answers streamed as AWS
event-stream messages (``simulator.eventstream``), failures
mid-stream as exception messages (``throttlingException`` …) or a frame with
a broken CRC, and HTTP errors named in the ``x-amzn-ErrorType`` header with
a ``{"message": …}`` body, which is how botocore picks its error class.
``ConverseRenderer`` is Converse on top of it: ``/converse`` answers one
JSON body, ``/converse-stream`` the events ``messageStart``,
``contentBlockStart`` (a tool call), ``contentBlockDelta`` (text, reasoning
text and signature, tool input fragments), ``contentBlockStop``,
``messageStop`` and ``metadata`` (usage and latency), each padded with a
``p`` field as Bedrock does.
"""

from __future__ import annotations

import json
from typing import Any

from simulator import eventstream
from simulator.wire.common import (
    FRAME,
    OVERLOADED,
    PREAMBLE,
    TOKEN,
    TOOL_ARGUMENTS,
    TOOL_FRAGMENTS,
    TOOL_NAME,
    Event,
    Renderer,
    Script,
    simulated_message,
)

BAD_CRC = "bad_crc"  # a failure that is a corrupt frame rather than an exception message
# Exception messages of Bedrock's streams and the status the same failure has
# when the answer is not streamed.
STREAM_EXCEPTIONS = {
    "throttlingException": 429,
    "serviceUnavailableException": 503,
    "modelStreamErrorException": 424,
    "internalServerException": 500,
    "validationException": 400,
    "modelTimeoutException": 408,
}
_ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


def bedrock_error_headers(error_type: str) -> dict[str, str]:
    # AWS's own form: the type, then the namespace botocore strips after the colon.
    return {"x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"}


class BedrockRenderer(Renderer):
    """Bedrock's framing and errors; ``failure`` is the ``exception`` directive
    (an exception type above) or ``BAD_CRC``, for a failure at token N."""

    stream_content_type = eventstream.CONTENT_TYPE
    request_id_header = "x-amzn-RequestId"
    corrupt_event = "chunk"  # the event type a corrupt frame pretends to be

    def __init__(self, script: Script, failure: str | None = None) -> None:
        super().__init__(script)
        self.failure = failure

    def _exception_type(self, kind: str) -> str:
        if self.failure in STREAM_EXCEPTIONS:
            return self.failure
        return "throttlingException" if kind == OVERLOADED else "internalServerException"

    @property
    def latency_ms(self) -> int:
        # Renderers are pure, so the reported latency is made up, but plausible and stable.
        return 120 + 15 * self.script.output_tokens

    def error_status(self, kind: str) -> int:
        return STREAM_EXCEPTIONS[self._exception_type(kind)]

    def stream_error(self, kind: str, events_written: int) -> bytes:
        if self.failure == BAD_CRC:
            return eventstream.event(self.corrupt_event, {"p": eventstream.padding(events_written)}, corrupt=True)
        exception_type = self._exception_type(kind)
        payload: dict[str, Any] = {"message": f"simulated {exception_type}, requested by a [sim] directive"}
        if exception_type == "modelStreamErrorException":
            payload.update(originalStatusCode=500, originalMessage="simulated model failure")
        return eventstream.exception(exception_type, payload)

    def error_body(self, status: int, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
        return {"message": message or simulated_message(status)}

    def error_headers(self, status: int, reason: str | None = None) -> dict[str, str]:
        if reason:
            error_type = reason
        elif self.failure in STREAM_EXCEPTIONS and STREAM_EXCEPTIONS[self.failure] == status:
            error_type = self.failure[0].upper() + self.failure[1:]
        else:
            error_type = _ERROR_TYPES.get(status, "InternalServerException" if status >= 500 else "ValidationException")
        return bedrock_error_headers(error_type)


class ConverseRenderer(BedrockRenderer):
    protocol = "bedrock-converse"
    grammar = "converse"
    corrupt_event = "contentBlockDelta"

    @property
    def stop_reason(self) -> str:
        return "tool_use" if self.script.tool else "end_turn"

    @property
    def signature(self) -> str:
        return f"c2ltdWxhdGVk{self.script.stem}"

    def usage(self) -> dict[str, Any]:
        s = self.script
        # Like Anthropic's, Converse's inputTokens leaves out cache reads and writes.
        fresh = max(s.input_tokens - s.cached - s.cache_write, 0)
        return {"inputTokens": fresh, "outputTokens": s.output_tokens,
                "totalTokens": fresh + s.output_tokens + s.cached + s.cache_write,
                "cacheReadInputTokens": s.cached, "cacheWriteInputTokens": s.cache_write}

    def events(self) -> list[Event]:
        s = self.script
        out: list[Event] = []

        def add(event_type: str, payload: dict[str, Any], kind: str = FRAME) -> None:
            payload["p"] = eventstream.padding(len(out))
            out.append(Event(eventstream.event(event_type, payload), kind))

        def delta(index: int, value: dict[str, Any], kind: str = FRAME) -> None:
            add("contentBlockDelta", {"contentBlockIndex": index, "delta": value}, kind)

        add("messageStart", {"role": "assistant"}, PREAMBLE)
        index = 0
        if s.thinking:
            for t in s.thinking:
                delta(index, {"reasoningContent": {"text": t}}, TOKEN)
            delta(index, {"reasoningContent": {"signature": self.signature}})
            add("contentBlockStop", {"contentBlockIndex": index})
            index += 1
        if s.has_text_block:
            for t in s.text:
                delta(index, {"text": t}, TOKEN)
            add("contentBlockStop", {"contentBlockIndex": index})
            index += 1
        if s.tool:
            start = {"toolUse": {"toolUseId": f"tooluse_{s.stem}", "name": TOOL_NAME}}
            add("contentBlockStart", {"contentBlockIndex": index, "start": start})
            for fragment in TOOL_FRAGMENTS:
                delta(index, {"toolUse": {"input": fragment}})
            add("contentBlockStop", {"contentBlockIndex": index})
        add("messageStop", {"stopReason": self.stop_reason})
        add("metadata", {"usage": self.usage(), "metrics": {"latencyMs": self.latency_ms}})
        return out

    def body(self) -> dict[str, Any]:
        s = self.script
        content: list[dict[str, Any]] = []
        if s.thinking:
            content.append({"reasoningContent": {"reasoningText": {"text": s.full_thinking,
                                                                   "signature": self.signature}}})
        if s.has_text_block:
            content.append({"text": s.full_text})
        if s.tool:
            content.append({"toolUse": {"toolUseId": f"tooluse_{s.stem}", "name": TOOL_NAME,
                                        "input": json.loads(TOOL_ARGUMENTS)}})
        return {"output": {"message": {"role": "assistant", "content": content}}, "stopReason": self.stop_reason,
                "usage": self.usage(), "metrics": {"latencyMs": self.latency_ms}}


def _block_texts(blocks: object) -> list[str]:
    texts: list[str] = []
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolResult"), dict):
            texts += _block_texts(block["toolResult"].get("content"))
    return texts


def converse_texts(body: dict[str, Any]) -> list[str]:
    """The prompt text of a Converse request: system blocks, then each message's text and tool results."""
    texts = _block_texts(body.get("system"))
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            texts += _block_texts(message.get("content"))
    return texts
