"""Spend governance at admission (rules G1–G3): a request reserves its worst
case against every budget covering its key, is refused in its caller's
terms when one has no room, and its charge replaces the reservation when it
ends, whatever the ending; thresholds and exhaustion raise their alerts;
budgets that cannot be checked refuse rather than let spend through.

Mirrors gateway/governance/spend.py, on the in-process store (billing.budgets.store has
the Redis semantics); the same through a gateway is test_spend_gateway.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import redis as redis_lib

from billing.budgets.store import LocalBudgetStore, RedisBudgetStore, from_units
from billing.finished import Finished
from billing.models import AlertType, Budget
from core import snapshots
from core.dependencies import redis as redis_dependency
from core.errors import ErrorKind, GatewayError
from core.usage import Usage
from core.vocabulary import ApiName, RequestStatus
from gateway.auth import Caller
from gateway.governance import spend as spend_module
from gateway.governance.spend import Spend
from providers.apis import CHAT, EMBEDDINGS, GEMINI, MESSAGES
from providers.base import MEDIA_TOKENS, TOOLS_PREAMBLE_TOKENS, dumps
from tests.support.factories import make_key, make_price, make_tenant

# Committed rows: the guard reads them in its own (async) context, where the test's transaction is not.
pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "spend-model"


@pytest.fixture(autouse=True)
def database_in_this_thread(monkeypatch):
    """The budget and price tables, and a window's seed, read in the test's
    own thread and transaction rather than on the database pool."""
    async def here(fn, *args):
        return fn(*args)

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")  # the test's loop is the test's thread
    monkeypatch.setattr(snapshots, "database_call", here)
    monkeypatch.setattr(spend_module, "database_call", here)


@pytest.fixture
def alerts(monkeypatch) -> list[tuple]:
    raised: list[tuple] = []
    monkeypatch.setattr(spend_module, "raise_alert", lambda *args: raised.append(args))
    return raised


@pytest.fixture
def world(settings):
    settings.HOPBASE_DEFAULT_OUTPUT_CAP = 1000
    make_price(MODEL, input_usd_per_mtok=Decimal("2"), output_usd_per_mtok=Decimal("10"))
    tenant = make_tenant(price_multiplier=Decimal("1.5"))
    key, _ = make_key(tenant)
    caller = Caller(key_id=key.pk, key_prefix=key.prefix, tenant_id=tenant.pk, tenant_name=tenant.name,
                    allowed_models=frozenset(), rpm=None, concurrency=None, price_multiplier=tenant.price_multiplier)
    return tenant, key, caller


def chat(max_tokens: int | None = None, text: str = "x" * 400):
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_completion_tokens"] = max_tokens
    return CHAT.parse(body, dumps(body), {})


def record(caller: Caller, status: RequestStatus, input_tokens: int, output_tokens: int) -> Finished:
    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens, input_reported=True, output_reported=True)
    return caller.finished("req", ApiName.CHAT, status, model=MODEL, usage=usage,
                           created_at=datetime.now(UTC), prompt_chars=400)


def test_a_key_without_budgets_or_tpm_holds_nothing(world):
    _, _, caller = world
    assert asyncio.run(Spend(LocalBudgetStore()).admit(caller, CHAT, chat(), "r")) is None


def test_the_worst_case_is_the_estimated_input_and_the_output_cap_at_price(world):
    tenant, key, caller = world
    Budget.objects.create(tenant=tenant, api_key=key, period="1d", limit_usd=Decimal("10"))
    store = LocalBudgetStore()

    async def scenario():
        guard = Spend(store)
        hold = await guard.admit(caller, CHAT, chat(max_tokens=500), "r1")
        default = await guard.admit(caller, CHAT, chat(), "r2")
        embedding = await guard.admit(caller, EMBEDDINGS, EMBEDDINGS.parse(
            {"model": MODEL, "input": "x" * 40}, b"", {}), "r3")
        return hold, default, embedding

    hold, default, embedding = asyncio.run(scenario())
    # 400 characters are 100 tokens: (100 x 2 + 500 x 10) / 10^6 x 1.5; the default cap is 1000 tokens;
    # embeddings write nothing back: 10 tokens of input alone.
    reserved = [Decimal("0.0078"), Decimal("0.0153"), Decimal("0.00003")]
    assert from_units(store.reserved(hold.lines[0])) == sum(reserved)
    assert hold.lines == default.lines == embedding.lines


def worst(api, body, route=None, ceiling=None):
    price = make_price(f"ceiling-{ceiling}", max_output_tokens=ceiling) if ceiling else None
    return spend_module.worst_case(api, api.parse(body, dumps(body), route or {}), price)


def test_the_worst_case_counts_every_answer_asked_for(world):
    text = {"role": "user", "content": "x" * 400}  # 100 tokens
    assert worst(CHAT, {"model": MODEL, "messages": [text], "n": 100, "max_tokens": 2000}) == (100, 200_000)
    gemini = {"contents": [{"parts": [{"text": "x" * 400}]}],
              "generationConfig": {"candidateCount": 3, "maxOutputTokens": 50}}
    route = {"model": MODEL, "action": "generateContent", "version": "v1beta"}
    assert worst(GEMINI, gemini, route) == (100, 150)
    # Google's JSON takes numbers as strings too: "3" makes three answers all the same.
    as_strings = {**gemini, "generationConfig": {"candidateCount": "3", "maxOutputTokens": "50"}}
    assert worst(GEMINI, as_strings, route) == (100, 150)


def test_a_request_naming_no_cap_reserves_the_models_ceiling(world):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert worst(CHAT, body, ceiling=64_000)[1] == 64_000
    assert worst(CHAT, body)[1] == 1000  # no ceiling set: HOPBASE_DEFAULT_OUTPUT_CAP
    # A cap above the ceiling is held to the ceiling; below it, the cap.
    assert worst(CHAT, {**body, "max_tokens": 10**9}, ceiling=64_000)[1] == 64_000
    assert worst(CHAT, {**body, "max_tokens": 10}, ceiling=64_000)[1] == 10


def test_images_files_and_tool_schemas_count_at_a_generous_estimate(world):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    assert worst(CHAT, body)[0] == 1 + MEDIA_TOKENS
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                          "data": "A" * 400_000}}
    claude = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [pdf]}]}
    assert worst(MESSAGES, claude)[0] == 100_000  # its data as text would be
    schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                           "description": "y" * 4000}}}
    with_tools = worst(CHAT, {**body, "tools": [schema]})[0]
    assert with_tools > 1 + MEDIA_TOKENS + 1000 + TOOLS_PREAMBLE_TOKENS


def test_input_is_reserved_at_the_cache_write_rate_where_that_is_dearer(world):
    tenant, key, caller = world
    make_price("cached-model", input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal("0"),
               cache_write_usd_per_mtok=Decimal("6"))
    Budget.objects.create(tenant=tenant, api_key=key, period="1d", limit_usd=Decimal("10"))
    store = LocalBudgetStore()
    body = {"model": "cached-model", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 4000}]}
    hold = asyncio.run(Spend(store).admit(caller, MESSAGES, MESSAGES.parse(body, dumps(body), {}), "r"))
    # 1,000 tokens of prompt at 6 USD per million (not 3), times the tenant's 1.5; one output token at 0.
    assert from_units(store.reserved(hold.lines[0])) == Decimal("0.009")


def test_tokens_per_minute_count_the_same_worst_case(world):
    tenant, key, caller = world
    caller = replace(caller, tpm=150_000)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 100, "max_tokens": 2000}

    async def scenario():
        return await Spend(LocalBudgetStore()).admit(caller, CHAT, CHAT.parse(body, dumps(body), {}), "r")

    with pytest.raises(GatewayError) as refused:  # 200,001 tokens can never fit in 150,000
        asyncio.run(scenario())
    assert refused.value.kind == ErrorKind.RATE_LIMIT


def test_a_request_that_does_not_fit_is_refused_naming_the_budget_and_its_reset(world, alerts):
    tenant, key, caller = world
    budget = Budget.objects.create(tenant=tenant, period="1w", limit_usd=Decimal("0.02"))

    async def scenario():
        guard = Spend(LocalBudgetStore())
        await guard.admit(caller, CHAT, chat(max_tokens=500), "r1")  # 0.0078
        await guard.admit(caller, CHAT, chat(max_tokens=500), "r2")  # 0.0156
        with pytest.raises(GatewayError) as refused:
            await guard.admit(caller, CHAT, chat(max_tokens=500), "r3")
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.kind is ErrorKind.BUDGET
    assert "tenant's weekly budget of 0.02 USD" in refused.message
    assert "it resets at " in refused.message and refused.message.endswith("Z.")
    # The window's first refusal is its exhaustion (G4): alerted once.
    assert [(a[0], a[1]) for a in alerts] == [(budget.pk, AlertType.EXHAUSTED)]


def test_the_key_and_its_tenant_budgets_both_apply(world):
    tenant, key, caller = world
    Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal("100"))
    Budget.objects.create(tenant=tenant, api_key=key, period="1mo", limit_usd=Decimal("0.01"))
    guard = Spend(LocalBudgetStore())

    async def scenario():
        await guard.admit(caller, CHAT, chat(max_tokens=500), "r1")
        with pytest.raises(GatewayError) as refused:
            await guard.admit(caller, CHAT, chat(max_tokens=500), "r2")
        return refused.value

    assert f"API key {key.prefix}…'s monthly budget" in asyncio.run(scenario()).message


@pytest.mark.parametrize("status", [RequestStatus.COMPLETED, RequestStatus.CANCELLED, RequestStatus.STALLED])
def test_the_charge_replaces_the_reservation_whatever_the_ending(world, status, alerts):
    tenant, key, caller = world
    budget = Budget.objects.create(tenant=tenant, api_key=key, period="1h", limit_usd=Decimal("0.01"),
                                   alert_at_pct=50)
    store = LocalBudgetStore()

    async def scenario():
        guard = Spend(store)
        hold = await guard.admit(caller, CHAT, chat(max_tokens=500), "r1")
        guard.ended(hold, record(caller, status, 100, 300))
        await asyncio.gather(*guard._tasks)
        return hold

    hold = asyncio.run(scenario())
    book = store._book(hold.lines[0])
    # (100 x 2 + 300 x 10) / 10^6 x 1.5 = 0.0048 spent, nothing reserved.
    assert (from_units(book.spent), store.reserved(hold.lines[0])) == (Decimal("0.0048"), 0)
    assert alerts == []  # 48 % of the limit: the 50 % threshold not crossed yet
    asyncio.run(_another(store, caller, 200, 300, alerts))
    assert [(a[0], a[1], a[3]) for a in alerts] == [(budget.pk, AlertType.THRESHOLD, Decimal("0.0099"))]


async def _another(store, caller, input_tokens, output_tokens, alerts):
    guard = Spend(store)
    hold = await guard.admit(caller, CHAT, chat(max_tokens=100), "r2")
    guard.ended(hold, record(caller, RequestStatus.COMPLETED, input_tokens, output_tokens))
    await asyncio.gather(*guard._tasks)


def test_a_refused_or_failed_request_costs_its_budget_nothing(world):
    tenant, key, caller = world
    Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal("1"))
    store = LocalBudgetStore()

    async def scenario():
        guard = Spend(store)
        hold = await guard.admit(caller, CHAT, chat(max_tokens=500), "r1")
        guard.ended(hold, record(caller, RequestStatus.FAILED, 100, 300))
        other = await guard.admit(caller, CHAT, chat(max_tokens=500), "r2")
        guard.ended(other, None)  # refused after admission (a rate limit): never ran
        await asyncio.gather(*guard._tasks)
        return hold

    hold = asyncio.run(scenario())
    assert (store._book(hold.lines[0]).spent, store.reserved(hold.lines[0])) == (0, 0)


def test_a_window_is_seeded_from_the_ledgers_settled_charges(world):
    from tests.support.factories import make_log

    tenant, key, caller = world
    Budget.objects.create(tenant=tenant, api_key=key, period="total", limit_usd=Decimal("1"))
    make_log(tenant, key=key, model=MODEL, charge_usd=Decimal("0.995"))
    make_log(tenant, model=MODEL, charge_usd=Decimal("5"))  # another key's: not this budget's

    async def scenario():
        guard = Spend(LocalBudgetStore())
        await guard.admit(caller, CHAT, chat(max_tokens=100), "r1")  # 0.0018: fits in the 0.005 left
        with pytest.raises(GatewayError):
            await guard.admit(caller, CHAT, chat(max_tokens=500), "r2")

    asyncio.run(scenario())


@pytest.fixture
def redis_breaker():
    yield redis_dependency
    redis_dependency.reset()  # the outage below is this test's alone


def test_budgets_that_cannot_be_checked_refuse_the_request(world, redis_breaker):
    tenant, key, caller = world
    Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal("1"))
    guard = Spend(RedisBudgetStore("redis://127.0.0.1:9/0"))  # nothing listens there
    for _ in range(2):  # the first finds Redis away, the second is not even let try
        with pytest.raises(GatewayError) as refused:
            asyncio.run(guard.admit(caller, CHAT, chat(max_tokens=500), "r1"))
        assert refused.value.kind is ErrorKind.UNAVAILABLE and refused.value.retry_after
    assert not redis_breaker.up


def test_requests_ending_together_each_settle_their_charge_once(world, settings):
    """Many endings while a settlement is on its way to Redis: each charge is
    added to the window's spend exactly once (none twice, none dropped)."""
    if not settings.REDIS_URL:
        pytest.skip("the race is with Redis's round trips; the in-process store has none")
    tenant, key, caller = world
    Budget.objects.create(tenant=tenant, period="1d", limit_usd=Decimal("100"))
    store = RedisBudgetStore(settings.REDIS_URL)
    redis = redis_lib.Redis.from_url(settings.REDIS_URL)

    async def scenario() -> int:
        guard = Spend(store)
        holds = [await guard.admit(caller, CHAT, chat(max_tokens=10), f"r{n}") for n in range(40)]
        book = holds[0].lines[0].book
        before = int(redis.hget(book, "spent"))  # a window another run left is carried on, not reset
        for n, hold in enumerate(holds):
            guard.ended(hold, record(caller, RequestStatus.COMPLETED, 100, 300))
            if n % 3 == 0:
                await asyncio.sleep(0)  # a settlement gets under way among the endings
        while guard._tasks:
            await asyncio.gather(*guard._tasks)
        return int(redis.hget(book, "spent")) - before

    # Each: (100 x 2 + 300 x 10) / 10^6 x 1.5 = 0.0048 USD.
    assert from_units(asyncio.run(scenario())) == 40 * Decimal("0.0048")


