"""Who may still spend: tenants with credit left (balance gating, B-rules of
billing). Budgets per period, the former monthly limit per key among them,
are test_spend.py's and test_spend_gateway.py's."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.balances import load_exhausted_tenants
from billing.ledger import top_up
from tests.support.factories import make_tenant


@pytest.mark.django_db
def test_tenants_with_nothing_left_are_exhausted():
    broke, funded = make_tenant(), make_tenant()
    top_up(funded, Decimal("1"))
    exhausted = load_exhausted_tenants()
    assert broke.pk in exhausted and funded.pk not in exhausted
