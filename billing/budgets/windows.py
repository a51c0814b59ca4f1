"""A budget's period and the window of it that holds a moment (rule G1, G3).

    1h   the clock hour            1d   the calendar day (UTC)
    1w   from Monday 00:00 UTC     1mo  the calendar month (UTC)
    total  one window, for ever    Ns   N seconds, windows aligned to the Unix epoch

Every window is half-open, ``start <= t < end``; ``total``'s starts at the
epoch and has no end. Pure functions of the moment given: tests inject the
clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAMED = ("1h", "1d", "1w", "1mo", "total")
SECONDS = re.compile(r"([1-9][0-9]{0,9})s?")
NAMES = {"1h": "hourly", "1d": "daily", "1w": "weekly", "1mo": "monthly", "total": "total"}


class BadPeriod(ValueError):
    pass


def parse_period(text: str) -> str:
    """The period's canonical spelling (``30`` and ``30s`` are ``30s``), or ``BadPeriod``."""
    text = text.strip().lower()
    if text in NAMED:
        return text
    match = SECONDS.fullmatch(text)
    if match is None:
        raise BadPeriod(f"{text!r} is not a period: one of {', '.join(NAMED)}, or a number of seconds such as 30s")
    return f"{int(match.group(1))}s"


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime | None  # None: the window never ends (``total``)

    def key(self) -> str:
        """A name for the window, the same in every process (its start, in seconds)."""
        return str(int(self.start.timestamp()))


def window_at(period: str, now: datetime) -> Window:
    """The window of ``period`` that holds ``now`` (an aware datetime)."""
    now = now.astimezone(UTC)
    if period == "total":
        return Window(EPOCH, None)
    if period == "1h":
        start = now.replace(minute=0, second=0, microsecond=0)
        return Window(start, start + timedelta(hours=1))
    if period == "1d":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return Window(start, start + timedelta(days=1))
    if period == "1w":
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        start = day - timedelta(days=day.weekday())
        return Window(start, start + timedelta(days=7))
    if period == "1mo":
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return Window(start, end)
    length = int(parse_period(period)[:-1])
    begun = int(now.timestamp()) // length * length
    start = EPOCH + timedelta(seconds=begun)
    return Window(start, start + timedelta(seconds=length))


def describe(period: str) -> str:
    """``daily``, ``weekly``…, or ``30-second``: how a message names the period."""
    return NAMES.get(period) or f"{period[:-1]}-second"
