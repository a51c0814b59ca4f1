"""exportbilling [--since ISO] [--until ISO] [--tenant NAME] [--format csv|jsonl] [-o FILE]

Streams billing rows (billing.exports) to stdout, or to FILE with ``-o``.
``--since`` is inclusive and ``--until`` exclusive; each takes an ISO 8601
date (midnight UTC) or datetime (UTC when it carries no offset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from django.core.management.base import CommandError
from django.db import transaction
from django.db.models import QuerySet

from billing.exports import ENCODERS, Row, export_queryset, export_rows
from billing.models import RequestLog
from core.commands import OperatorCommand, parse_moment
from tenants.commands import find_tenant

Encoder = Callable[[Iterable[Row]], Iterator[str]]


class Command(OperatorCommand):
    help = "Export billing rows (one per request log) as CSV or JSON Lines."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--since", metavar="ISO", help="From this moment on (inclusive)")
        parser.add_argument("--until", metavar="ISO", help="Before this moment (exclusive)")
        parser.add_argument("--tenant", metavar="NAME", help="Only this tenant's requests")
        parser.add_argument("--format", default="csv", help=f"One of {', '.join(ENCODERS)} (default csv)")
        parser.add_argument("-o", "--output", metavar="FILE", help="Write here instead of stdout")

    def handle(self, *args, **options) -> None:
        since = parse_moment(options["since"], "--since") if options["since"] else None
        until = parse_moment(options["until"], "--until") if options["until"] else None
        if since is not None and until is not None and since >= until:
            raise CommandError("--since must be earlier than --until")
        encoder = ENCODERS.get(options["format"].strip().lower())
        if encoder is None:
            raise CommandError(f"--format: {options['format']!r} is not one of {', '.join(ENCODERS)}")
        tenant = find_tenant(options["tenant"]) if options["tenant"] is not None else None

        # One read-only transaction: on PostgreSQL the rows then stream from a
        # plain server-side cursor, where outside a transaction the server
        # would build the whole result first (a WITH HOLD cursor).
        with transaction.atomic():
            self.export(encoder, export_queryset(since=since, until=until, tenant=tenant), options["output"])

    def export(self, encoder: Encoder, logs: QuerySet[RequestLog], output: str | None) -> None:
        lines = encoder(export_rows(logs))
        if not output:
            for line in lines:
                self.stdout.write(line, ending="")
            return
        count = -1 if encoder is ENCODERS["csv"] else 0  # the CSV header is not a row
        try:
            with open(output, "w", encoding="utf-8", newline="") as out:
                for line in lines:
                    out.write(line)
                    count += 1
        except OSError as error:
            raise CommandError(f"-o: cannot write {output!r}: {error.strerror}") from None
        self.stdout.write(f"wrote {count} rows to {output}")
