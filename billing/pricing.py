"""Tokens x prices, in exact decimals (metering -> *pricing* -> settlement).

A request is charged at the price that was in force when it was *made*
(``RequestLog.created_at``), not when it is settled, so a price change never
reaches back to earlier requests however late they settle.

The one rounding rule: every token class is priced exactly (USD per million
tokens x tokens / 1,000,000), the four amounts are summed, the sum is
multiplied by the tenant's ``price_multiplier`` as it was when the request
was made, times the multiplier of every surcharge it switched on (B10,
``with_surcharges``; together ``RequestLog.price_multiplier``), and only that final amount
is rounded, once, to 10 decimal places (``RequestLog.charge_usd`` and the
ledger hold 10), half up. The arithmetic runs in a decimal context wide
enough that nothing is rounded before that step.

The hot path (the intake) must not ask the database for every request; it
asks ``prices`` (a ``PriceBook``) whether a model is priced, from a list
refreshed at most every HOPBASE_CONFIG_TTL seconds.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Iterable
from decimal import ROUND_UP, Decimal, localcontext
from typing import Protocol

from django.utils import timezone

from billing.models import ModelPrice
from core.errors import ErrorKind, GatewayError
from core.money import CHARGE_QUANTUM, round_charge
from core.snapshots import Snapshot
from core.surcharges import Surcharge
from core.vocabulary import RequestStatus

MILLION = Decimal(1_000_000)
# Tokens (up to 20 digits) x prices (14 digits) x multiplier (8 digits) fits
# well inside 60 significant digits: no intermediate rounding.
PRECISION = 60


class Unpriced(Exception):
    """A billable request for a model that had no price when it was made."""


class Metered(Protocol):
    """What pricing reads of a request log (a ``RequestLog``, or the tuple
    settlement reads one as)."""

    model: str
    status: str
    created_at: dt.datetime
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int


def charge_for(log: Metered, price: ModelPrice | None, multiplier: Decimal) -> Decimal:
    """The exact charge of one request log in USD, rounded once (see module
    docstring). Failed and rejected requests, and requests without tokens,
    cost nothing and need no price; otherwise a missing price raises
    ``Unpriced``. ``output_tokens`` already includes thinking (metering)."""
    if not RequestStatus(log.status).billed:
        return Decimal(0).quantize(CHARGE_QUANTUM)
    tokens = (log.input_tokens, log.output_tokens, log.cache_read_tokens, log.cache_write_tokens)
    if not any(tokens):
        return Decimal(0).quantize(CHARGE_QUANTUM)
    if price is None:
        raise Unpriced(f"no price for {log.model!r} at {log.created_at.isoformat()}")
    rates = (
        price.input_usd_per_mtok, price.output_usd_per_mtok,
        price.cache_read_usd_per_mtok, price.cache_write_usd_per_mtok,
    )
    with localcontext() as context:
        context.prec = PRECISION
        amount = sum((Decimal(count) * rate for count, rate in zip(tokens, rates, strict=True)), Decimal(0))
        amount = amount * Decimal(multiplier) / MILLION
        return round_charge(amount)


def price_at(model: str, at: dt.datetime) -> ModelPrice | None:
    """The price of ``model`` in force at ``at``: the latest row that took
    effect at or before that moment."""
    return ModelPrice.objects.filter(model=model, effective_from__lte=at).order_by("-effective_from").first()


def is_priced(model: str, at: dt.datetime | None = None) -> bool:
    """Whether ``model`` has a price in force (now by default). One query;
    the hot path uses ``prices.is_priced`` instead."""
    return ModelPrice.objects.filter(model=model, effective_from__lte=at or timezone.now()).exists()


class PriceHistory:
    """Every price row of some models, in memory, for settling many logs at
    once (the sweep) without a price query per log."""

    def __init__(self, rows: Iterable[ModelPrice]) -> None:
        self._rows: dict[str, list[ModelPrice]] = {}
        for row in sorted(rows, key=lambda r: (r.model, r.effective_from)):
            self._rows.setdefault(row.model, []).append(row)
        self._moments = {model: [r.effective_from for r in rows] for model, rows in self._rows.items()}

    @classmethod
    def load(cls, models: Iterable[str]) -> PriceHistory:
        return cls(ModelPrice.objects.filter(model__in=set(models)))

    def at(self, model: str, moment: dt.datetime) -> ModelPrice | None:
        moments = self._moments.get(model)
        if not moments:
            return None
        index = bisect.bisect_right(moments, moment)
        return self._rows[model][index - 1] if index else None


def load_priced_models() -> frozenset[str]:
    """Names of the models with a price in force now (one query)."""
    return frozenset(
        ModelPrice.objects.filter(effective_from__lte=timezone.now())
        .order_by()
        .values_list("model", flat=True)
        .distinct()
    )


class PriceBook:
    """Which models are priced, for the hot path: ``await
    prices.is_priced(model)``. A new price (or one whose ``effective_from``
    arrives) is seen within HOPBASE_CONFIG_TTL seconds (core.snapshots);
    while the database is unreachable the last list known is used, for up
    to HOPBASE_STALE_MAX_AGE seconds."""

    def __init__(self, loader: Callable[[], frozenset[str]] = load_priced_models) -> None:
        self._snapshot: Snapshot[frozenset[str]] = Snapshot(loader)

    async def models(self) -> frozenset[str]:
        return await self._snapshot.get()

    async def is_priced(self, model: str) -> bool:
        return model in await self._snapshot.get()

    def known(self) -> frozenset[str]:
        """The priced models as last loaded (none before the first load)."""
        return self._snapshot.peek() or frozenset()

    def clear(self) -> None:
        self._snapshot.clear()


prices = PriceBook()


# The row keeps a multiplier to four places (rounding up never under-bills)
# and four before the point (RequestLog.price_multiplier).
MULTIPLIER_PLACES = Decimal("0.0001")
MAX_MULTIPLIER = Decimal("10000")


def with_surcharges(asked: list[Surcharge], extras: dict[str, str] | None,
                    multiplier: Decimal) -> tuple[Decimal, str, list[Surcharge]]:
    """B10: the caller's multiplier with every surcharge the request asks
    for that the model's price (``ModelPrice.extras``: feature -> multiplier
    of the token charge) allows applied, the row's ``extras`` text naming
    them, and the optional ones it does not allow, to be taken out of the
    request (``core.surcharges``); a refusal (400 in the caller's format)
    naming the first other one it does not allow."""
    named: list[str] = []
    dropped: list[Surcharge] = []
    for surcharge in asked:
        price = (extras or {}).get(surcharge.feature)
        if price is None and surcharge.optional:
            dropped.append(surcharge)
            continue
        if price is None:
            raise GatewayError(
                ErrorKind.MALFORMED,
                f"`{surcharge.field}` switches on `{surcharge.feature}`, which this gateway has no price for "
                f"on this model. Remove it, or ask the operator to price it.", param=surcharge.field)
        if surcharge.feature not in named:
            multiplier *= Decimal(price)
            named.append(surcharge.feature)
    if not named:
        return multiplier, "", dropped
    if multiplier >= MAX_MULTIPLIER:  # the row keeps 4 digits before the point: refused, never stored wrong
        raise GatewayError(ErrorKind.MALFORMED, "The surcharges this request switches on together are more than "
                           "this gateway can bill. Ask for fewer of them.", param=asked[0].field)
    text = " ".join(f"{feature} x{Decimal(extras[feature]).normalize():f}" for feature in named)
    return multiplier.quantize(MULTIPLIER_PLACES, rounding=ROUND_UP), text, dropped
