"""AWS's binary event stream (``application/vnd.amazon.eventstream``), encoded.

botocore only decodes this format (``botocore.eventstream``); Bedrock's
streaming answers are made of these messages, so the simulator writes them
itself. One message is::

    total length (4) | headers length (4) | prelude CRC32 (4)
    headers | payload | message CRC32 (4)

big-endian, each CRC32 over every byte before it. A header is its name's
length (1 byte), the name, a type (7: string) and the value's length
(2 bytes) and bytes. Bedrock sends three kinds of message:

- an event (``:message-type event``, ``:event-type chunk`` or a Converse
  event name, ``:content-type application/json``) with a JSON payload;
- an exception (``:message-type exception``, ``:exception-type
  throttlingException`` …) with ``{"message": …}``;
- and, when a ``[sim bad_crc_after=N]`` directive asks, a frame whose
  message CRC is wrong, which a client must refuse to read past.
"""

from __future__ import annotations

import binascii
import json
import struct
from collections.abc import Mapping

CONTENT_TYPE = "application/vnd.amazon.eventstream"
_STRING = 7


def _header(name: str, value: str) -> bytes:
    name_bytes, value_bytes = name.encode(), value.encode()
    return struct.pack("!B", len(name_bytes)) + name_bytes + struct.pack("!BH", _STRING, len(value_bytes)) + value_bytes


def message(headers: Mapping[str, str], payload: bytes, corrupt: bool = False) -> bytes:
    """One message; ``corrupt`` flips its message CRC so the frame cannot be trusted."""
    head = b"".join(_header(name, value) for name, value in headers.items())
    prelude = struct.pack("!II", 12 + len(head) + len(payload) + 4, len(head))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + head + payload
    crc = binascii.crc32(body) & 0xFFFFFFFF
    return body + struct.pack("!I", crc ^ 0xFFFFFFFF if corrupt else crc)


def _json(payload: object) -> bytes:
    # Not wire.dump: the wire package imports this module (no cycle), same bytes.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def event(event_type: str, payload: object, corrupt: bool = False) -> bytes:
    headers = {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"}
    return message(headers, _json(payload), corrupt)


def exception(exception_type: str, payload: object) -> bytes:
    headers = {":exception-type": exception_type, ":content-type": "application/json",
               ":message-type": "exception"}
    return message(headers, _json(payload))


def padding(index: int) -> str:
    """Bedrock pads every event with a ``p`` field of varying length (so sizes leak
    nothing); a client must ignore it. Deterministic here, like every rendered byte."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return alphabet[: 1 + (index * 7) % len(alphabet)]
