"""Usage -> billable tokens (B2–B5, B9).

Completed streams are billed on the usage the provider reported. Streams cut
short (cancelled, stalled, interrupted) are billed on what is known, and the
row is marked ``usage_estimated``:
- input: the input the stream reported (Anthropic reports it up front);
  otherwise the characters of the request's prompt text / 4, rounded up;
- output: the larger of the output the stream reported and the text already
  sent to the client (text, thinking, tool-call arguments) / 4, rounded up.
Failed and rejected requests bill nothing. Input never includes cached
tokens, which are billed at their own prices; thinking is part of output.

A provider's counts are data from outside (B11): usage with a count that is
not a whole number in [0, 10^9) is billed as if nothing had been reported,
on the estimate above, whatever the status.
"""

from __future__ import annotations

from core.usage import Usage, estimate_tokens, plausible_count
from core.vocabulary import RequestStatus


def billable_tokens(status: RequestStatus | str, usage: Usage, prompt_chars: int, sent_chars: int) -> Usage:
    status = RequestStatus(status)
    if not status.billed:
        return Usage()
    if usage.distrusted or not all(plausible_count(n) for n in (
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens,
            usage.thinking_tokens)):
        return Usage(estimate_tokens(prompt_chars), estimate_tokens(sent_chars), estimated=True)
    if not status.cut_short and usage.input_reported and usage.output_reported:
        return Usage(
            usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.thinking_tokens
        )
    input_tokens = usage.input_tokens if usage.input_reported else estimate_tokens(prompt_chars)
    output_tokens = max(usage.output_tokens if usage.output_reported else 0, estimate_tokens(sent_chars))
    return Usage(
        input_tokens, output_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.thinking_tokens,
        estimated=True,
    )
