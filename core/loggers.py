"""The names HopBase logs under, declared once. Operators search and alert on
them (an operator contract), so a module that moves keeps its logger's name:
a module names its logger from here, never from ``__name__``."""

from __future__ import annotations

REQUESTS = "hopbase.requests"  # one line a request, written with its log row (billing.recorder)
RELAY = "hopbase.relay"
UPSTREAM = "hopbase.upstream"
CHANNELS = "hopbase.channels"
AFFINITY = "hopbase.affinity"
PROVIDER_STATE = "hopbase.provider_state"
TRANSLATION = "hopbase.translation"
COUNTING = "hopbase.counting"
ADMISSION = "hopbase.admission"
LIMITS = "hopbase.limits"
TOKEN_LIMITS = "hopbase.token_limits"
SPEND = "hopbase.spend"
BUDGETS = "hopbase.budgets"
BUDGET_STATUS = "billing.budget_status"
ALERTS = "hopbase.alerts"
SETTLEMENT = "hopbase.settlement"
SPOOL = "hopbase.spool"
SNAPSHOTS = "hopbase.billing"  # the stores' snapshots (core.snapshots), named before they were shared
DEPENDENCIES = "hopbase.dependencies"
PERIODIC = "hopbase.periodic"
LIFECYCLE = "hopbase.lifecycle"
REVOCATIONS = "hopbase.revocations"
ASGI = "hopbase.asgi"
UVICORN_WEB = "hopbase.uvicorn_web"
TWISTED_WEB = "hopbase.twisted_web"
SERVE = "hopbase.serve"
STAFF_LOGIN = "hopbase.staff_login"
CONSOLE_SIGNIN = "console.signin"
CONSOLE_MAIL = "console.mail"
