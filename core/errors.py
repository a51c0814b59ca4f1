"""The errors HopBase itself returns (spec table E), independent of protocol.

    GatewayError            an error answered to the client, in its protocol
     └ kind: ErrorKind      which row of table E; each protocol maps it to
                            its own status, type and code
    UpstreamFailure         why one attempt on one channel failed; decides
                            whether another channel may succeed

Messages are HopBase's own and never carry a provider's text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

PROVIDER_ERROR_MESSAGE = "The model provider returned an error. Please retry."


class ErrorKind(enum.Enum):
    INVALID_KEY = "invalid_key"
    MODEL_NOT_FOUND = "model_not_found"
    MALFORMED = "malformed"
    # A provider's content filter refused the prompt (Azure's 400
    # ``content_filter``): the request's fault, told as the provider says it.
    CONTENT_FILTER = "content_filter"
    TOO_LARGE = "too_large"
    BALANCE = "balance"
    # A budget (G3) has no room for the request in its window.
    BUDGET = "budget"
    RATE_LIMIT = "rate_limit"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNKNOWN_PATH = "unknown_path"
    # The request names provider state (a Responses id, a Gemini cache) that
    # another tenant owns, or that the provider does not know: 404, never
    # forwarded, never the channel's fault.
    STATE_NOT_FOUND = "state_not_found"
    ALL_BUSY = "all_busy"
    ALL_FAILED = "all_failed"
    # Not serving now: draining for a restart, or what a database outage or a
    # full spool leaves unservable (D1–D3). Always with retry-after.
    UNAVAILABLE = "unavailable"
    # In-stream errors after the first token (M2, M3, M5).
    STREAM_BUSY = "stream_busy"
    STREAM_FAILED = "stream_failed"


MESSAGES = {
    ErrorKind.INVALID_KEY: "Invalid API key.",
    ErrorKind.MODEL_NOT_FOUND: "The model does not exist or this key may not use it.",
    ErrorKind.BALANCE: "Your credit balance is too low to make this request. Please top up.",
    ErrorKind.BUDGET: "A budget covering this API key is used up for now.",
    ErrorKind.RATE_LIMIT: "Rate limit reached for this API key. Please retry shortly.",
    ErrorKind.METHOD_NOT_ALLOWED: "Method not allowed.",
    ErrorKind.UNKNOWN_PATH: "Unknown request URL.",
    ErrorKind.STATE_NOT_FOUND: "The provider state this request names was not found.",
    ErrorKind.ALL_BUSY: "All model providers are overloaded right now. Please retry shortly.",
    ErrorKind.ALL_FAILED: "The model providers could not complete the request. Please retry.",
    ErrorKind.UNAVAILABLE: "The service is temporarily unavailable. Please retry shortly.",
    ErrorKind.STREAM_BUSY: PROVIDER_ERROR_MESSAGE,
    ErrorKind.STREAM_FAILED: PROVIDER_ERROR_MESSAGE,
}

STALLED_MESSAGE = "Upstream stopped responding mid-stream"
INTERRUPTED_MESSAGE = "Response stream interrupted, please retry"
UPSTREAM_REJECTED_MESSAGE = "The model provider rejected the request as invalid."
CONTENT_FILTERED_MESSAGE = "The model provider's content filter refused the request."
RETRY_AFTER_CAP = 60
# Errors a retry cannot mend: clients are told so (``x-should-retry: false``).
FINAL = {ErrorKind.INVALID_KEY, ErrorKind.BALANCE, ErrorKind.BUDGET, ErrorKind.MALFORMED, ErrorKind.TOO_LARGE,
         ErrorKind.CONTENT_FILTER}


class GatewayError(Exception):
    def __init__(
        self, kind: ErrorKind, message: str | None = None, retry_after: int | None = None, param: str | None = None
    ) -> None:
        self.kind = kind
        self.message = message or MESSAGES.get(kind, "Invalid request.")
        self.retry_after = None if retry_after is None else max(0, min(retry_after, RETRY_AFTER_CAP))
        self.param = param  # the request field at fault, where the protocol says so (OpenAI's ``param``)
        super().__init__(self.message)


class DatabaseUnavailable(GatewayError):
    """The database did not answer in time and nothing known answers for
    this request (D3): a key never seen, or a cached state past
    HOPBASE_STALE_MAX_AGE. Told apart from "no such key" by its type."""

    RETRY_AFTER = 5

    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            ErrorKind.UNAVAILABLE,
            message or "HopBase cannot check this request right now. Please retry shortly.",
            retry_after=self.RETRY_AFTER,
        )


# The failure kind of a model its channel serves on OpenAI's Responses API
# alone (it refused Chat Completions): the relay asks again there.
RESPONSES_ONLY = "responses_only"


@dataclass(frozen=True)
class UpstreamFailure:
    """One attempt's failure. ``busy`` failures are overload or rate limits."""

    kind: str  # http_<status>, error_event, connect, timeout, cut, slow_start
    status: int | None = None
    busy: bool = False
    # False when the request itself is at fault (a 400): no channel would
    # answer differently, so the client gets the error instead of a retry.
    channel_fault: bool = True
    retry_after: int | None = None
    # The provider said it does not know the state the request names (a
    # Gemini cache it refuses with 403): the request's fault.
    about_state: bool = False
    # Why, in the provider's words, for operators only (channel health).
    detail: str = field(default="", compare=False)


def failure_from_status(status: int, api_key_invalid: bool = False, retry_after: int | None = None) -> UpstreamFailure:
    """Classify an upstream HTTP error status (rule F2)."""
    busy = status in (429, 503, 529)
    if status >= 500 or status in (401, 403, 404, 408, 409, 429) or api_key_invalid:
        return UpstreamFailure(f"http_{status}", status, busy=busy, retry_after=retry_after)
    return UpstreamFailure(f"http_{status}", status, channel_fault=False)
