"""End to end: requests through the gateway, whatever became of them, end
up as the right ledger charges and the right export rows (B1–B9)."""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import httpx
import pytest
from django.core.management import call_command

from billing.models import LedgerEntry
from billing.settlement import settle_many
from tests.support.wire import call, sent_bytes, wait_for_log, wait_for_records

pytestmark = [pytest.mark.gateway, pytest.mark.usefixtures("committed_db")]

# The world's price for every scenario model, USD per million tokens.
PRICE = {"input": Decimal("3"), "output": Decimal("15"), "cache_read": Decimal("0.3"), "cache_write": Decimal("3.75")}


def expected_charge(log) -> Decimal:
    total = (
        log.input_tokens * PRICE["input"]
        + log.output_tokens * PRICE["output"]
        + log.cache_read_tokens * PRICE["cache_read"]
        + log.cache_write_tokens * PRICE["cache_write"]
    ) / Decimal(1_000_000)
    return total.quantize(Decimal("1e-10"), rounding=ROUND_HALF_UP)


@dataclass
class Sent:
    request_id: str
    prompt_words: int  # the simulator's input tokens
    received: bytes  # what the client read, to its hang-up
    provided: bytes  # what the provider (the simulator) wrote, to the hang-up


def streamed(gateway, world, model: str, directives: str, hang_up_after: int | None = None) -> Sent:
    tag = uuid.uuid4().hex[:10]
    prompt = f"what is the weather [sim tag={tag} {directives}]"
    request = call("messages", world.key, model, prompt)
    with httpx.stream("POST", gateway.url + request.path, json=request.body, headers=request.headers, timeout=20) as r:
        request_id = r.headers["x-hopbase-request-id"]
        seen = b""
        for chunk in r.iter_raw():
            seen += chunk
            if hang_up_after is not None and seen.count(b"text_delta") >= hang_up_after:
                break
    provided = b""
    if hang_up_after is not None:
        (record,) = wait_for_records(world.simulator.url, tag, closed=True)
        provided = sent_bytes(record)
    return Sent(request_id, len(prompt.split()), seen, provided)


def delta_text(stream: bytes) -> str:
    """The text of an Anthropic stream's text deltas (a cut-off last event is not counted)."""
    text = ""
    for line in stream.split(b"\n"):
        if line.startswith(b"data: ") and b"text_delta" in line:
            try:
                text += json.loads(line[6:])["delta"]["text"]
            except ValueError:
                continue
    return text


def test_every_outcome_is_charged_once_and_exported_as_charged(gateway, world):
    sent = {
        "completed": streamed(gateway, world, "sim-model", "tokens=6 cached=2 cache_write=1"),
        "cancelled": streamed(gateway, world, "sim-model", "tokens=100 pace=0.02", hang_up_after=3),
        "stalled": streamed(gateway, world, "sim-model", "tokens=8 stall_after=3"),
        "interrupted": streamed(gateway, world, "sim-model", "tokens=8 cut_after=3"),
        "failed": streamed(gateway, world, "all-down", "tokens=3"),
    }
    logs = {status: wait_for_log(one.request_id) for status, one in sent.items()}
    assert {status: log.status for status, log in logs.items()} == {s: s for s in sent}

    completed = logs["completed"]
    # Anthropic reports cache reads and writes beside (not inside) input (B9).
    assert (completed.input_tokens, completed.cache_read_tokens, completed.cache_write_tokens) == (
        sent["completed"].prompt_words - 3,
        2,
        1,
    )
    assert (completed.output_tokens, completed.usage_estimated) == (6, False)
    for status in ("cancelled", "stalled", "interrupted"):
        assert logs[status].usage_estimated is True
        assert logs[status].output_tokens >= 3
        assert logs[status].input_tokens == sent[status].prompt_words  # reported up front by message_start
    # A hang-up is billed, from the outside, at least what the client read and
    # at most what the provider wrote before it stopped (B1, B3: 4 characters a token).
    cancelled, hung_up = logs["cancelled"], sent["cancelled"]
    read, written = delta_text(hung_up.received), delta_text(hung_up.provided)
    assert read and written.startswith(read)
    assert -(-len(read) // 4) <= cancelled.output_tokens <= -(-len(written) // 4)
    assert len(written.split()) < 100  # the provider was stopped: it never wrote the whole answer
    assert (logs["failed"].input_tokens, logs["failed"].output_tokens) == (0, 0)

    # What the Celery worker runs for them (tests/processes/test_settlement_worker.py runs a
    # real worker); twice, to show a retry charges nothing more.
    ids = [log.pk for log in logs.values()]
    settle_many(ids)
    settle_many(ids)

    exported = io.StringIO()
    call_command("exportbilling", "--tenant", "acme-gateway", "--format", "jsonl", stdout=exported)
    rows = {row["request_id"]: row for row in map(json.loads, exported.getvalue().splitlines())}
    for status, log in logs.items():
        log.refresh_from_db()
        charge = expected_charge(log)
        assert log.charge_usd == charge
        assert log.settled_at is not None
        entries = list(LedgerEntry.objects.filter(request_log=log))
        if status == "failed":
            assert (charge, entries) == (Decimal("0"), [])
        else:
            assert charge > 0
            assert [entry.amount_usd for entry in entries] == [-charge]
        row = rows[log.request_id]
        assert (row["status"], row["settled"], Decimal(row["charge_usd"])) == (status, True, charge)
        assert (row["input_tokens"], row["output_tokens"]) == (log.input_tokens, log.output_tokens)


def answer_text(api: str, body: dict) -> str:
    if api == "chat":
        return body["choices"][0]["message"]["content"]
    if api == "messages":
        return "".join(block.get("text", "") for block in body["content"])
    if api == "responses":
        return "".join(part["text"] for item in body["output"] if item["type"] == "message"
                       for part in item["content"])
    return "".join(part.get("text", "") for part in body["candidates"][0]["content"]["parts"])


@pytest.mark.parametrize("count", ["-1000000", str(10**30)])
@pytest.mark.parametrize("api", ["chat", "messages", "responses", "gemini"])
def test_a_providers_impossible_usage_is_billed_on_the_estimate_and_logged_once(gateway, world, api, count):
    prompt = f"what is the weather [sim tokens=9 report_output={count}]"
    request = call(api, world.key, "sim-model", prompt, stream=False)
    answer = httpx.post(gateway.url + request.path, json=request.body, headers=request.headers, timeout=20)
    assert answer.status_code == 200, answer.text
    log = wait_for_log(answer.headers["x-hopbase-request-id"])
    # B11: nothing the provider reported is believed; the B2/B3 estimate from
    # what was asked and what the client received is billed instead.
    received = answer_text(api, answer.json())
    assert received
    assert (log.status, log.usage_estimated) == ("completed", True)
    assert log.output_tokens == -(-len(received) // 4)
    assert log.input_tokens == log.prompt_chars // 4 + (log.prompt_chars % 4 > 0) > 0
    settle_many([log.pk])
    assert LedgerEntry.objects.filter(request_log=log).count() == 1
    log.refresh_from_db()
    assert log.charge_usd == expected_charge(log) > 0
