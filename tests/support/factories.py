"""Small factories for test data: one function per model, sensible defaults."""

from __future__ import annotations

import itertools
from decimal import Decimal

from billing.models import ModelPrice, RequestLog
from channels_pool.models import Channel
from tenants.models import ApiKey, Tenant

_counter = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


def make_tenant(name: str | None = None, **fields) -> Tenant:
    return Tenant.objects.create(name=name or unique("tenant"), **fields)


def make_key(tenant: Tenant | None = None, **fields) -> tuple[ApiKey, str]:
    return ApiKey.objects.issue(tenant or make_tenant(), **fields)


def make_channel(name: str | None = None, **fields) -> Channel:
    fields.setdefault("protocol", "openai")
    fields.setdefault("base_url", "http://127.0.0.1:9/v1")
    fields.setdefault("secret", "sk-upstream-secret")
    fields.setdefault("served_models", ["gpt-test"])
    return Channel.objects.create(name=name or unique("channel"), **fields)


def make_price(model: str = "gpt-test", **fields) -> ModelPrice:
    fields.setdefault("input_usd_per_mtok", Decimal("1"))
    fields.setdefault("output_usd_per_mtok", Decimal("2"))
    return ModelPrice.objects.create(model=model, **fields)


def make_log(tenant: Tenant | None = None, key: ApiKey | None = None, **fields) -> RequestLog:
    """A completed request log; ``settled_at`` is left for the test to set."""
    tenant = tenant or (key.tenant if key is not None else make_tenant())
    fields.setdefault("request_id", unique("req"))
    fields.setdefault("protocol", "openai")
    fields.setdefault("model", "gpt-test")
    fields.setdefault("status", RequestLog.Status.COMPLETED)
    return RequestLog.objects.create(tenant=tenant, api_key=key, **fields)
