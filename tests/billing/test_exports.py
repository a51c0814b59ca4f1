"""Finance exports (B7, B9): they agree with the ledger to the last decimal,
they stream in constant memory, and the admin's request-log list exports
exactly what it shows, fast however many rows there are."""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import json
import tracemalloc
import warnings
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing.exports import COLUMNS, csv_lines, export_queryset, export_rows, streamed
from billing.ledger import top_up
from billing.models import LedgerEntry, RequestLog
from billing.settlement import sweep
from tests.support.factories import (
    make_channel,
    make_key,
    make_log,
    make_price,
    make_tenant,
    unique,
)

pytestmark = pytest.mark.django_db

DAY = dt.timedelta(days=1)


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def export(*args: str) -> str:
    out = io.StringIO()
    call_command("exportbilling", *args, stdout=out)
    return out.getvalue()


# Exports agree with the ledger


@pytest.fixture
def settled_month():
    """Three days of settled traffic from two tenants, with charges that use
    all ten decimal places (odd prices, a multiplier of 0.7777)."""
    start = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0) - 3 * DAY
    make_price("gpt-odd", input_usd_per_mtok=Decimal("2.718281"), output_usd_per_mtok=Decimal("3.141592"),
               cache_read_usd_per_mtok=Decimal("0.333333"), cache_write_usd_per_mtok=Decimal("1.414213"),
               effective_from=start - DAY)
    tenants = [make_tenant("finance-a", price_multiplier=Decimal("0.7777")), make_tenant("finance-b")]
    for tenant in tenants:
        top_up(tenant, Decimal("100"))
    statuses = ["completed", "cancelled", "stalled", "interrupted", "failed", "rejected"]
    for n in range(90):
        make_log(
            tenants[n % 2], model="gpt-odd", status=statuses[n % len(statuses)],
            created_at=start + n * (3 * DAY / 90),
            input_tokens=1 + n * 37, output_tokens=3 + n * 11, cache_read_tokens=n * 5, cache_write_tokens=n % 7,
        )
    assert sweep(dt.timedelta(0)).settled == 90
    return start, tenants


def ledger_charges(since: dt.datetime, until: dt.datetime, tenant=None) -> Decimal:
    entries = LedgerEntry.objects.filter(
        kind="charge", request_log__created_at__gte=since, request_log__created_at__lt=until
    )
    if tenant is not None:
        entries = entries.filter(tenant=tenant)
    # Summed exactly here (SQLite's SUM is floating point).
    return -sum(entries.values_list("amount_usd", flat=True), Decimal(0))


def test_a_csv_export_sums_to_the_ledgers_charges_to_the_last_decimal(settled_month):
    start, _ = settled_month
    since, until = start + DAY, start + 2 * DAY
    rows = list(csv.DictReader(io.StringIO(export("--since", since.isoformat(), "--until", until.isoformat()))))
    assert 20 < len(rows) < 40
    exported = sum((Decimal(row["charge_usd"]) for row in rows), Decimal(0))
    assert exported == ledger_charges(since, until)
    assert exported.as_tuple().exponent <= -9  # the decimals really are used
    assert all(row["settled"] == "true" for row in rows)


def test_a_jsonl_export_per_tenant_sums_to_that_tenants_charges(settled_month):
    start, tenants = settled_month
    for tenant in tenants:
        lines = export("--format", "jsonl", "--tenant", tenant.name).splitlines()
        exported = sum((Decimal(json.loads(line)["charge_usd"]) for line in lines), Decimal(0))
        assert exported == ledger_charges(start, start + 3 * DAY, tenant)
        assert exported == Decimal("100") - tenant.__class__.objects.get(pk=tenant.pk).balance_usd


def test_free_requests_export_a_zero_charge(settled_month):
    lines = [json.loads(line) for line in export("--format", "jsonl").splitlines()]
    assert {row["charge_usd"] for row in lines if row["status"] in ("failed", "rejected")} == {"0.00"}


# Constant memory


