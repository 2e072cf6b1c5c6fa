"""Hand-written statements for the queue's hot path; transactions as each database needs them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

import peewee as pw

from .schema import (
    Job,
)

# peewee builds every query anew and maps rows through its cursor wrappers: 0.1-0.8 ms
# of CPU a statement, far more than SQLite takes to run it. The statements each job
# runs through (claim, progress, finish) are written out instead; the rest use peewee.
_readings: dict[tuple[type[pw.Model], tuple[str, ...]], list[tuple[str, Any]]] = {}


def execute(sql: str, *params: Any) -> Any:
    """Run ``sql`` (``?`` placeholders, as on SQLite) on the models' database; its cursor."""
    database = Job._meta.database
    if database.param != "?":
        sql = sql.replace("?", database.param)
    return database.execute_sql(sql, params)


M = TypeVar("M", bound=pw.Model)


def fetch(model: type[M], sql: str, *params: Any) -> list[M]:
    """The rows ``sql`` returns (``SELECT *`` or ``RETURNING *`` of ``model``'s table) as
    model instances, as peewee would give them."""
    cursor = execute(sql, *params)
    plan = _reading(model, tuple(column[0] for column in cursor.description))
    found = []
    for row in cursor.fetchall():
        instance = model(__no_default__=True)
        instance.__data__ = {
            name: value if convert is None or value is None else convert(value)
            for (name, convert), value in zip(plan, row, strict=True)
        }
        found.append(instance)
    return found


# Fields whose values both databases return as peewee gives them (str, int, float):
# ``fetch`` takes them as they come instead of through python_value.

_AS_STORED = (
    pw.AutoField,
    pw.IntegerField,
    pw.BigIntegerField,
    pw.SmallIntegerField,
    pw.FloatField,
    pw.DoubleField,
    pw.CharField,
    pw.TextField,
)


def _reading(model: type[pw.Model], columns: tuple[str, ...]) -> list[tuple[str, Any]]:
    """(field name, converter or None) for each column of a result of ``model``'s table."""
    plan = _readings.get((model, columns))
    if plan is None:
        plan = []
        for column in columns:
            field = model._meta.columns[column]
            kind = type(field.rel_field if isinstance(field, pw.ForeignKeyField) else field)
            plan.append((field.name, None if kind in _AS_STORED else field.python_value))
        _readings[(model, columns)] = plan
    return plan


def insert(instance: Any) -> None:
    """INSERT ``instance`` (its defaults filled in, as peewee fills them) and set its id."""
    meta = instance._meta
    key = meta.primary_key
    fields = [meta.fields[name] for name in instance.__data__ if name != key.name]
    columns = ", ".join(field.column_name for field in fields)
    marks = ", ".join("?" * len(fields))
    values = [field.db_value(instance.__data__[field.name]) for field in fields]
    sql = f"INSERT INTO {meta.table_name} ({columns}) VALUES ({marks}) RETURNING {key.column_name}"
    (new_id,) = execute(sql, *values).fetchone()
    setattr(instance, key.name, new_id)
    instance._dirty.clear()


# Bound parameters per statement, under SQLite's limit (32766) and PostgreSQL's (65535).

_PARAMS_PER_STATEMENT = 30_000


