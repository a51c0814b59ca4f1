"""Spend governance at admission (rules G1–G3, G5): a request's budgets and
its key's tokens per minute, held from admission until it ends.

    admit: the budgets covering the caller (its tenant's and its key's; the
      table read at most every HOPBASE_CONFIG_TTL) -> the request's worst
      case (G7, ``worst_case``): its estimated input (prompt characters / 4,
      plus images, files and tool schemas at a generous estimate) plus every
      answer it asks for (``n``, ``candidateCount``) at its output cap, or at
      the model's ceiling where it names none, at the model's price, the
      tenant's multiplier applied -> one reservation across all of them
      (``billing.budgets.store``: Redis, or this process), or a refusal
      before any channel is called (429 ``budget_exceeded``, naming the
      budget and when its window resets). Then the key's TPM
      (``gateway.governance.token_limits``), counted the same way in tokens.
    ended: whatever the ending, the reservation is replaced by the charge
      settlement will make of the request's record (cancelled and stalled
      ones included) and the TPM count corrected; a window that first
      crosses its alert threshold, or is exhausted, raises its alert
      (``billing.budgets.alerts``, off the request path).

A request whose budgets cannot be checked (Redis unreachable, D3) is
refused in its caller's format with a retry-after: an outage must not let
a budget be overspent. Keys without budgets never touch the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from redis.exceptions import RedisError

from billing.budgets.alerts import raise_alert
from billing.budgets.spend import spent_in
from billing.budgets.store import Line, LocalBudgetStore, RedisBudgetStore, Settled, from_units, to_units
from billing.budgets.windows import describe, window_at
from billing.finished import Finished
from billing.metering import billable_tokens
from billing.models import AlertType, Budget, ModelPrice
from billing.pricing import Unpriced, charge_for, with_surcharges
from core import lifecycle, loggers
from core.dependencies import redis as redis_dependency
from core.errors import ErrorKind, GatewayError
from core.snapshots import Snapshot, database_call
from core.surcharges import Surcharge
from core.vocabulary import RequestStatus
from gateway.auth import Caller
from gateway.governance.limits import FLUSH_TIMEOUT
from gateway.governance.token_limits import token_limits
from providers.base import Api, RequestFacts, nontext_tokens

log = logging.getLogger(loggers.SPEND)

# A request refused because its budgets cannot be checked tries again after this.
STORE_DOWN_RETRY_AFTER = 5
# A charge Redis could not take is offered again this often, this many times
# (after that the reservation lapses and the window's spend misses it).
SETTLE_RETRY_SECONDS = 1.0
SETTLE_RETRIES = 30
SETTLE_BATCH = 64  # charges settled in one round trip to the store
STORE_ERRORS = (OSError, RedisError)


@dataclass(frozen=True)
class BudgetInfo:
    """What admission needs of a budget (``billing.models.Budget``)."""

    id: int
    tenant_id: int
    api_key_id: int | None
    key_prefix: str
    period: str
    limit_usd: Decimal
    alert_at_pct: int | None

    def line(self, now: datetime) -> Line:
        threshold = None if self.alert_at_pct is None else to_units(self.limit_usd * self.alert_at_pct / 100)
        return Line(self.id, window_at(self.period, now), to_units(self.limit_usd), threshold)

    def refusal(self, line: Line) -> GatewayError:
        whose = f"API key {self.key_prefix}…'s" if self.api_key_id is not None else "tenant's"
        resets = ("it does not reset" if line.window.end is None
                  else f"it resets at {line.window.end.strftime('%Y-%m-%dT%H:%M:%SZ')}")
        message = (f"This request would exceed the {whose} {describe(self.period)} budget of "
                   f"{self.limit_usd.normalize():f} USD; {resets}.")
        return GatewayError(ErrorKind.BUDGET, message)


def load_budgets() -> dict[tuple[str, int], list[BudgetInfo]]:
    """Every budget, by ("tenant", id) and ("key", id) (one query)."""
    found: dict[tuple[str, int], list[BudgetInfo]] = {}
    for b in Budget.objects.select_related("api_key"):
        info = BudgetInfo(b.pk, b.tenant_id, b.api_key_id, b.api_key.prefix if b.api_key_id else "", b.period,
                          b.limit_usd, b.alert_at_pct)
        scope = ("tenant", b.tenant_id) if b.api_key_id is None else ("key", b.api_key_id)
        found.setdefault(scope, []).append(info)
    return found


@dataclass(frozen=True)
class Priced:
    """A request's tokens at a price, as ``billing.pricing.Metered``."""

    model: str
    status: str
    created_at: datetime
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass
class Hold:
    """What one admitted request holds until it ends."""

    request_id: str
    budgets: list[BudgetInfo]
    lines: list[Line]
    tpm_key: int | None = None  # the key whose TPM counted the request
    price: ModelPrice | None = None  # in force at admission, as settlement will find it


