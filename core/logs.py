"""Log lines as JSON, one object a line, for operators' log search; or as
plain text for development (HOPBASE_LOG_FORMAT).

A line's own fields come in ``extra={"fields": {...}}`` (the request line
of billing.recorder, for one); an exception is one ``exception`` string.
Never put a secret or an API key in a field: key prefixes only.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Sequence
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """The plain format, with a line's fields appended as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            text += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        return text


class HideLinkTokens(logging.Filter):
    """Django logs every 4xx answer and every CSRF refusal with the request's
    path; some paths carry a live one-time token (the console's invitation
    and password-reset links). What follows such a path's prefix is hidden
    before any handler writes the line."""

    def __init__(self, prefixes: Sequence[str] = ()) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)
        self.pattern = re.compile("(" + "|".join(re.escape(p) for p in self.prefixes) + r")[^\s'\"<>]+")

    def filter(self, record: logging.LogRecord) -> bool:
        if self.prefixes:
            message = record.getMessage()
            if any(prefix in message for prefix in self.prefixes):
                record.msg, record.args = self.pattern.sub(r"\1…", message), ()
        return True
