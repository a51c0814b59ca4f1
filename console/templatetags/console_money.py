"""``{{ amount|usd }}``: a USD amount as the ledger and the export write it
(core.money.usd_text, exact, no float rounding); empty for none."""

from __future__ import annotations

from decimal import Decimal

from django import template

from core.money import usd_text

register = template.Library()


@register.filter
def usd(amount: Decimal | None) -> str:
    return "" if amount is None else usd_text(amount)
