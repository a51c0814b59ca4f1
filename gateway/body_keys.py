"""The keys of a request body's top-level object as they are written, to
refuse a body that repeats one (request -> *intake*; "one reading
of the body").

A stream's body goes to the provider as the client's bytes, while HopBase
bills and routes what orjson read from them; orjson keeps the last of
repeated keys and a provider may keep the first, so
``{"model": "cheap", …, "model": "dear"}`` could be billed as one model and
served as another. orjson cannot report repeats, so the top level is walked
here, on bytes orjson has already accepted as JSON (nothing is validated
twice): keys are read where they stand, and each value is stepped over at
C speed (a string by finding its closing quote, an object or array by
letting orjson parse it and say where it stopped). Keys are compared as
orjson decodes them, so an escaped spelling (``"mod\\u0065l"``) is the same
key. Cost: about one more orjson parse of the body's containers, a few
microseconds for a small body (bench/run.py shows no change).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_SPACE = re.compile(rb"[ \t\n\r]*")
# A number, true, false or null: runs to the next separator.
_SCALAR = re.compile(rb"[^,}\] \t\n\r]*")
# Every byte outside ASCII as an ASCII letter: UTF-8 sequences occur only
# inside strings, so positions and structure stay as they were, and orjson's
# error position (counted in characters) is then a byte offset too.
_TO_ASCII = bytes(range(128)) + b"a" * 128
_QUOTE, _BACKSLASH, _OPEN, _CLOSE = ord('"'), ord("\\"), ord("{"), ord("}")


def repeated_key(raw: bytes, body: Any) -> str | None:
    """A key written more than once at the top level of ``raw``, which
    orjson parsed into ``body``; None when there is none (or the body is not
    an object)."""
    if not isinstance(body, dict) or len(body) == 0:
        return None
    seen: set[str] = set()
    for key in top_level_keys(raw):
        if key in seen:
            return key
        seen.add(key)
    return None


def top_level_keys(raw: bytes) -> list[str]:
    """The keys of the top-level object in ``raw`` (valid JSON), in order,
    repeats included."""
    plain = raw if raw.isascii() else raw.translate(_TO_ASCII)
    view = memoryview(plain)
    space = _SPACE.match
    keys: list[str] = []
    at = space(raw, 0).end()
    if raw[at] != _OPEN:
        return keys
    at = space(raw, at + 1).end()
    if raw[at] == _CLOSE:
        return keys
    while True:
        end = _string_end(raw, at)
        key = raw[at + 1 : end - 1]
        keys.append(orjson.loads(raw[at:end]) if _BACKSLASH in key else key.decode())
        at = space(raw, space(raw, end).end() + 1).end()  # past the colon
        at = _value_end(raw, view, at)
        at = space(raw, at).end()
        if raw[at] == _CLOSE:
            return keys
        at = space(raw, at + 1).end()  # past the comma


def _string_end(raw: bytes, at: int) -> int:
    """Just past the string that starts at ``at``."""
    end = raw.index(b'"', at + 1)
    while raw[end - 1] == _BACKSLASH:
        first = end - 1
        while raw[first - 1] == _BACKSLASH:
            first -= 1
        if (end - first) % 2 == 0:
            break  # escaped backslashes: the quote ends the string
        end = raw.index(b'"', end + 1)
    return end + 1


def _value_end(raw: bytes, view: memoryview, at: int) -> int:
    first = raw[at]
    if first == _QUOTE:
        return _string_end(raw, at)
    if first not in b"{[":
        return _SCALAR.match(raw, at).end()
    try:
        orjson.loads(view[at:])
    except orjson.JSONDecodeError as error:
        # "unexpected content after document": where the value ended (and
        # any space after it).
        return at + error.pos
    raise ValueError("a top-level value runs to the end of the body")  # not valid JSON
