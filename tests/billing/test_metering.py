"""Metering: usage -> billable tokens (B2-B5, B9), and the row the recorder
writes from it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from billing.finished import Finished
from billing.metering import billable_tokens
from billing.recorder import to_row
from core.usage import Usage, estimate_tokens


def reported(input_tokens: int = 0, output_tokens: int = 0, **fields) -> Usage:
    return Usage(input_tokens, output_tokens, input_reported=True, output_reported=True, **fields)


@pytest.mark.parametrize(
    "chars,tokens", [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3), (4000, 1000), (4001, 1001)]
)
def test_it_estimates_about_four_characters_a_token_rounding_up(chars, tokens):
    assert estimate_tokens(chars) == tokens


def test_a_completed_request_is_billed_on_the_reported_usage():
    usage = reported(120, 30, cache_read_tokens=50, cache_write_tokens=7, thinking_tokens=10)
    assert billable_tokens("completed", usage, prompt_chars=10_000, sent_chars=10_000) == Usage(
        120, 30, 50, 7, 10, estimated=False
    )


def test_a_completed_request_without_reported_usage_is_estimated():
    assert billable_tokens("completed", Usage(), prompt_chars=41, sent_chars=8) == Usage(11, 2, estimated=True)


def test_a_completed_request_missing_only_output_usage_keeps_the_reported_input():
    usage = Usage(input_tokens=500, input_reported=True)
    assert billable_tokens("completed", usage, prompt_chars=4, sent_chars=9) == Usage(500, 3, estimated=True)


@pytest.mark.parametrize("status", ["cancelled", "stalled", "interrupted"])
def test_a_cut_short_stream_uses_the_input_it_reported(status):
    # Anthropic reports input in message_start: that beats the estimate.
    usage = Usage(input_tokens=900, input_reported=True, cache_read_tokens=100)
    billed = billable_tokens(status, usage, prompt_chars=40, sent_chars=0)
    assert (billed.input_tokens, billed.cache_read_tokens, billed.estimated) == (900, 100, True)


@pytest.mark.parametrize("status", ["cancelled", "stalled", "interrupted"])
def test_a_cut_short_stream_estimates_input_it_never_reported(status):
    assert billable_tokens(status, Usage(), prompt_chars=10, sent_chars=0).input_tokens == 3


@pytest.mark.parametrize("status", ["cancelled", "stalled", "interrupted"])
@pytest.mark.parametrize(
    "reported_output,sent_chars,billed",
    [
        (None, 0, 0),  # nothing reported, nothing sent
        (None, 1, 1),  # 1 char -> 1 token
        (None, 5, 2),  # 5 chars -> 2 tokens
        (10, 8, 10),  # the stream reported more than was sent
        (1, 400, 100),  # more was sent than the stream reported
        (0, 4, 1),  # a reported 0 does not beat the text already sent
    ],
)
def test_a_cut_short_stream_bills_the_larger_of_reported_and_sent_output(status, reported_output, sent_chars, billed):
    usage = Usage(output_tokens=reported_output or 0, output_reported=reported_output is not None)
    assert billable_tokens(status, usage, prompt_chars=0, sent_chars=sent_chars).output_tokens == billed


def test_a_cut_short_stream_is_estimated_even_when_usage_was_reported():
    billed = billable_tokens("cancelled", reported(10, 20), prompt_chars=0, sent_chars=0)
    assert (billed.input_tokens, billed.output_tokens, billed.estimated) == (10, 20, True)


@pytest.mark.parametrize("status", ["failed", "rejected"])
def test_failed_and_rejected_requests_bill_nothing(status):
    usage = reported(1000, 1000, cache_read_tokens=5, cache_write_tokens=5, thinking_tokens=5)
    assert billable_tokens(status, usage, prompt_chars=9999, sent_chars=9999) == Usage()


def test_the_recorder_writes_the_metered_tokens():
    item = Finished(
        request_id="req-m", created_at=timezone.now(), tenant_id=1, api_key_id=2, protocol="messages",
        status="cancelled", model="claude-x", usage=Usage(input_tokens=300, input_reported=True),
        prompt_chars=5000, sent_chars=21,
    )
    row = to_row(item)
    assert (row.input_tokens, row.output_tokens, row.usage_estimated) == (300, 6, True)
    assert (row.prompt_chars, row.sent_chars, row.charge_usd, row.settled_at) == (5000, 21, None, None)
