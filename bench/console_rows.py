"""The console bench's data (bench/console_pages.py): one tenant with a
million request logs spread over 45 days, and their ledger, loaded fast.

What the rows look like, so that the pages' queries meet what a busy
tenant's would: six keys and seven models of very unequal use (the rarest
of each about 0.5 % of the rows), mostly completed requests with a few
percent failed, rejected, cancelled, stalled or interrupted, token counts
of a long-tailed spread, each charge its model's price of its tokens, and
the last few hundred not settled yet. Every settled charge has its ledger
entry two seconds after its request, with the balance it left; top-ups
weekly. A second tenant with a tenth as many rows shares the tables, so
that "the tenant's rows" is a real filter.

PostgreSQL takes the rows with ``COPY`` (about a minute for a million on
two cores); SQLite with ``executemany`` of the values Django would write.
Ids are given, in time order, as the gateway's inserts would make them.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal

from django.db import connection, models, transaction

from billing.models import Budget, LedgerEntry, RequestLog
from channels_pool.models import Channel
from tenants.models import ApiKey, Tenant

DAYS = 45
SEED = 29
TEN_PLACES = Decimal("1e-10")
MILLION = Decimal(1_000_000)
# model -> (share of requests, input and output USD per million tokens)
MODELS = {
    "gpt-4o-mini": (0.46, Decimal("0.15"), Decimal("0.60")),
    "claude-sonnet-4-5": (0.22, Decimal("3"), Decimal("15")),
    "gpt-4.1": (0.14, Decimal("2"), Decimal("8")),
    "gemini-2.5-flash": (0.10, Decimal("0.30"), Decimal("2.50")),
    "claude-haiku-4-5": (0.06, Decimal("1"), Decimal("5")),
    "text-embedding-3-small": (0.015, Decimal("0.02"), Decimal("0")),
    "o3": (0.005, Decimal("2"), Decimal("8")),
}
KEYS = {"production": 0.55, "staging": 0.20, "batch": 0.15, "ci": 0.06, "notebook": 0.035, "legacy": 0.005}
STATUSES = {"completed": 0.95, "failed": 0.02, "rejected": 0.015, "cancelled": 0.01, "stalled": 0.003,
            "interrupted": 0.002}
UNCHARGED = ("failed", "rejected")
UNSETTLED_TAIL = 300  # the newest rows, not settled yet
OTHER_EVERY = 11  # every eleventh row is the other tenant's: a tenth as many as the bench tenant's


@dataclass
class Loaded:
    tenant: Tenant
    other: Tenant
    keys: dict[str, ApiKey]
    logs: int = 0  # the bench tenant's
    other_logs: int = 0
    entries: int = 0  # ledger entries, both tenants
    request_id: str = ""  # one of the bench tenant's, for the request-id search
    ledger: list[tuple] = field(default_factory=list, repr=False)


def weighted(rng: random.Random, table: dict) -> Iterator[str]:
    names = list(table)
    weights = [value[0] if isinstance(value, tuple) else value for value in table.values()]
    while True:
        yield from rng.choices(names, weights, k=4096)


def load(rows: int, now: dt.datetime) -> Loaded:
    """The tenants, keys, budgets and a channel, then ``rows`` logs of the
    bench tenant (and a tenth as many of the other) and their ledger."""
    tenant = Tenant.objects.create(name="bench-console")
    other = Tenant.objects.create(name="bench-console-other")
    keys = {label: ApiKey.objects.issue(tenant, label=label)[0] for label in KEYS}
    other_key = ApiKey.objects.issue(other, label="other")[0]
    channel = Channel.objects.create(name="bench-console-openai", protocol="openai", base_url="http://127.0.0.1:9/v1",
                                     secret="sk-bench", served_models=list(MODELS))
    Budget.objects.create(tenant=tenant, period="1mo", limit_usd=Decimal("5000"), alert_at_pct=80)
    Budget.objects.create(tenant=tenant, api_key=keys["batch"], period="1d", limit_usd=Decimal("100"))
    loaded = Loaded(tenant, other, keys)
    log_rows = generate(loaded, other_key, channel, rows, now)
    with transaction.atomic():
        insert(RequestLog, log_rows)
        insert(LedgerEntry, iter(loaded.ledger))
        balances = {tenant.pk: Decimal(0), other.pk: Decimal(0)}
        for entry in loaded.ledger:
            balances[entry[1]] = entry[4]
        for pk, balance in balances.items():
            Tenant.objects.filter(pk=pk).update(balance_usd=balance)
        loaded.entries = len(loaded.ledger)
        loaded.ledger = []
        ApiKey.objects.filter(tenant__in=[tenant, other]).update(last_used_at=now)
    return loaded


def generate(loaded: Loaded, other_key: ApiKey, channel: Channel, rows: int, now: dt.datetime) -> Iterator[dict]:
    """The logs of both tenants in time order (a generator: the ledger's
    rows are gathered on the way, in ``loaded.ledger``)."""
    rng = random.Random(SEED)
    models_, keys_, statuses = weighted(rng, MODELS), weighted(rng, KEYS), weighted(rng, STATUSES)
    total = rows * OTHER_EVERY // (OTHER_EVERY - 1)
    start = now - dt.timedelta(days=DAYS)
    step = dt.timedelta(days=DAYS) / total
    balances = {loaded.tenant.pk: Decimal(0), loaded.other.pk: Decimal(0)}
    next_top_up = start
    entry_id = 0

    def entry(tenant_id: int, kind: str, amount: Decimal, at: dt.datetime, log_id: int | None, note: str = "") -> None:
        nonlocal entry_id
        entry_id += 1
        balances[tenant_id] += amount
        loaded.ledger.append((entry_id, tenant_id, kind, amount, balances[tenant_id], log_id, note, at))

    for n in range(total):
        created_at = start + step * n
        if created_at >= next_top_up:
            for tenant_id, amount in ((loaded.tenant.pk, Decimal("2000")), (loaded.other.pk, Decimal("200"))):
                entry(tenant_id, "topup", amount, created_at, None, "weekly top-up")
            next_top_up += dt.timedelta(days=7)
        ours = n % OTHER_EVERY != OTHER_EVERY - 1
        if ours:
            loaded.logs += 1
            tenant_id, key = loaded.tenant.pk, loaded.keys[next(keys_)]
        else:
            loaded.other_logs += 1
            tenant_id, key = loaded.other.pk, other_key
        model, status = next(models_), next(statuses)
        _, input_price, output_price = MODELS[model]
        charged = status not in UNCHARGED
        input_tokens = int(rng.lognormvariate(6.5, 1.0)) if charged else 0
        output_tokens = int(rng.lognormvariate(5.0, 1.1)) if charged and output_price else 0
        cached = int(input_tokens * rng.choice((0, 0, 0, 0.5, 0.9)))
        charge = ((input_tokens * input_price + output_tokens * output_price + cached * input_price / 10) / MILLION
                  ).quantize(TEN_PLACES)
        settled = n < total - UNSETTLED_TAIL
        request_id = f"req_{rng.getrandbits(128):032x}"
        if ours and n == total // 3:
            loaded.request_id = request_id
        if settled and charge > 0:
            entry(tenant_id, "charge", -charge, created_at + dt.timedelta(seconds=2), n + 1)
        yield {
            "id": n + 1, "request_id": request_id, "created_at": created_at, "tenant_id": tenant_id,
            "api_key_id": key.pk, "model": model, "channel_id": channel.pk, "protocol": "openai",
            "endpoint": "chat.completions", "stream": rng.random() < 0.6, "status": status,
            "error_kind": "" if status == "completed" else status, "attempts": 1,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "cache_read_tokens": cached,
            "ttft_ms": rng.randint(150, 2500) if charged else None, "duration_ms": rng.randint(300, 40000),
            "upstream_status": 200 if charged else 500, "price_multiplier": Decimal(1),
            "charge_usd": charge if settled or not charged else None,
            "settled_at": created_at + dt.timedelta(seconds=2) if settled else None,
        }


LEDGER_COLUMNS = ("id", "tenant_id", "kind", "amount_usd", "balance_after_usd", "request_log_id", "note", "created_at")


def insert(model: type[models.Model], rows: Iterable[dict] | Iterable[tuple]) -> None:
    """Rows of ``model`` (dicts of attnames, or tuples in LEDGER_COLUMNS'
    order), every other field at its default; the id sequence moved past them."""
    fields = [f for f in model._meta.concrete_fields]
    columns = [f.column for f in fields]
    defaults = {f.attname: f.get_default() for f in fields}

    def values(row) -> tuple:
        given = row if isinstance(row, dict) else dict(zip(LEDGER_COLUMNS, row))
        return tuple(given.get(f.attname, defaults[f.attname]) for f in fields)

    table = model._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(values(row))
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            return
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
        batch: list[tuple] = []
        for row in rows:
            batch.append(tuple(f.get_db_prep_save(value, connection) for f, value in zip(fields, values(row))))
            if len(batch) == 10_000:
                cursor.executemany(sql, batch)
                batch = []
        if batch:
            cursor.executemany(sql, batch)


def analyze() -> None:
    """Statistics (and on PostgreSQL the visibility map) as autovacuum would have them."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for model in (RequestLog, LedgerEntry):
                cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")
        else:
            cursor.execute("ANALYZE")