def bulk_logs(count: int, start: dt.datetime, tenant, key, channel) -> None:
    """``count`` logs, one a second from ``start``, inserted in bulk from
    prepared values (COPY on PostgreSQL, multi-row INSERTs on SQLite): building
    200,000 model instances for bulk_create would take most of a minute."""
    template = RequestLog(
        request_id="", created_at=start, tenant=tenant, api_key=key, model="gpt-bulk", channel=channel,
        protocol="chat", status="completed", charge_usd=Decimal("0.0000012345"),
    )
    fields = [f for f in RequestLog._meta.concrete_fields if not f.primary_key]
    fixed = [f.get_db_prep_save(getattr(template, f.attname), connection) for f in fields]
    at = {f.attname: i for i, f in enumerate(fields)}
    created_at = RequestLog._meta.get_field("created_at")
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    table = RequestLog._meta.db_table

    def rows():
        for n in range(count):
            row = list(fixed)
            row[at["request_id"]] = f"req-bulk-{n:07d}"
            row[at["created_at"]] = created_at.get_db_prep_save(start + dt.timedelta(seconds=n), connection)
            row[at["input_tokens"]] = n
            yield row

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows():
                    copy.write_row(row)
            return
        per_statement = 1000  # x 26 columns: under SQLite's parameter limit
        one_row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        pending: list[list[object]] = []
        for row in itertools.chain(rows(), [None]):
            if row is not None:
                pending.append(row)
            if pending and (row is None or len(pending) == per_statement):
                params = [value for values in pending for value in values]
                cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {', '.join([one_row] * len(pending))}", params)
                pending = []


