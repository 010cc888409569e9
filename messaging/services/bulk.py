"""Writing many rows of one table in one statement, with little work per row.

`bulk_create` prepares every field of every object through the ORM (pre_save, get_db_prep_save)
and psycopg then quotes each value of the statement in Python; for a batch send that costs more
than the database's own work. `bulk_insert` takes rows whose values are already what the columns
hold and, on PostgreSQL, sends them as one JSON document that the database turns back into rows of
the table's own type (`json_populate_recordset`): one C-speed `json.dumps` on this side, one
parameter to quote. Other databases (SQLite: the embedded hub and the fast test suite) go through
`bulk_create`.
"""

from __future__ import annotations

import functools
import json
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


def bulk_insert(*, model: type[Model], rows: list[dict[str, Any]], returning: str | None = None) -> list[Any]:
    """Insert `rows` (each: field attname → the value to store; every row names the same fields,
    defaults and auto_now are not applied) with one statement. Returns the `returning` column of
    each row, in order, when asked (as `bulk_create` does, it relies on PostgreSQL returning the
    rows of `INSERT ... SELECT` in the order they were given)."""
    if not rows:
        return []
    if connection.vendor != "postgresql":
        created = model._default_manager.bulk_create([model(**row) for row in rows])
        return [getattr(obj, returning) for obj in created] if returning else []
    qn = connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if f.attname in rows[0]]
    table = qn(model._meta.db_table)
    columns = ", ".join(qn(f.column) for f in fields)
    # The JSON keys are the column names; UUIDs and datetimes travel as text, which PostgreSQL
    # reads back as the column's type.
    if all(f.attname == f.column for f in fields):  # a key json_populate_recordset does not know is ignored
        document = json.dumps(rows, default=str, ensure_ascii=False)
    else:
        document = json.dumps(
            [{f.column: row[f.attname] for f in fields} for row in rows], default=str, ensure_ascii=False
        )
    sql = f"INSERT INTO {table} ({columns}) SELECT {columns} FROM json_populate_recordset(NULL::{table}, %s::json)"
    with connection.cursor() as cursor:
        if returning is None:
            cursor.execute(sql, [document])
            return []
        cursor.execute(f"{sql} RETURNING {qn(returning)}", [document])
        return [row[0] for row in cursor.fetchall()]


@functools.cache
def model_columns(model: type[Model]) -> tuple[str, ...]:
    """The attnames of a model's concrete fields, in column order."""
    return tuple(f.attname for f in model._meta.concrete_fields)


def model_row(obj: Model, columns: tuple[str, ...]) -> dict[str, Any]:
    """An instance's values for `columns`, as `bulk_insert` takes them."""
    values = obj.__dict__
    return {name: values[name] for name in columns}


@functools.cache
def _fields_of(model: type[Model]) -> tuple[tuple[str, Any], ...]:
    return tuple((f.attname, f) for f in model._meta.concrete_fields)


def model_instance(model: type[M], values: dict[str, Any], **related: Model) -> M:
    """An instance of a row about to be written with `bulk_insert`, built the way the ORM builds
    one it read (`from_db`, without running each field's default and descriptor: a third of the
    cost), with its related objects cached. Fields not in `values` take their default."""
    row = [values[name] if name in values else f.get_default() for name, f in _fields_of(model)]
    obj = model.from_db(connection.alias, None, row)
    for name, other in related.items():
        obj._state.fields_cache[name] = other
    return obj


def models_selected(model: type[M], sql: str, params: list[Any]) -> list[M]:
    """The instances of rows read by `sql`, a SELECT of all of `model`'s concrete columns in field
    order (as a compiled `model.objects.filter(...)` is). For the few queries every request runs
    with SQL compiled once: `Manager.raw` works out the column order from the cursor and the
    field converters again on every call, which cost more than the query."""
    converters = _read_converters(model, connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    instances = []
    for row in rows:
        values = list(row)
        for index, column, steps in converters:
            value = values[index]
            for step in steps:
                value = step(value, column, connection)
            values[index] = value
        instances.append(model.from_db(connection.alias, None, values))
    return instances


@functools.cache
def _read_converters(model: type[Model], vendor: str) -> list[tuple[int, Any, list[Any]]]:
    """Per column: the backend's and the field's converters of a value read (vendor: the cache key)."""
    table = model._meta.db_table
    found = []
    for index, f in enumerate(model._meta.concrete_fields):
        column = f.get_col(table)
        steps = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        if steps:
            found.append((index, column, steps))
    return found
