"""Inserting many new rows of one model with one statement run for them all
(-> recorder, ledger): what a row per request costs on the way to the
ledger.

``bulk_create`` compiles every value of every row through several layers of
the ORM, about 0.3 ms a row. Here each value is converted as its field would
convert it, the cheapest way that gives the same result: text and foreign
keys go to the driver as they are, an integer column gets ``int(value)``
(whatever a provider sent as a count), and the rest (dates, amounts,
booleans) the field's own ``get_db_prep_save``. The rows' ids are not read
back."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper

# Passed as they are: the field's conversion would only hand back the same value.
AS_IS = (models.CharField, models.TextField, models.ForeignKey)


def _as_int(value: Any) -> int | None:
    return value if value is None else int(value)


def _conversion(field: models.Field, connection: BaseDatabaseWrapper) -> Callable[[Any], Any] | None:
    if isinstance(field, AS_IS):
        return None
    if isinstance(field, models.IntegerField):
        # IntegerField.get_prep_value's int(), without the layers around it
        # (each backend's adapt_integerfield_value hands the int back).
        return _as_int
    return functools.partial(field.get_db_prep_save, connection=connection)


def insert_rows(rows: Sequence[models.Model], skip_existing: str | None = None, using: str = DEFAULT_DB_ALIAS) -> None:
    """Insert ``rows`` (new instances of one model). With ``skip_existing``,
    the name of a unique field, a row whose value there is stored already is
    left out; any other constraint a row breaks raises ``IntegrityError``."""
    if not rows:
        return
    meta = rows[0]._meta
    connection = connections[using]
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    values = [(field.attname, _conversion(field, connection)) for field in fields]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if skip_existing is not None:
        sql += f" ON CONFLICT ({quote(meta.get_field(skip_existing).column)}) DO NOTHING"
    params = [
        [getattr(row, name) if convert is None else convert(getattr(row, name)) for name, convert in values]
        for row in rows
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)
