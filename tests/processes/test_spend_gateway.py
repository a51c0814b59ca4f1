"""Budgets and tokens per minute through running gateways (rules G2, G3, G5):
a budget refuses in each caller's format before any channel is called,
logged as rejected; a key's TPM refuses with a retry-after; and the race —
50 concurrent requests against a budget that fits five, on ``manage.py
serve --workers 2`` with Redis and a real Celery worker — never ends above
the budget once every request is settled.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import time
import uuid
from decimal import Decimal

import httpx
import pytest
import redis

from billing.budgets.spend import spent_in
from billing.budgets.windows import window_at
from billing.ledger import top_up
from billing.models import Budget, ModelPrice, RequestLog
from channels_pool.models import Channel
from tenants.models import ApiKey, Tenant
from tests.conftest import GATEWAY_TIMERS, database_url_for_subprocess
from tests.support.celery_worker import Worker
from tests.support.processes import Service, free_port
from tests.support.protocol_checks import new_tag
from tests.support.settlement_checks import wait_for
from tests.support.wire import call, channel_protocol, wait_for_log

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

MODEL = "sim-model"  # priced and served by every protocol's channels in the test world
REFUSALS = {  # client API -> status, and where its format says "budget"
    "chat": (429, lambda body: (body["error"]["type"], body["error"]["code"]) == ("insufficient_quota",
                                                                               "budget_exceeded")),
    "responses": (429, lambda body: body["error"]["code"] == "budget_exceeded"),
    "messages": (429, lambda body: body["error"]["type"] == "rate_limit_error"),
    "gemini": (429, lambda body: body["error"]["status"] == "RESOURCE_EXHAUSTED"),
}


def fresh_key(**fields) -> tuple[ApiKey, str]:
    tenant = Tenant.objects.create(name=f"spend-{uuid.uuid4().hex[:8]}")
    top_up(tenant, Decimal("100"))  # through the ledger: its balance is the sum of its entries
    return ApiKey.objects.issue(tenant, **fields)


def refused_in_time(gateway, secret: str, api: str, within: float = 5.0) -> httpx.Response:
    """The first answer that is not a 200 (a new budget is in force within the config TTL)."""
    deadline = time.monotonic() + within
    while True:
        request = call(api, secret, MODEL, f"hello [sim tokens=2 tag={new_tag()}]", stream=False)
        answer = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=10)
        if answer.status_code != 200 or time.monotonic() > deadline:
            return answer


@pytest.mark.parametrize("api", list(REFUSALS))
def test_an_exhausted_budget_refuses_in_the_callers_format_before_any_channel(gateway, world, sim_records, api):
    key, secret = fresh_key()
    Budget.objects.create(tenant=key.tenant, api_key=key, period="1d", limit_usd=Decimal("0"))
    answer = refused_in_time(gateway, secret, api)
    status, names_budget = REFUSALS[api]
    assert answer.status_code == status and names_budget(answer.json())
    assert answer.headers["x-should-retry"] == "false"
    message = answer.text
    assert "daily budget of 0 USD" in message and "resets at" in message
    row = wait_for_log(answer.headers["x-hopbase-request-id"])
    assert (row.status, row.error_kind, row.attempts, row.channel_id) == ("rejected", "budget", 0, None)


def test_a_tenant_budget_covers_all_its_keys(gateway, world):
    key, secret = fresh_key()
    _, other = ApiKey.objects.issue(key.tenant)
    Budget.objects.create(tenant=key.tenant, period="total", limit_usd=Decimal("0"))
    for each in (secret, other):
        answer = refused_in_time(gateway, each, "chat")
        assert answer.status_code == 429 and "tenant's total budget" in answer.json()["error"]["message"]
        assert "does not reset" in answer.json()["error"]["message"]


def test_a_key_over_its_tokens_per_minute_is_refused_with_a_retry_after(gateway, world):
    _, secret = fresh_key(tpm=10)  # any request's estimate plus its output cap is more
    request = call("chat", secret, MODEL, "hello [sim tokens=2]", stream=False)
    request.body["max_completion_tokens"] = 5
    deadline = time.monotonic() + 5
    while (answer := httpx.post(gateway.url + request.path, json=request.body, headers=request.headers,
                                timeout=10)).status_code == 200:
        assert time.monotonic() < deadline  # the key's TPM is read within the config TTL
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
    assert answer.json()["error"]["code"] == "rate_limit_exceeded" and "tokens per minute" in answer.text


# -- the race -------------------------------------------------------------------------

RACE_REQUESTS = 50
# Every request's worst case is about 1,000 tokens at 1 USD per million: the
# budget fits exactly five. The simulator then bills each about what was
# reserved (every answer asked for, each as long as its cap), so a gateway
# that reserved less than the worst case would admit more than five and
# settle past the limit.
RACE_LIMIT = Decimal("0.0055")
RACE_ADMITTED = 5
ANSWERS = 4
PER_ANSWER = 250  # 4 answers of 250 tokens: 1,000 output tokens
CEILING = 1000  # the model's output ceiling, for a request that names no cap


def race_shape(api: str, shape: str, model: str, secret: str):
    """A request whose worst case is ~1,000 output tokens, and that the
    simulator answers with exactly as many (each answer after 2 s, so all
    overlap)."""
    if shape == "choices":
        prompt = f"race [sim tokens={PER_ANSWER} first_delay=2]"
        if api == "gemini":
            config = {"candidateCount": ANSWERS, "maxOutputTokens": PER_ANSWER}
            return call(api, secret, model, prompt, stream=False, generationConfig=config)
        return call(api, secret, model, prompt, stream=False, n=ANSWERS, max_completion_tokens=PER_ANSWER)
    prompt = f"race [sim tokens={CEILING} first_delay=2]"  # names no cap: the ceiling is reserved
    return call(api, secret, model, prompt, stream=False)


def race_redis_url() -> str:
    base = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    return base.rsplit("/", 1)[0] + "/11"  # a database of its own: the worker takes only this test's tasks


@pytest.fixture
def race_world(world, request):
    api = request.param[0]
    model = f"race-{uuid.uuid4().hex[:8]}"
    ModelPrice.objects.create(model=model, input_usd_per_mtok=Decimal("1"), output_usd_per_mtok=Decimal("1"),
                              max_output_tokens=CEILING)
    base = world.simulator.url + ("/v1" if api == "chat" else "")
    Channel.objects.create(name=model, protocol=channel_protocol(api), base_url=base,
                           secret="sk-upstream-secret", served_models=[model])
    key, secret = fresh_key()
    budget = Budget.objects.create(tenant=key.tenant, api_key=key, period="1d", limit_usd=RACE_LIMIT)
    return api, model, key, secret, budget


@pytest.fixture
def race_stack():
    url = race_redis_url()
    redis.Redis.from_url(url).flushdb()
    env = {**os.environ, **GATEWAY_TIMERS, "DATABASE_URL": database_url_for_subprocess(), "REDIS_URL": url}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    port = free_port()
    served = Service("serve", [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2"],
                     env, "/healthz", port)
    worker = Worker(url, "celery")  # the default queue: what the gateways publish settlements to
    try:
        yield served
    finally:
        served.stop()
        worker.stop()


RACES = [("chat", "choices"), ("gemini", "choices"), ("chat", "capless")]


@pytest.mark.parametrize(("race_world", "shape"), [((api,), shape) for api, shape in RACES],
                         indirect=["race_world"], ids=[f"{api}-{shape}" for api, shape in RACES])
def test_concurrent_requests_on_two_processes_never_spend_past_a_budget(race_world, shape, race_stack):
    api, model, key, secret, budget = race_world
    request = race_shape(api, shape, model, secret)
    with httpx.Client(timeout=30) as warm:  # both processes have read the key and its budget
        for _ in range(4):
            warm.get(race_stack.url + "/healthz")

    def one(_: int) -> httpx.Response:
        with httpx.Client(timeout=30) as client:  # a connection each: spread over both workers
            return client.post(race_stack.url + request.path, json=request.body, headers=request.headers)

    with concurrent.futures.ThreadPoolExecutor(RACE_REQUESTS) as pool:
        answers = list(pool.map(one, range(RACE_REQUESTS)))

    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert len(served) == RACE_ADMITTED, [a.text for a in refused[:3]]
    for answer in refused:
        assert answer.status_code == 429 and "budget" in answer.text, answer.text
    ids = [a.headers["x-hopbase-request-id"] for a in answers]
    wait_for(lambda: RequestLog.objects.filter(request_id__in=ids).count() == RACE_REQUESTS, 20, "every log")
    wait_for(lambda: not RequestLog.objects.filter(request_id__in=ids, settled_at__isnull=True).exists(), 30,
             "the worker to settle every request")
    logs = RequestLog.objects.filter(request_id__in=ids)
    assert logs.filter(status="rejected").count() == len(refused)
    # Each served request was billed about the worst case: six would not have fit.
    for log in logs.filter(status="completed"):
        assert log.output_tokens == (ANSWERS * PER_ANSWER if shape == "choices" else CEILING)
        assert log.charge_usd > RACE_LIMIT / (RACE_ADMITTED + 1)
    spent = spent_in(Budget.objects.get(pk=budget.pk), window_at("1d", logs.earliest("created_at").created_at))
    assert 0 < spent <= RACE_LIMIT
    assert spent == sum(log.charge_usd for log in logs)
