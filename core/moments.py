"""Moments a caller writes (the usage API's and the console's filters,
``exportbilling``'s options): ISO 8601, read as UTC."""

from __future__ import annotations

import datetime as dt


def utc_moment(raw: str) -> dt.datetime:
    """An ISO 8601 date (midnight UTC) or datetime (UTC when it names no
    offset), in UTC. ``ValueError`` for anything else, and for a moment an
    offset moves out of datetime's range (``9999-12-31T23:59-23:59``) or
    that a database cannot take (a NUL)."""
    if "\x00" in raw:
        raise ValueError("a NUL character")
    value = dt.datetime.fromisoformat(raw.strip())
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:
        raise ValueError("out of range") from None
