"""What a console page is asked for in its query string: dates, a page's
cursor. A malformed value becomes a ``FilterError`` whose message names the
field, shown on the page in place of the rows (never a 500, never a silently
dropped filter)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TypeVar

from django.db.models import Model, Q, QuerySet

from core.moments import utc_moment

M = TypeVar("M", bound=Model)


class FilterError(ValueError):
    pass


def moment(query: Mapping[str, str], field: str) -> dt.datetime | None:
    """An ISO 8601 date (midnight UTC) or datetime (UTC without an offset),
    as ``exportbilling`` reads ``--since`` and ``--until``; empty: none."""
    raw = (query.get(field) or "").strip()
    if not raw:
        return None
    try:
        return utc_moment(raw)
    except ValueError:
        raise FilterError(f"{field}: {raw!r} is not a date (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None


def period(query: Mapping[str, str]) -> tuple[dt.datetime | None, dt.datetime | None]:
    """``since`` (inclusive) and ``until`` (exclusive)."""
    since, until = moment(query, "since"), moment(query, "until")
    if since is not None and until is not None and since >= until:
        raise FilterError("since must be earlier than until")
    return since, until


def cursor(query: Mapping[str, str]) -> tuple[dt.datetime, int] | None:
    """The keyset position ``created_at,id`` of the last row of the previous page."""
    raw = (query.get("before") or "").strip()
    if not raw:
        return None
    stamp, _, pk = raw.rpartition(",")
    try:
        return utc_moment(stamp), int(pk)
    except ValueError:
        raise FilterError("before: not a position of this list (start again from the first page)") from None


def cursor_text(created_at: dt.datetime, pk: int) -> str:
    return f"{created_at.astimezone(dt.timezone.utc).isoformat()},{pk}"


def after(rows: QuerySet[M], position: tuple[dt.datetime, int] | None) -> QuerySet[M]:
    """The rows past a keyset position, newest first. The plain
    ``created_at <=`` bound is redundant for the answer but lets the
    database start its index scan there: with the OR alone it filters every
    newer row, so a deep page cost what all the pages before it did."""
    if position is None:
        return rows
    created_at, pk = position
    older = Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=pk)
    return rows.filter(created_at__lte=created_at).filter(older)
