"""What the upstream simulator remembers of each request it answered.

A test reads these back over HTTP (``GET /_sim/records?tag=…``) to check what
the gateway sent upstream, and what the upstream sent back, byte for byte,
against what the gateway relayed.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from simulator.requests import api_key_of


@dataclass
class Record:
    id: int
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    peer: str
    started_at: float
    tag: str | None = None
    protocol: str | None = None
    model: str | None = None
    stream: bool = False
    body: Any = None
    directives: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    sent: bytearray = field(default_factory=bytearray)
    tokens_sent: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    completed: bool = False
    client_closed_at: float | None = None
    tokens_at_close: int | None = None
    released_at: float | None = None  # when a gate_at stream was let go on

    def note_hang_up(self) -> None:
        # A caller leaving after the terminal event has not cut anything short.
        if not self.completed:
            self.client_closed_at = time.time()
            self.tokens_at_close = self.tokens_sent

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tag": self.tag,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "protocol": self.protocol,
            "model": self.model,
            "stream": self.stream,
            "headers": self.headers,
            "api_key": api_key_of(self.headers, self.query),
            "peer": self.peer,
            "body": self.body,
            "directives": self.directives,
            "status": self.status,
            "sent_b64": base64.b64encode(bytes(self.sent)).decode(),
            "tokens_sent": self.tokens_sent,
            "started_at": self.started_at,
            "first_token_at": self.first_token_at,
            "finished_at": self.finished_at,
            "completed": self.completed,
            "client_closed_at": self.client_closed_at,
            "tokens_at_close": self.tokens_at_close,
            "released_at": self.released_at,
        }
