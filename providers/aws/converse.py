"""Amazon Bedrock's Converse grammar, as a channel speaks it (rule C3).

No client calls Converse: it is only ever a translation target, for the
models Bedrock serves other than Anthropic's. So this ``Api`` has the
channel's half of the interface: how a request is addressed (the model in
the URL, the body as ``converse_request.encode`` wrote it) and what each
event of the answer is to the relay. The events are the AWS event stream's
messages, one ``Event`` each, named by their ``:event-type``
(``providers.aws.eventstream.ConverseFrames``):

    messageStart, (contentBlockStart?, contentBlockDelta…, contentBlockStop)…,
    messageStop (the stop reason), metadata (usage)

The usage comes last, after ``messageStop``: ``metadata`` is the terminal
event. An exception frame mid-stream is a provider error (M3).
"""

from __future__ import annotations

from typing import Any

from core.sse import Event
from core.usage import plausible_usage
from core.vocabulary import WireGrammar
from providers.base import Api, Mark, RequestFacts, StreamWatcher
from providers.kind import Call, Operation

# Exception types that say "busy" rather than "broken" (C3, C5).
BUSY_EXCEPTIONS = frozenset(("throttlingException", "serviceUnavailableException"))


class ConverseWatcher(StreamWatcher):
    def mark(self, event: Event) -> int:
        name = event.name
        if name == "contentBlockDelta":
            data = event.json
            return self._take_delta(data.get("delta")) if type(data) is dict else Mark.PREAMBLE
        if name == "contentBlockStart":
            data = event.json
            start = data.get("start") if type(data) is dict else None
            # A tool call's start is content, as Anthropic's tool_use block is.
            return Mark.CONTENT if isinstance(start, dict) and "toolUse" in start else Mark.PREAMBLE
        if name == "metadata":
            data = event.json
            if type(data) is dict and isinstance(data.get("usage"), dict):
                self._take_usage(data["usage"])
            return Mark.TERMINAL
        if name == "exception":
            data = event.json
            self.busy_error = type(data) is dict and data.get("exceptionType") in BUSY_EXCEPTIONS
            return Mark.ERROR
        return Mark.PREAMBLE  # messageStart, contentBlockStop, messageStop

    def _take_delta(self, delta: Any) -> int:
        if not isinstance(delta, dict):
            return Mark.PREAMBLE
        text = delta.get("text")
        if isinstance(text, str):
            self.sent_chars += len(text)
            return Mark.CONTENT if text else Mark.PREAMBLE
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict):
            thought = reasoning.get("text")
            if isinstance(thought, str):
                self.sent_chars += len(thought)
            return Mark.CONTENT
        tool = delta.get("toolUse")
        if isinstance(tool, dict):
            fragment = tool.get("input")
            if isinstance(fragment, str):
                self.sent_chars += len(fragment)
            return Mark.CONTENT
        return Mark.PREAMBLE

    def _take_usage(self, usage: dict[str, Any]) -> None:
        # Like Anthropic's, Converse's inputTokens leaves out cache reads and writes.
        u = self.usage
        if not plausible_usage(usage):
            u.distrusted = True
            return
        u.input_tokens = usage.get("inputTokens") or 0
        u.output_tokens = usage.get("outputTokens") or 0
        u.cache_read_tokens = usage.get("cacheReadInputTokens") or 0
        u.cache_write_tokens = usage.get("cacheWriteInputTokens") or 0
        u.input_reported = "inputTokens" in usage
        u.output_reported = "outputTokens" in usage


class Converse(Api):
    """The channel side only: ``name`` (a client API) it has none of, and
    parsing, error bodies and model lists are a client API's business."""

    wire = WireGrammar.CONVERSE
    operation = Operation.CONVERSE
    watcher = ConverseWatcher
    model_in_body = False

    def upstream_call(self, facts: RequestFacts, client_headers: dict[str, str]) -> Call:
        return Call(self.operation, facts.model, facts.body, facts.raw_body)
