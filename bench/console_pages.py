#!/usr/bin/env python
"""The tenant console's pages under a million request logs (issue 29, Speed).

Usage (from the project folder, with the project's virtualenv)::

    .venv/bin/python bench/console_pages.py [--database-url URL] [--rows N] [--renders N]
                                            [--explain-over MS] [--keep]

Self-contained: by default it makes a fresh PostgreSQL database,
``hopbase_bench_console`` on ``postgres://postgres@127.0.0.1:5432`` (dropped
first if a killed run left it), and drops it at the end. ``--database-url
URL`` uses that (empty) database instead and leaves it; ``--database-url
sqlite`` a fresh SQLite file in a temporary folder. ``--keep`` keeps the
database. Settings are the gateway's defaults (bench.processes.gateway_env:
no Redis, warnings only).

It migrates, loads ``--rows`` request logs (default 1,000,000) of one
tenant over 45 days with their ledger (bench/console_rows.py: several keys
and models, a second tenant beside), then renders each page ``--renders``
times (default 20, after one warm-up) through Django's test client signed
in as the tenant's owner: the full middleware stack, the session and the
templates, and a database connection made afresh for each render (the
default ``CONN_MAX_AGE`` of 0, as the gateway serves the console), but no
HTTP server. For each page: the query count of one render (the session,
the user and the membership included) and the p50 and p95 of the renders'
wall times. A page whose p50 is over ``--explain-over``
(default 200 ms) has its queries over a tenth of that shown with
``EXPLAIN (ANALYZE, BUFFERS)`` (``EXPLAIN QUERY PLAN`` on SQLite).

The pages: the overview; the logs' first page, a deep keyset page (90 % of
the way back), filtered by a common and by a rare key, a common and a rare
model, a model none of the rows has, a rare status, one day, and a request
id; the statement's first page and a deep one; and the statement CSV of one
day (read to its end). Takes a few minutes, most of it the load.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

if __package__ in (None, ""):  # run as a script, python bench/console_pages.py: the project folder, for the bench package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from asgiref.sync import async_to_sync

from bench.processes import gateway_env
from bench.report import percentile

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/hopbase_bench_console"
PASSWORD = "bench console owner 29 password"
HEAVY_RENDERS = 3  # a download of most of the rows: a few renders tell enough


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="an empty database to use, or 'sqlite'")
    parser.add_argument("--rows", type=int, default=1_000_000, help="request logs of the bench tenant")
    parser.add_argument("--renders", type=int, default=20, help="timed renders of each page")
    parser.add_argument("--explain-over", type=float, default=200.0, metavar="MS", help="explain pages slower (p50)")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    return parser.parse_args()


@contextlib.contextmanager
def fresh_database(args: argparse.Namespace) -> Iterator[str]:
    """The database URL of the run, made and afterwards removed as --database-url says."""
    if args.database_url not in (None, "sqlite"):
        yield args.database_url
        return
    if args.database_url == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="hopbase-bench-console-"))
        try:
            yield f"sqlite:///{folder / 'bench.sqlite3'}"
        finally:
            if args.keep:
                print(f"kept {folder}")
            else:
                shutil.rmtree(folder, ignore_errors=True)
        return
    parts = urlsplit(DEFAULT_URL)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield DEFAULT_URL
    finally:
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"kept {DEFAULT_URL}")
        else:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def pages(loaded, deep_log: str, deep_entry: str) -> list[tuple[str, str, int | None]]:
    """(name, path, renders when fewer than --renders) of each page timed."""
    today = dt.datetime.now(dt.UTC).date()
    day = {"since": (today - dt.timedelta(days=20)).isoformat(), "until": (today - dt.timedelta(days=19)).isoformat()}
    keys = loaded.keys
    logs = [
        ("first page", {}),
        ("deep keyset page (90 %)", {"before": deep_log}),
        ("key: production (55 %)", {"key": keys["production"].pk}),
        ("key: legacy (0.5 %)", {"key": keys["legacy"].pk}),
        ("model: gpt-4o-mini (46 %)", {"model": "gpt-4o-mini"}),
        ("model: o3 (0.5 %)", {"model": "o3"}),
        ("model: none has it", {"model": "no-such-model"}),
        ("status: interrupted (0.2 %)", {"status": "interrupted"}),
        ("one day", day),
        ("request id", {"request_id": loaded.request_id}),
    ]
    return [
        ("overview", "/console/", None),
        *((f"logs, {name}", "/console/logs/" + (f"?{urlencode(query)}" if query else ""), None)
          for name, query in logs),
        ("statement, first page", "/console/statement/", None),
        ("statement, deep page", f"/console/statement/?{urlencode({'before': deep_entry})}", None),
        ("statement CSV, one day", f"/console/statement.csv?{urlencode(day)}", None),
        ("statement CSV, last 30 days",
         f"/console/statement.csv?{urlencode({'since': (today - dt.timedelta(days=29)).isoformat()})}", HEAVY_RENDERS),
        ("statement CSV, whole (the page's button, no dates)", "/console/statement.csv?since=&until=", HEAVY_RENDERS),
    ]


def render(client, path: str) -> int:
    """One render, its body read to the end (a streamed CSV too); its size."""
    response = client.get(path)
    assert response.status_code == 200, f"{path}: {response.status_code}"
    if not response.streaming:
        return len(response.content)

    async def read() -> bytes:  # the CSV streams an async iterator (billing.exports.streamed)
        return b"".join([part async for part in response.streaming_content])

    return len(async_to_sync(read)())


@contextlib.contextmanager
def recorded() -> Iterator[list[dict]]:
    """The queries run meanwhile, each with its SQL as sent and its time (a
    wrapper on the connection, which the test client closes after each
    request: CONN_MAX_AGE is 0, so every render connects afresh, as the
    gateway's console pages do)."""
    from django.db import connection

    queries: list[dict] = []

    def wrapper(execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            sent = connection.ops.last_executed_query(context["cursor"], sql, params)
            queries.append({"sql": sent, "time": time.perf_counter() - began})

    with connection.execute_wrapper(wrapper):
        yield queries


def explain(queries: list[dict], over_ms: float) -> str:
    from django.db import connection

    lines = []
    for query in queries:
        if float(query["time"]) * 1000 < over_ms:
            continue
        sql = query["sql"]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
            else:
                cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = "\n".join("    " + " | ".join(str(v) for v in row) for row in cursor.fetchall())
        lines.append(f"  {float(query['time']) * 1000:.0f} ms: {sql}\n{plan}")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    with fresh_database(args) as url:
        os.environ.update(gateway_env(url))
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        from bench.console_rows import analyze, load
        from billing.models import LedgerEntry, RequestLog
        from console.filters import cursor_text
        from console.members import add_member

        started = time.monotonic()
        call_command("migrate", verbosity=0)
        migrated = time.monotonic()
        loaded = load(args.rows, dt.datetime.now(dt.UTC))
        analyze()
        done = time.monotonic()
        version = connection.pg_version if connection.vendor == "postgresql" else connection.Database.sqlite_version
        print(f"database: {connection.vendor} {version} ({url.rsplit('@', 1)[-1]}); {platform.node()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
        print(f"rows: {loaded.logs:,} request logs of the bench tenant, {loaded.other_logs:,} of another, "
              f"{loaded.entries:,} ledger entries; migrate {migrated - started:.0f} s, "
              f"load and analyze {done - migrated:.0f} s")

        mine = RequestLog.objects.filter(tenant=loaded.tenant).order_by("-created_at", "-id")
        deep = mine.values("created_at", "id")[int(loaded.logs * 0.9)]
        entries = LedgerEntry.objects.filter(tenant=loaded.tenant).order_by("-created_at", "-id")
        deep_entry = entries.values("created_at", "id")[int(loaded.entries * 0.8)]
        owner = add_member(loaded.tenant, "owner@bench.example", "owner", PASSWORD)
        client = Client(HTTP_HOST="localhost")
        client.force_login(owner.user)

        print(f"\n{args.renders} renders each, after one warm-up (Django's test client, templates included)\n")
        print("| page | queries | p50 ms | p95 ms | bytes |")
        print("| --- | ---: | ---: | ---: | ---: |")
        slow = []
        for name, path, renders in pages(loaded, cursor_text(deep["created_at"], deep["id"]),
                                cursor_text(deep_entry["created_at"], deep_entry["id"])):
            with recorded() as queries:
                size = render(client, path)
            times = []
            for _ in range(min(renders or args.renders, args.renders)):
                began = time.perf_counter()
                render(client, path)
                times.append((time.perf_counter() - began) * 1000)
            p50, p95 = percentile(times, 0.5), percentile(times, 0.95)
            print(f"| {name} | {len(queries)} | {p50:.1f} | {p95:.1f} | {size:,} |")
            if p50 > args.explain_over:
                slow.append((name, path, p50, queries))
        for name, path, p50, queries in slow:
            print(f"\n{name} ({path}): p50 {p50:.0f} ms; its queries over {args.explain_over / 10:.0f} ms:")
            print(explain(queries, args.explain_over / 10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