def insert_many(instances: Sequence[Any], key: str | None = None) -> None:
    """INSERT ``instances`` of one model with an automatic id (their defaults filled in,
    as peewee fills them), as many rows a statement as the parameter limit allows. With
    ``key`` (a unique field's name), each instance's id is set from the statement's
    RETURNING, matched by that field (RETURNING's row order is not promised). Fields not
    given are stored and left as None, so the instances hold what reading the rows back
    would give."""
    if not instances:
        return
    meta: Any = instances[0]._meta
    primary = meta.primary_key
    fields = [field for field in meta.sorted_fields if field is not primary]
    database = meta.database
    into = f"INSERT INTO {meta.table_name} ({', '.join(f.column_name for f in fields)}) VALUES "
    returning = ""
    if key is not None:
        returning = f" RETURNING {primary.column_name}, {meta.fields[key].column_name}"
    for chunk in pw.chunked(instances, max(1, _PARAMS_PER_STATEMENT // len(fields))):
        values = []
        for instance in chunk:
            data = instance.__data__
            values += [field.db_value(data.setdefault(field.name, None)) for field in fields]
            instance._dirty.clear()
        rows = _value_rows(is_postgres(database), len(chunk), len(fields))
        returned = _run(database, into + rows + returning, values)
        if key is not None:
            ids = {found: new_id for new_id, found in returned}
            for instance in chunk:
                setattr(instance, primary.name, ids[instance.__data__[key]])


def _run(database: pw.Database, sql: str, values: list[Any]) -> list[tuple[Any, ...]]:
    """Run one statement of ``_value_rows``' placeholders; the rows it returns."""
    if not is_postgres(database):
        return database.execute_sql(sql, values).fetchall()
    # Numbered placeholders, passed on as they are: psycopg's own cursor would parse a
    # statement of thousands of %s (not cached past 4 KB), which took longer than the
    # insert. Its errors are peewee's, as execute_sql's are (store.OUTAGE_ERRORS).
    import psycopg  # the PostgreSQL driver: not loaded where SQLite is used

    wrapper = pw.__exception_wrapper__  # type: ignore[attr-defined]  # peewee's, not in its stubs
    with wrapper, psycopg.RawCursor(database.connection()) as cursor:
        cursor.execute(sql, values)
        return cursor.fetchall() if cursor.description else []


@functools.lru_cache(maxsize=32)
def _value_rows(postgres: bool, rows: int, columns: int) -> str:
    """``(?, ?), (?, ?)`` for SQLite; ``($1, $2), ($3, $4)`` for PostgreSQL."""
    if not postgres:
        return ", ".join(["(" + ", ".join(["?"] * columns) + ")"] * rows)
    return ", ".join(
        "(" + ", ".join(f"${n}" for n in range(start + 1, start + columns + 1)) + ")"
        for start in range(0, rows * columns, columns)
    )


def is_postgres(db: pw.Database) -> bool:
    return isinstance(db, pw.PostgresqlDatabase)


def write_transaction(db: pw.Database) -> Any:
    """A transaction that takes the write lock at once (SQLite BEGIN IMMEDIATE).

    Claims read then update; taking the lock up front keeps two claimers from
    both reading the same next job.
    """
    if isinstance(db, pw.SqliteDatabase):
        return db.atomic(lock_type="IMMEDIATE")
    return db.atomic()


def read_snapshot(db: pw.Database) -> Any:
    """A transaction whose reads all see one moment, so a view never shows a job twice."""
    if not is_postgres(db):
        return db.atomic()  # SQLite in WAL mode: a read transaction is a snapshot
    # One BEGIN statement with its mode: were the mode set by a second statement, a
    # connection cut between the two would leave the thread marked inside a transaction
    # that is never ended, its connection never given back to the pool (after enough
    # cuts, every request waited on an empty pool).
    return db.atomic(isolation_level="REPEATABLE READ READ ONLY")


def holds_cluster_lock(db: pw.Database, name: str) -> bool:
    """Inside a transaction: whether this node may do cluster-wide work ``name`` now.

    On PostgreSQL one node at a time gets it (a transaction-scoped advisory lock);
    SQLite serialises writers anyway, so there it is always granted.
    """
    if not is_postgres(db):
        return True
    key = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "big") & 0x7FFFFFFFFFFFFFFF
    return bool(db.execute_sql("SELECT pg_try_advisory_xact_lock(%s)", (key,)).fetchone()[0])


def rows(query: Any) -> list[tuple[Any, ...]]:
    """``query``'s rows as tuples (peewee's stubs type ``tuples()`` as rows of its model)."""
    return list(query.tuples())
