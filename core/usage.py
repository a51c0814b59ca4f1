"""Token usage: what a provider reported, and what is billed (B2–B5, B9).

One type for both: ``input_tokens`` excludes cached input (B9) and
``output_tokens`` includes thinking. ``estimated`` marks usage made up
(in part) from characters, for streams cut short.
"""

from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_TOKEN = 4
# B11: a provider's count at or above this is not believed (no single
# request is billed a billion tokens), nor is one that is not a whole number.
MAX_COUNT = 10**9


def estimate_tokens(chars: int) -> int:
    """Tokens in ``chars`` characters of text, rounded up."""
    return -(-chars // CHARS_PER_TOKEN)


def plausible_count(value: object) -> bool:
    return type(value) is int and 0 <= value < MAX_COUNT


def plausible_usage(usage: object) -> bool:
    """Whether every token count in a provider's usage object (nested
    details included) is missing or a plausible count (B11)."""
    pending = [usage]
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, (dict, list)):
                    pending.append(item)
                elif "oken" in key and item is not None and not plausible_count(item):
                    return False
    return True


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
    # The provider reported a count that cannot be true (B11): nothing it
    # reported is billed; the request is billed on the B2/B3 estimate.
    distrusted: bool = False

    def copy(self) -> Usage:
        """A copy of its own (copy.copy goes the long way, by pickling's hooks)."""
        return Usage(**vars(self))
