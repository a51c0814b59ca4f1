"""A budget's period and its windows (rule G1, G3), on an injected clock:
the hour, the UTC day, the ISO week from Monday, the calendar month (leap
years and December included), ``total``, and periods in seconds aligned to
the Unix epoch. Mirrors billing/budgets/windows.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from billing.budgets.windows import EPOCH, BadPeriod, describe, parse_period, window_at


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("period", "now", "start", "end"), [
    ("1h", "2026-12-05 21:59:59.999", "2026-12-05 21:00", "2026-12-05 22:00"),
    ("1h", "2026-12-05 22:00", "2026-12-05 22:00", "2026-12-05 23:00"),
    ("1d", "2026-12-31 23:59:59", "2026-12-31 00:00", "2027-01-01 00:00"),
    ("1w", "2026-12-05 12:00", "2026-11-30 00:00", "2026-12-07 00:00"),  # a Saturday: its week began on Monday
    ("1w", "2026-12-07 00:00", "2026-12-07 00:00", "2026-12-14 00:00"),  # Monday 00:00 opens the next
    ("1w", "2026-12-06 23:59:59", "2026-11-30 00:00", "2026-12-07 00:00"),  # Sunday is the week's last day
    ("1mo", "2026-12-15 08:00", "2026-12-01 00:00", "2027-01-01 00:00"),
    ("1mo", "2028-02-29 23:59", "2028-02-01 00:00", "2028-03-01 00:00"),
    ("30s", "2026-12-05 21:00:29", "2026-12-05 21:00:00", "2026-12-05 21:00:30"),
    ("30s", "2026-12-05 21:00:30", "2026-12-05 21:00:30", "2026-12-05 21:01:00"),
    ("7s", "1970-01-01 00:00:13", "1970-01-01 00:00:07", "1970-01-01 00:00:14"),
])
def test_each_period_has_its_window(period, now, start, end):
    window = window_at(period, at(now))
    assert (window.start, window.end) == (at(start), at(end))
    assert window.start <= at(now) < window.end


def test_total_is_one_window_for_ever():
    for now in ("1999-01-01 00:00", "2026-12-05 21:00"):
        window = window_at("total", at(now))
        assert (window.start, window.end) == (EPOCH, None)
        assert window.key() == "0"


def test_windows_are_utc_whatever_the_clocks_zone():
    tokyo = timezone(timedelta(hours=9))
    window = window_at("1d", datetime(2026, 12, 6, 8, 0, tzinfo=tokyo))  # 23:00 UTC on the 5th
    assert window.start == at("2026-12-05 00:00")


def test_a_window_rolls_over_to_a_new_key():
    before, after = window_at("1d", at("2026-12-05 23:59:59")), window_at("1d", at("2026-12-06 00:00"))
    assert before.key() != after.key() and before.end == after.start


@pytest.mark.parametrize(("text", "period"), [("1h", "1h"), (" 1MO ", "1mo"), ("30", "30s"),
                                               ("total", "total")])
def test_periods_are_read_in_their_canonical_spelling(text, period):
    assert parse_period(text) == period


@pytest.mark.parametrize("text", ["", "0", "0s", "-5s", "2d", "1y", "monthly", "1.5h", "30ss"])
def test_anything_else_is_not_a_period(text):
    with pytest.raises(BadPeriod):
        parse_period(text)


def test_messages_name_periods_as_people_do():
    assert [describe(p) for p in ("1h", "1d", "1w", "1mo", "total", "30s")] == [
        "hourly", "daily", "weekly", "monthly", "total", "30-second"]
