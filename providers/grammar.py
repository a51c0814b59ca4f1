"""What HopBase knows of one wire grammar, as one registry entry
(providers.registry): a channel of a new grammar is served, translated,
probed and asked for counts through its entry alone.

- ``Grammar``: a grammar a channel speaks. How its channels are addressed
  (the ``Api``, whose stream watcher reads its answers), the neutral form
  written in it, its answer read back, the smallest request the admin's
  test button sends, the event that ends a whole answer, and the field its
  counting endpoint answers with.
- ``ClientSide``: a client API that may be translated to another grammar:
  its body read into the neutral form, and the neutral events written back
  in its own stream format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.sse import Event
from providers.base import Api, RequestFacts
from providers.kind import Call
from providers.neutral import Conversation
from providers.translation import Reader, Writer


@dataclass(frozen=True)
class Probe:
    """The smallest streamed request of a grammar, and how its whole answer ends."""

    call: Callable[[str, str, int], Call]  # (model, prompt, most output tokens) -> the request
    is_end: Callable[[Event], bool]  # whether an event is a whole answer's last one


@dataclass(frozen=True)
class Grammar:
    name: str  # its word in core.vocabulary.WireGrammar
    api: Api  # how its channels are addressed (an ``openai`` channel with Chat Completions)
    encode: Callable[[Conversation, str], RequestFacts]  # the neutral form, for a model, in this grammar
    reader: type[Reader]  # its answer read back as neutral events
    probe: Probe
    count_field: str | None = None  # the token count in its counting endpoint's answer; None: it has none

    def count(self, answer: Any) -> int:
        """The count in a counting endpoint's answer; ValueError when it holds none."""
        count = answer.get(self.count_field) if isinstance(answer, dict) and self.count_field else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"no {self.count_field} in the answer")
        return count


@dataclass(frozen=True)
class ClientSide:
    api: Api
    decode: Callable[[RequestFacts], Conversation]  # the client's body as the neutral form
    writer: type[Writer]  # neutral events in the client's stream format