def worst_case(api: Api, facts: RequestFacts, price: ModelPrice | None) -> tuple[int, int]:
    """The most input and output tokens a request can be billed (G7): its
    text at 4 characters a token plus an estimate of what is not text, and
    every answer it asks for at its output cap, or at the model's ceiling
    where it names none (the operator's per model, else
    HOPBASE_DEFAULT_OUTPUT_CAP). A cap above the operator's ceiling is held
    to it: the provider refuses or clamps such a cap."""
    ceiling = price.max_output_tokens if price is not None else None
    cap = api.output_cap(facts)
    if cap is None:
        per_answer = ceiling or settings.HOPBASE_DEFAULT_OUTPUT_CAP
    else:  # only the operator's ceiling is known to be the model's; the default is a guess
        per_answer = min(cap, ceiling) if ceiling else cap
    return facts.prompt_tokens_estimate + nontext_tokens(facts.body), per_answer * api.choices(facts)


class Spend:
    def __init__(self, store: RedisBudgetStore | LocalBudgetStore | None = None) -> None:
        self._store = store  # chosen at first use unless given: settings may not be ready at import
        self.budgets: Snapshot[dict[tuple[str, int], list[BudgetInfo]]] = Snapshot(load_budgets)
        self.prices: Snapshot[dict[str, ModelPrice]] = Snapshot(lambda: ModelPrice.objects.in_force())
        self._held: dict[str, Hold] = {}
        self._renewer: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._settler: asyncio.Task | None = None
        self._settling: deque[tuple[Hold, int]] = deque()

    @property
    def store(self) -> RedisBudgetStore | LocalBudgetStore:
        if self._store is None:
            self._store = RedisBudgetStore(settings.REDIS_URL) if settings.REDIS_URL else LocalBudgetStore()
        return self._store

    async def admit(self, caller: Caller, api: Api, facts: RequestFacts, request_id: str) -> Hold | None:
        """Reserve the request's worst case against its budgets and count it
        against its key's TPM, or raise the refusal. None: nothing held."""
        table = await self.budgets.get()
        budgets = [*table.get(("tenant", caller.tenant_id), ()), *table.get(("key", caller.key_id), ())]
        if not budgets and caller.tpm is None:
            return None
        price = (await self.prices.get()).get(facts.model)
        input_tokens, output = worst_case(api, facts, price)
        hold = Hold(request_id, budgets, [], price=price)
        if budgets:
            # Input at the dearer of its two rates: a prompt may be written to the provider's cache.
            cached = price is not None and price.cache_write_usd_per_mtok > price.input_usd_per_mtok
            worst = Priced(facts.model, RequestStatus.COMPLETED, datetime.now(UTC), 0 if cached else input_tokens,
                           output, cache_write_tokens=input_tokens if cached else 0)
            await self._reserve(hold, to_units(charge_for(worst, price, caller.price_multiplier)) if price else 0)
        if caller.tpm is not None:
            try:
                await token_limits.admit(caller.key_id, caller.tpm, input_tokens + output, request_id)
            except GatewayError:
                self.ended(hold, None)
                raise
            hold.tpm_key = caller.key_id
        return hold

    async def surcharged(self, caller: Caller, model: str,
                         asked: list[Surcharge]) -> tuple[Caller, list[Surcharge]]:
        """The caller for a request that switches surcharges on (B10), its
        multiplier with their prices applied, and the optional ones to take
        out of the request; or the refusal naming the first other one the
        model's price does not allow."""
        price = (await self.prices.get()).get(model)
        multiplier, extras, dropped = with_surcharges(asked, price.extras if price else None,
                                                      caller.price_multiplier)
        return replace(caller, price_multiplier=multiplier, extras=extras), dropped

    async def _reserve(self, hold: Hold, amount: int) -> None:
        now = datetime.now(UTC)
        hold.lines = [budget.line(now) for budget in hold.budgets]
        seeds: dict[int, int] = {}
        while True:
            if not redis_dependency.attempt() and isinstance(self.store, RedisBudgetStore):
                raise self._unavailable()
            try:
                admission = await self.store.reserve(hold.lines, hold.request_id, amount, seeds)
            except STORE_ERRORS as error:
                redis_dependency.failed(error)
                self.store.drop_idle_connections()
                raise self._unavailable() from None
            redis_dependency.succeeded()
            if admission.needs_seed is None:
                break
            # The window's first request here: its spend so far, from the ledger.
            line, budget = hold.lines[admission.needs_seed], hold.budgets[admission.needs_seed]
            seeds[line.budget_id] = to_units(await database_call(spent_in, budget, line.window))
        if admission.refused is not None:
            budget, line = hold.budgets[admission.refused], hold.lines[admission.refused]
            if admission.first_refusal:
                raise_alert(budget.id, AlertType.EXHAUSTED, line.window, from_units(line.limit))
            raise budget.refusal(line)
        self._held[hold.request_id] = hold
        self._keep_renewing()

    @staticmethod
    def _unavailable() -> GatewayError:
        return GatewayError(ErrorKind.UNAVAILABLE, "HopBase cannot check this request's budgets right now. "
                            "Please retry shortly.", retry_after=STORE_DOWN_RETRY_AFTER)

    def ended(self, hold: Hold | None, record: Finished | None) -> None:
        """The request is over (``record``: how; None: refused before it
        ran): its charge replaces its reservation and its TPM count is
        corrected. Never blocks or raises: called from a request's last
        moments, maybe while it is cancelled."""
        if hold is None:
            return
        self._held.pop(hold.request_id, None)
        tokens, charge = self._cost(hold, record) if record is not None else (0, 0)
        if hold.tpm_key is not None:
            token_limits.correct(hold.tpm_key, hold.request_id, tokens)
        if hold.lines:
            self._settling.append((hold, charge))
            if self._settler is None or self._settler.done():
                # One settler at a time: two would settle the same charge twice, and drop another.
                self._settler = self._detach(self._settle_pending())

    @staticmethod
    def _cost(hold: Hold, record: Finished) -> tuple[int, int]:
        """The record's tokens and its charge in units, as settlement will charge it."""
        usage = billable_tokens(record.status, record.usage, record.prompt_chars, record.sent_chars)
        tokens = usage.input_tokens + usage.output_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        if not hold.lines:
            return tokens, 0
        metered = Priced(record.model, record.status, record.created_at, usage.input_tokens, usage.output_tokens,
                         usage.cache_read_tokens, usage.cache_write_tokens)
        try:
            charge = charge_for(metered, hold.price, record.price_multiplier or Decimal(1))
        except Unpriced:
            charge = Decimal(0)  # settlement refuses it as well; nothing is spent
        return tokens, to_units(charge)

    async def _settle_pending(self) -> None:
        for _ in range(SETTLE_RETRIES):
            while self._settling:
                # Those that ended meanwhile go together: one round trip to the store.
                batch = [self._settling[n] for n in range(min(len(self._settling), SETTLE_BATCH))]
                try:
                    settled = await self.store.settle_many(
                        [(hold.lines, hold.request_id, charge) for hold, charge in batch])
                except STORE_ERRORS as error:
                    redis_dependency.failed(error)
                    break
                for (hold, _), found in zip(batch, settled, strict=True):
                    self._settling.popleft()
                    self._alert(hold, found)
            if not self._settling:
                return
            await asyncio.sleep(SETTLE_RETRY_SECONDS)
        log.warning("budgets: %d charges could not reach Redis; their reservations lapse", len(self._settling))
        self._settling.clear()

    @staticmethod
    def _alert(hold: Hold, settled: list[Settled]) -> None:
        if not settled:
            return  # the store could not settle it (logged there)
        for budget, found in zip(hold.budgets, settled, strict=True):
            if budget.alert_at_pct is not None and found.threshold_crossed:
                raise_alert(budget.id, AlertType.THRESHOLD, found.line.window, from_units(found.spent))
            if found.exhausted:
                raise_alert(budget.id, AlertType.EXHAUSTED, found.line.window, from_units(found.spent))

    def _detach(self, coroutine) -> asyncio.Task | None:
        try:
            task = asyncio.get_running_loop().create_task(coroutine)
        except RuntimeError:
            coroutine.close()  # no loop (a test's own thread): nothing held here to give back
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _keep_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_while_held())

    async def _renew_while_held(self) -> None:
        """Push back the lapse of this process's reservations while it holds
        them: only a process that stops renewing (killed) lets them lapse."""
        every = settings.HOPBASE_RESERVATION_LEASE / 5
        while self._held:
            await asyncio.sleep(every)
            holds = list(self._held.values())
            lines = list({line.leases: line for hold in holds for line in hold.lines}.values())
            try:
                await self.store.renew(lines, [hold.request_id for hold in holds])
            except STORE_ERRORS:
                pass  # they lapse if Redis stays away; nothing is counted twice

    async def flush(self, timeout: float) -> None:
        """Before the process exits: the charges still waiting for Redis, for at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self._settling and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


class Unmetered:
    """No budgets and no TPM (a relay built for tests without a database)."""

    async def admit(self, caller: Caller, api: Api, facts: RequestFacts, request_id: str) -> Hold | None:
        return None

    async def surcharged(self, caller: Caller, model: str,
                         asked: list[Surcharge]) -> tuple[Caller, list[Surcharge]]:
        return caller, []

    def ended(self, hold: Hold | None, record: Finished | None) -> None:
        """Nothing held."""

    async def flush(self, timeout: float) -> None:
        """Nothing waits."""


spend = Spend()


async def charges_sent() -> None:
    """Charges Redis has not taken yet, sent at the end of a drain."""
    await spend.flush(FLUSH_TIMEOUT)


lifecycle.flush_when_drained(charges_sent)