def test_a_script_failing_in_a_batch_costs_only_its_own_charge_and_none_is_counted_twice(world, settings, monkeypatch):
    """One settlement of a batch fails (its book is not a hash): the others
    are added once each, Redis is not taken for down, and nothing is resent."""
    if not settings.REDIS_URL:
        pytest.skip("a batch of settlements is a Redis pipeline")
    tenant, key, caller = world
    other_key, _ = make_key(tenant)
    other = Caller(key_id=other_key.pk, key_prefix=other_key.prefix, tenant_id=tenant.pk, tenant_name=tenant.name,
                   allowed_models=frozenset(), rpm=None, concurrency=None, price_multiplier=tenant.price_multiplier)
    Budget.objects.create(tenant=tenant, api_key=key, period="1d", limit_usd=Decimal("100"))
    Budget.objects.create(tenant=tenant, api_key=other_key, period="1d", limit_usd=Decimal("100"))
    monkeypatch.setattr(spend_module, "SETTLE_RETRY_SECONDS", 0.01)
    store = RedisBudgetStore(settings.REDIS_URL)
    r = redis_lib.Redis.from_url(settings.REDIS_URL)

    async def scenario():
        guard = Spend(store)
        good = await guard.admit(caller, CHAT, chat(max_tokens=10), "good")
        bad = await guard.admit(other, CHAT, chat(max_tokens=10), "bad")
        book = good.lines[0].book
        before = int(r.hget(book, "spent"))
        r.delete(bad.lines[0].book)
        r.set(bad.lines[0].book, "not a hash")  # one script of the batch fails (WRONGTYPE)
        guard.ended(good, record(caller, RequestStatus.COMPLETED, 100, 300))
        guard.ended(bad, record(other, RequestStatus.COMPLETED, 100, 300))
        while guard._tasks:
            await asyncio.gather(*guard._tasks)
        return int(r.hget(book, "spent")) - before

    assert from_units(asyncio.run(scenario())) == Decimal("0.0048")
    assert redis_dependency.up
