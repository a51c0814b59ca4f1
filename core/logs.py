"""Log lines as JSON, one object a line, for operators' log search; or as
plain text for development (HOPBASE_LOG_FORMAT).

A line's own fields come in ``extra={"fields": {...}}`` (the request line
of billing.recorder, for one); an exception is one ``exception`` string.
Never put a secret or an API key in a field: key prefixes only.
"""

from __future__ import annotations

import datetime as dt
import logging
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
