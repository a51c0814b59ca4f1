"""``Finished``: what the gateway knows of a request when it ends (or, for
a stream in flight, so far), on its way to becoming a request log; and its
one-line JSON form, for the spool on disk."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson

from core.usage import Usage
from core.vocabulary import ApiName, RequestStatus


@dataclass
class Finished:
    request_id: str
    created_at: datetime
    tenant_id: int
    api_key_id: int
    protocol: ApiName
    status: RequestStatus
    model: str = ""  # the public name
    upstream_model: str = ""  # the name the serving channel was sent, if another
    provider_request_id: str = ""
    stream: bool = False
    channel_id: int | None = None
    error_kind: str = ""
    attempts: int = 0
    usage: Usage = field(default_factory=Usage)
    prompt_chars: int = 0
    sent_chars: int = 0
    ttft_ms: int | None = None
    duration_ms: int = 0
    upstream_status: int | None = None
    price_multiplier: Decimal | None = None
    extras: str = ""  # surcharges priced into price_multiplier (B10)
    # For the request's log line only (not stored on the row).
    key_prefix: str = ""
    channel_name: str = ""

    def to_json(self) -> bytes:
        # Written for every request (billing.spool): orjson reads the
        # dataclasses, enums and the datetime itself; only the Decimal is
        # handed over as its exact string.
        return orjson.dumps(self, default=_exact)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Finished:
        """The inverse of ``to_json`` (given its parsed object); raises
        ``ValueError``/``TypeError``/``KeyError`` on anything else."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {name: values[name] for name in names if name in values}
        fields["usage"] = Usage(**values["usage"])
        fields["created_at"] = datetime.fromisoformat(values["created_at"])
        fields["protocol"] = ApiName(values["protocol"])
        fields["status"] = RequestStatus(values["status"])
        if values.get("price_multiplier") is not None:
            fields["price_multiplier"] = Decimal(values["price_multiplier"])
        return cls(**fields)


def _exact(value: object) -> str:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):  # a subclass orjson does not take as one
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not written to the spool")
