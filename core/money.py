"""Money: exact decimals in USD, never floats.

Amounts are stored with 10 decimal places (``RequestLog.charge_usd``, the
ledger); ``usd_text`` is how every amount is shown, in exports, the admin,
the API and the operator commands.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

# RequestLog.charge_usd and LedgerEntry.amount_usd have decimal_places=10.
CHARGE_QUANTUM = Decimal("1E-10")


def round_charge(amount: Decimal) -> Decimal:
    """The one rounding of a charge: to 10 places, half up."""
    return amount.quantize(CHARGE_QUANTUM, rounding=ROUND_HALF_UP)


def usd_text(amount: Decimal) -> str:
    """An exact amount with at least two decimals and no padding beyond the
    last significant digit: 12.5000000000 -> '12.50', 0.0001230000 ->
    '0.000123', 7 -> '7.00', 0 -> '0.00'. Never rounds and never uses an
    exponent, so ``Decimal(usd_text(x)) == x``."""
    if not amount.is_finite():
        raise ValueError(f"not an amount: {amount}")
    if amount.is_zero():
        amount = Decimal(0)  # no "-0.00"
    # Text, not normalize(): normalize() rounds to the context's 28 digits.
    whole, _, fraction = f"{amount:f}".partition(".")
    return f"{whole}.{fraction.rstrip('0').ljust(2, '0')}"
