"""Token usage: what a provider reported, and what is billed (B2–B5, B9).

One type for both: ``input_tokens`` excludes cached input (B9) and
``output_tokens`` includes thinking. ``estimated`` marks usage made up
(in part) from characters, for streams cut short.
"""

from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_TOKEN = 4


def estimate_tokens(chars: int) -> int:
    """Tokens in ``chars`` characters of text, rounded up."""
    return -(-chars // CHARS_PER_TOKEN)


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    thinking_tokens: int = 0
    input_reported: bool = False
    output_reported: bool = False
    estimated: bool = False

    def copy(self) -> Usage:
        """A copy of its own (copy.copy goes the long way, by pickling's hooks)."""
        return Usage(**vars(self))
