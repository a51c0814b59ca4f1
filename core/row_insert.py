"""Inserting many new rows of one model with one statement run for them all
(-> recorder, ledger): what a row per request costs on the way to the
ledger.

``bulk_create`` compiles every value of every row through several layers of
the ORM, about 0.3 ms a row; here only dates and amounts go through their
field's conversion for the backend, and every other value goes to the driver
as it is. The rows' ids are not read back."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import DEFAULT_DB_ALIAS, connections, models

CONVERTED = (models.DateTimeField, models.DecimalField)


def insert_rows(rows: Sequence[models.Model], skip_existing: str | None = None, using: str = DEFAULT_DB_ALIAS) -> None:
    """Insert ``rows`` (new instances of one model). With ``skip_existing``,
    the name of a unique field, a row whose value there is stored already is
    left out; any other constraint a row breaks raises ``IntegrityError``."""
    if not rows:
        return
    meta = rows[0]._meta
    connection = connections[using]
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    values = [(field.attname, field if isinstance(field, CONVERTED) else None) for field in fields]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if skip_existing is not None:
        sql += f" ON CONFLICT ({quote(meta.get_field(skip_existing).column)}) DO NOTHING"
    params = [
        [getattr(row, name) if field is None else field.get_db_prep_save(getattr(row, name), connection)
         for name, field in values]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
