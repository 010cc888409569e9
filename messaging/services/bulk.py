"""Writing many rows of one table in one statement, with little work per row.

`bulk_create` prepares every field of every object through the ORM (pre_save, get_db_prep_save)
and psycopg then quotes each value of the statement in Python; for a batch send that costs more
than the database's own work. `bulk_insert` takes rows whose values are already what the columns
hold and, on PostgreSQL, sends them as one JSON document that the database turns back into rows of
the table's own type (`json_populate_recordset`): one `orjson.dumps` on this side (it writes UUIDs
and datetimes itself; the standard library calls back into Python for each), one parameter to
quote. Other databases (SQLite: the embedded hub and the fast test suite) get a plain
`INSERT ... VALUES` of the values each field prepares for the column, as `bulk_create`'s compiler
does, without building and then taking apart a model instance per row.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, TypeVar

import orjson
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Model, signals
from django.db.models.base import ModelState

M = TypeVar("M", bound=Model)


def bulk_insert(*, model: type[Model], rows: list[dict[str, Any]], returning: str | None = None) -> list[Any]:
    """Insert `rows` (each: field attname → the value to store; every row names the same fields,
    defaults and auto_now are not applied) with one statement. Returns the `returning` column of
    each row, in order, when asked (as `bulk_create` does, it relies on PostgreSQL returning the
    rows of `INSERT ... SELECT` in the order they were given)."""
    if not rows:
        return []
    if connection.vendor != "postgresql":
        return _insert_values(model, rows, returning)
    sql, document = insert_from_json(model, rows)
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        if returning is None:
            cursor.execute(sql, [document])
            return []
        cursor.execute(f"{sql} RETURNING {qn(returning)}", [document])
        return [row[0] for row in cursor.fetchall()]


def _insert_values(model: type[Model], rows: list[dict[str, Any]], returning: str | None) -> list[Any]:
    """`bulk_insert` on other databases: `INSERT ... VALUES`, in as few statements as the database's
    parameter limit allows, each value prepared by its field (`get_db_prep_save`). Like
    `bulk_create`, it relies on `RETURNING` giving the rows in the order they were written."""
    qn = connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if f.attname in rows[0]]
    head = f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) VALUES "
    one_row = f"({', '.join(['%s'] * len(fields))})"
    tail = f" RETURNING {qn(model._meta.get_field(returning).column)}" if returning else ""
    per_statement = max(1, connection.ops.bulk_batch_size(fields, rows))
    db = _this_threads_connection()
    given: list[Any] = []
    with db.cursor() as cursor:
        for start in range(0, len(rows), per_statement):
            chunk = rows[start : start + per_statement]
            params = [f.get_db_prep_save(row[f.attname], db) for row in chunk for f in fields]
            cursor.execute(head + ", ".join([one_row] * len(chunk)) + tail, params)
            if returning:
                given.extend(row[0] for row in cursor.fetchall())
    return given


def insert_from_json(
    model: type[Model], rows: list[dict[str, Any]], *, values: dict[str, str] | None = None, join: str = ""
) -> tuple[str, str]:
    """PostgreSQL: the `INSERT ... SELECT` of `rows` (as `bulk_insert` takes them) from one JSON
    document, and that document (the statement's one parameter). The rows are read as `r`;
    `values` gives an SQL expression for a column instead of its JSON value (it may use `r` and
    what `join` adds), so the statement can sit in a WITH that writes several tables at once."""
    qn = connection.ops.quote_name
    fields = [f for f in model._meta.concrete_fields if f.attname in rows[0]]
    table = qn(model._meta.db_table)
    columns = ", ".join(qn(f.column) for f in fields)
    chosen = values or {}
    selected = ", ".join(chosen.get(f.column, f"r.{qn(f.column)}") for f in fields)
    # The JSON keys are the column names; UUIDs and datetimes travel as text (RFC 3339), which
    # PostgreSQL reads back as the column's type.
    if all(f.attname == f.column for f in fields):  # a key json_populate_recordset does not know is ignored
        document = json_text(rows)
    else:
        document = json_text([{f.column: row[f.attname] for f in fields} for row in rows])
    rows_read = f"json_populate_recordset(NULL::{table}, %s::json)"
    # A join may reorder the rows: keep the document's order then (ids are given in that order).
    source = f"{rows_read} WITH ORDINALITY AS r {join} ORDER BY r.ordinality" if join else f"{rows_read} AS r"
    return (
        f"INSERT INTO {table} ({columns}) SELECT {selected} FROM {source}",
        document,
    )


def json_text(value: Any) -> str:
    """`value` as JSON text for a `::json` parameter; values JSON has no type for go as `str()`."""
    return orjson.dumps(value, default=str).decode()


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
    obj = _built(model, row)
    for name, other in related.items():
        obj._state.fields_cache[name] = other
    return obj


def models_selected(model: type[M], sql: str, params: list[Any]) -> list[M]:
    """The instances of rows read by `sql`, a SELECT of all of `model`'s concrete columns in field
    order (as a compiled `model.objects.filter(...)` is). For the few queries every request runs
    with SQL compiled once: `Manager.raw` works out the column order from the cursor and the
    field converters again on every call, which cost more than the query."""
    return [row[0] for row in joined_models_selected((model,), sql, params)]


def joined_models_selected(models: tuple[type[Model], ...], sql: str, params: list[Any]) -> list[list[Any]]:
    """`models_selected` for a join: `sql` selects each model's concrete columns in field order
    (`select_columns`), one model after another, then any plain columns. Per row: an instance of
    each model (None where an outer join found no row: its primary key came back NULL), then the
    plain values as read."""
    layout = _layout(models)
    db = _this_threads_connection()
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out = []
    for row in rows:
        values: list[Any] = []
        start = 0
        for model, width, pk_index in layout:
            part = list(row[start : start + width])
            values.append(None if part[pk_index] is None else _instance(model, part, db))
            start += width
        out.append(values + list(row[start:]))
    return out


@functools.cache
def _layout(models: tuple[type[Model], ...]) -> tuple[tuple[type[Model], int, int], ...]:
    """Per model of a joined SELECT: the model, how many columns it has, where its primary key is."""
    return tuple(
        (model, len(model._meta.concrete_fields), model._meta.concrete_fields.index(model._meta.pk))
        for model in models
    )


def as_uuid(value: object) -> uuid.UUID | None:
    """A UUID column's value read with plain SQL (SQLite keeps UUIDs as 32 hex digits)."""
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(str(value))


def select_columns(model: type[Model], alias: str) -> str:
    """`alias.column, ...` for every concrete column of `model`, in field order."""
    qn = connection.ops.quote_name
    return ", ".join(f"{alias}.{qn(f.column)}" for f in model._meta.concrete_fields)


def _instance(model: type[M], values: list[Any], db: Any) -> M:
    for index, column, steps in _read_converters(model, db.vendor):
        value = values[index]
        for step in steps:
            value = step(value, column, db)
        values[index] = value
    return _built(model, values)


def _built(model: type[M], values: list[Any]) -> M:
    """What `model.from_db(alias, None, values)` returns (every concrete field's value, in field
    order), without `Model.__init__`: its signals, and a `setattr` through each field's descriptor,
    cost more than the rest of building a row. With nothing listening to `pre_init` / `post_init`
    (Django connects them only for ImageField and the like) the instance is the same."""
    if signals.pre_init.receivers or signals.post_init.receivers:
        return model.from_db(connection.alias, None, values)
    obj = model.__new__(model)
    state = obj._state = ModelState()
    state.adding, state.db = False, connection.alias
    obj.__dict__.update(zip(model_columns(model), values, strict=True))
    return obj


def _this_threads_connection() -> Any:
    """The connection `django.db.connection` stands for in this thread, for loops that hand it to
    a field once per value (the proxy looks the connection up again on every attribute read)."""
    return connections[DEFAULT_DB_ALIAS]


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
