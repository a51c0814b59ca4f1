"""A Converse channel's events as pieces (rule C3, T1–T2).

``ConverseReader`` says what content each event of a ``ConverseStream``
answer carries; ``ConverseWatcher`` (``providers.aws.converse``)
marks the same events and reads their usage and errors. No client speaks
Converse, so there is no writer.
"""

from __future__ import annotations

from typing import Any

from core.sse import Event
from core.vocabulary import WireGrammar
from providers.neutral import (
    Piece,
    RedactedThinking,
    Stop,
    StopReason,
    TextDelta,
    ThinkingDelta,
    ThinkingSignature,
    ToolArguments,
    ToolCallStart,
)
from providers.translation import Reader

CONVERSE = WireGrammar.CONVERSE
STOP_REASONS = {
    "end_turn": StopReason.END,
    "tool_use": StopReason.TOOL_USE,
    "max_tokens": StopReason.LENGTH,
    "model_context_window_exceeded": StopReason.LENGTH,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "guardrail_intervened": StopReason.CONTENT_FILTER,
    "content_filtered": StopReason.CONTENT_FILTER,
}
NOTHING: list[Piece] = []


class ConverseReader(Reader):
    def __init__(self) -> None:
        self._tools: dict[int, int] = {}  # content block index -> tool call index (0, 1, … in order)

    def read(self, event: Event) -> list[Piece]:
        name = event.name
        if name not in ("contentBlockDelta", "contentBlockStart", "messageStop"):
            return NOTHING
        data = event.json
        if type(data) is not dict:
            return NOTHING
        if name == "contentBlockDelta":
            delta = data.get("delta")
            return self._delta(data.get("contentBlockIndex", 0), delta) if isinstance(delta, dict) else NOTHING
        if name == "contentBlockStart":
            start = data.get("start")
            tool = start.get("toolUse") if isinstance(start, dict) else None
            if not isinstance(tool, dict):
                return NOTHING
            index = len(self._tools)
            self._tools[data.get("contentBlockIndex", index)] = index
            return [ToolCallStart(index, tool.get("toolUseId") or "", tool.get("name") or "")]
        reason = data.get("stopReason")
        return [Stop(STOP_REASONS.get(reason, StopReason.END))] if isinstance(reason, str) else NOTHING

    def _delta(self, block: Any, delta: dict[str, Any]) -> list[Piece]:
        text = delta.get("text")
        if isinstance(text, str):
            return [TextDelta(text)] if text else NOTHING
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict):
            if reasoning.get("text"):
                return [ThinkingDelta(reasoning["text"])]
            if reasoning.get("signature"):
                return [ThinkingSignature(reasoning["signature"], CONVERSE)]
            if reasoning.get("redactedContent"):
                return [RedactedThinking(reasoning["redactedContent"], CONVERSE)]
            return NOTHING
        tool = delta.get("toolUse")
        index = self._tools.get(block)
        if isinstance(tool, dict) and index is not None and tool.get("input"):
            return [ToolArguments(index, tool["input"])]
        return NOTHING
