"""Checking the arguments of HopBase's operator commands (the operator
contract in docs/operations.md), before anything is written.

Every bad value becomes one ``CommandError`` naming the argument, so a command
run from a script fails with exit status 1 and a single line on stderr. The
checks happen in ``handle()`` rather than through argparse ``type=`` and
``choices=``: argparse answers a bad value with a usage block as well as the
error. Amounts are ``Decimal`` from the text the operator typed, never float,
and a value the database column would round is refused instead.
"""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal, InvalidOperation
from typing import Any, NoReturn

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.moments import utc_moment

# Column limits: billing.models.USD (20, 10) and PRICE (14, 6); a
# PositiveIntegerField or IntegerField on PostgreSQL is 32-bit.
USD_DIGITS, USD_PLACES = 20, 10
PRICE_DIGITS, PRICE_PLACES = 14, 6
INT_MAX = 2**31 - 1


def parse_decimal(
    text: object, what: str, *, max_digits: int, decimal_places: int, positive: bool = False
) -> Decimal:
    """A non-negative (or positive) exact decimal that fits its column."""
    raw = str(text).strip()
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise CommandError(f"{what}: {raw!r} is not a number") from None
    if not value.is_finite():
        raise CommandError(f"{what}: {raw!r} is not a finite number")
    if value < 0:
        raise CommandError(f"{what}: {raw!r} must not be negative")
    if positive and value == 0:
        raise CommandError(f"{what}: {raw!r} must be more than zero")
    value = abs(value)  # "-0" is zero
    if value >= Decimal(10) ** (max_digits - decimal_places):
        raise CommandError(f"{what}: {raw!r} is too large")
    # Trailing zeros are harmless ("1.50000000000"); digits the column would drop are not.
    if value != value.quantize(Decimal(1).scaleb(-decimal_places)):
        raise CommandError(f"{what}: {raw!r} has more than {decimal_places} decimal places")
    return value


def parse_usd(text: object, what: str, *, positive: bool = True) -> Decimal:
    """A ledger amount in USD (up to 10 decimal places)."""
    return parse_decimal(text, what, max_digits=USD_DIGITS, decimal_places=USD_PLACES, positive=positive)


def parse_price(text: object, what: str) -> Decimal:
    """A price in USD per million tokens (up to 6 decimal places)."""
    return parse_decimal(text, what, max_digits=PRICE_DIGITS, decimal_places=PRICE_PLACES)


def parse_int(text: object, what: str, *, minimum: int, maximum: int = INT_MAX) -> int:
    raw = str(text).strip()
    try:
        value = int(raw)
    except ValueError:
        raise CommandError(f"{what}: {raw!r} is not a whole number") from None
    if value < minimum:
        raise CommandError(f"{what}: {raw!r} must be at least {minimum}")
    if value > maximum:
        raise CommandError(f"{what}: {raw!r} is too large")
    return value


def parse_optional_positive(text: object | None, what: str) -> int | None:
    return None if text is None else parse_int(text, what, minimum=1)


def parse_moment(text: str, what: str) -> dt.datetime:
    """An ISO 8601 date (midnight UTC) or datetime (UTC when it carries no offset)."""
    raw = text.strip()
    try:
        return utc_moment(raw)
    except ValueError:
        raise CommandError(f"{what}: {raw!r} is not an ISO 8601 date or datetime") from None


def checked(value: str, validator, what: str):
    """Run a form-layer validator (shared with the admin) as a command check."""
    try:
        return validator(value)
    except ValidationError as error:
        raise CommandError(f"{what}: {' '.join(error.messages)}") from None


def parse_name(text: str, what: str, max_length: int) -> str:
    name = text.strip()
    if not name:
        raise CommandError(f"{what} must not be empty")
    if len(name) > max_length:
        raise CommandError(f"{what}: {name!r} is longer than {max_length} characters")
    return name


class OperatorCommand(BaseCommand):
    """A command of the operator contract: a usage mistake (a missing or
    unknown argument) is one line on stderr and a non-zero exit, like a bad
    value, not argparse's usage block."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def one_line(message: str) -> NoReturn:
            if not parser.called_from_command_line:
                raise CommandError(f"Error: {message}")
            sys.stderr.write(f"{subcommand}: {message}\n")
            sys.exit(2)

        parser.error = one_line  # type: ignore[method-assign]
        return parser