def peak_bytes_exporting(logs) -> tuple[int, int]:
    """Peak traced memory while streaming the export, and the rows seen."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        lines = 0
        for _line in csv_lines(export_rows(logs)):
            lines += 1
        return tracemalloc.get_traced_memory()[1] - base, lines - 1
    finally:
        tracemalloc.stop()


def test_streaming_200000_rows_takes_no_more_memory_than_20000():
    tenant = make_tenant("bulk")
    key, _ = make_key(tenant)
    channel = make_channel("bulk-up")
    start = timezone.now() - dt.timedelta(days=5)
    bulk_logs(200_000, start, tenant, key, channel)
    small, small_rows = peak_bytes_exporting(export_queryset(until=start + dt.timedelta(seconds=20_000)))
    large, large_rows = peak_bytes_exporting(export_queryset())
    assert (small_rows, large_rows) == (20_000, 200_000)
    assert large <= 1.3 * small, f"20,000 rows peaked at {small} bytes, 200,000 at {large}"


# Async streaming for ASGI


def test_the_async_stream_carries_the_same_lines_and_closes_the_export():
    tenant = make_tenant("streamed")
    for _ in range(7):
        make_log(tenant, charge_usd=Decimal("0.5"))

    async def collect(per_piece: int) -> bytes:
        return b"".join([piece async for piece in streamed(csv_lines(export_rows(export_queryset())), per_piece)])

    expected = "".join(csv_lines(export_rows(export_queryset()))).encode()
    assert async_to_sync(collect)(3) == async_to_sync(collect)(500) == expected

    closed = []

    def lines():
        try:
            yield from ["a\n", "b\n", "c\n"]
        finally:
            closed.append(True)

    async def first_piece() -> bytes:
        pieces = streamed(lines(), 1)
        piece = await pieces.__anext__()
        await pieces.aclose()  # the client went away
        return piece

    assert async_to_sync(first_piece)() == b"a\n" and closed == [True]


# The admin request-log list: export what it shows, stay fast


@pytest.fixture
def shown():
    acme, globex = make_tenant("acme"), make_tenant("globex")
    key, _ = make_key(acme)
    make_price("gpt-a")
    make_price("gpt-b")
    up = make_channel("up-a")
    logs = {
        "a-done": make_log(acme, key, request_id="a-done", model="gpt-a", channel=up, charge_usd=Decimal("0.25"),
                           settled_at=timezone.now()),
        "a-failed": make_log(acme, key, request_id="a-failed", model="gpt-a", status="failed"),
        "a-other-model": make_log(acme, key, request_id="a-other-model", model="gpt-b", protocol="messages"),
        "g-done": make_log(globex, request_id="g-done", model="gpt-a"),
    }
    return acme, globex, up, logs


def download(admin_client, fmt: str, **params) -> tuple[object, str]:
    response = admin_client.get(reverse("admin:billing_requestlog_export", args=[fmt]), params)
    assert response.status_code == 200
    assert response.streaming and response.is_async  # streamed under ASGI, not read whole
    with warnings.catch_warnings():
        # The sync test client consumes the async iterator; Daphne streams it.
        warnings.simplefilter("ignore")
        body = b"".join(response).decode()
    return response, body


def request_ids(fmt: str, body: str) -> list[str]:
    if fmt == "csv":
        rows = list(csv.reader(io.StringIO(body)))
        assert tuple(rows[0]) == COLUMNS
        return [row[0] for row in rows[1:]]
    return [json.loads(line)["request_id"] for line in body.splitlines()]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_list_exports_the_filtered_rows(admin_client, shown, fmt):
    acme, _globex, up, _logs = shown
    response, body = download(admin_client, fmt, tenant__id__exact=acme.pk)
    assert sorted(request_ids(fmt, body)) == ["a-done", "a-failed", "a-other-model"]
    assert response["Content-Disposition"].startswith("attachment;") and f'.{fmt}"' in response["Content-Disposition"]
    assert request_ids(fmt, download(admin_client, fmt, status__exact="failed")[1]) == ["a-failed"]
    assert request_ids(fmt, download(admin_client, fmt, model="gpt-b")[1]) == ["a-other-model"]
    assert request_ids(fmt, download(admin_client, fmt, channel__id__exact=up.pk)[1]) == ["a-done"]
    assert request_ids(fmt, download(admin_client, fmt, q="g-done")[1]) == ["g-done"]
    assert request_ids(fmt, download(admin_client, fmt, settled="yes")[1]) == ["a-done"]
    assert len(request_ids(fmt, download(admin_client, fmt)[1])) == 4


def test_the_list_offers_export_buttons_with_its_filters(admin_client, shown):
    acme, *_ = shown
    page = admin_client.get(reverse("admin:billing_requestlog_changelist"), {"tenant__id__exact": acme.pk})
    html = page.content.decode()
    for fmt in ("csv", "jsonl"):
        assert f'{reverse("admin:billing_requestlog_export", args=[fmt])}?tenant__id__exact={acme.pk}' in html
    assert "0.25" in html  # the charge column


def test_the_selected_rows_export_as_an_action(admin_client, shown):
    *_, logs = shown
    url = reverse("admin:billing_requestlog_changelist")
    response = admin_client.post(url, {"action": "export_selected_jsonl", "_selected_action": [logs["g-done"].pk]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        body = b"".join(response).decode()
    assert request_ids("jsonl", body) == ["g-done"]


def test_an_unknown_format_or_filter_is_refused(admin_client, shown):
    assert admin_client.get(reverse("admin:billing_requestlog_export", args=["xml"])).status_code == 404
    url = reverse("admin:billing_requestlog_export", args=["csv"])
    assert admin_client.get(url, {"no_such_field": "1"}).status_code == 400


def test_anonymous_visitors_cannot_export(client, shown):
    response = client.get(reverse("admin:billing_requestlog_export", args=["csv"]))
    assert response.status_code == 302 and "/login/" in response["Location"]


def list_queries(admin_client, **params) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse("admin:billing_requestlog_changelist"), params)
        assert response.status_code == 200
    return len(queries)


def test_the_list_costs_the_same_queries_for_5_or_60_rows_whatever_the_filter(admin_client):
    tenants = [make_tenant(unique("list")) for _ in range(3)]
    channels = [make_channel(unique("list-up")) for _ in range(3)]
    make_price("gpt-list")

    def add(count: int) -> None:
        for n in range(count):
            key, _ = make_key(tenants[n % 3])
            make_log(tenants[n % 3], key, model="gpt-list", channel=channels[n % 3],
                     charge_usd=Decimal("0.1"), settled_at=timezone.now())

    views = {"all": {}, "tenant": {"tenant__id__exact": tenants[0].pk}, "status": {"status__exact": "completed"}}
    add(5)
    few = {name: list_queries(admin_client, **params) for name, params in views.items()}
    add(55)
    many = {name: list_queries(admin_client, **params) for name, params in views.items()}
    assert few == many
    assert max(many.values()) <= 12


def test_csv_cells_that_a_spreadsheet_would_run_as_formulas_are_defused():
    row = {column: "" for column in COLUMNS}
    row.update(model="=HYPERLINK(\"http://x\")", tenant="acme", channel="-1+1", stream=False, usage_estimated=False, settled=False)
    header, line = list(csv_lines([row]))
    values = dict(zip(COLUMNS, next(csv.reader([line]))))
    assert values["model"] == "'=HYPERLINK(\"http://x\")"
    assert values["channel"] == "'-1+1"
    assert values["tenant"] == "acme"
