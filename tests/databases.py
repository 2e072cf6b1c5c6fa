"""Scratch PostgreSQL databases on the test server, for the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg

PG_ADMIN_URL = os.environ.get("MOMENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def scratch_postgres(admin_url: str = PG_ADMIN_URL, prefix: str = "momentry") -> Iterator[str]:
    """The URL of a fresh, empty database; dropped afterwards."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    _admin(admin_url, f'CREATE DATABASE "{name}"')
    try:
        yield _url(admin_url, name)
    finally:
        _drop(admin_url, name)


# Databases at the current schema that a finished test left empty, for this process's next
# test: creating, migrating and dropping one per test cost the server about 0.7 CPU seconds.
_EMPTIED: list[str] = []
_PRISTINE: dict[str, str] = {}  # the schema's fingerprint, as migrating a new database left it


@contextlib.contextmanager
def queue_postgres(admin_url: str = PG_ADMIN_URL) -> Iterator[str]:
    """The URL of a database holding the queue's schema (as the service's first start leaves
    it) and no rows. After the test it is emptied for the next one (its sessions ended, its
    rows deleted, its ids counting from 1 again), or dropped if the test changed its schema."""
    url = _EMPTIED.pop() if _EMPTIED else _migrated(admin_url)
    try:
        yield url
    finally:
        if _emptied(url):
            _EMPTIED.append(url)
        else:
            _drop(admin_url, url.rsplit("/", 1)[1])


def drop_emptied(admin_url: str = PG_ADMIN_URL) -> None:
    """Drop the databases kept for later tests (at the end of the run)."""
    while _EMPTIED:
        _admin(
            admin_url, f'DROP DATABASE IF EXISTS "{_EMPTIED.pop().rsplit("/", 1)[1]}" WITH (FORCE)'
        )


def _migrated(admin_url: str) -> str:
    from momentry_edge import store

    name = f"momentry_{secrets.token_hex(4)}"
    _admin(admin_url, f'CREATE DATABASE "{name}"')
    url = _url(admin_url, name)
    try:
        db = store.open_database(url, Path("."))
        with db.bind_ctx((*store.MODELS, store.SchemaVersion)):  # the test's bindings kept
            store.migrate(db)
        db.close()
        if not _PRISTINE:
            with psycopg.connect(url, autocommit=True) as conn:
                _PRISTINE["schema"] = _fingerprint(conn)
    except BaseException:
        _drop(admin_url, name)
        raise
    return url


def _emptied(url: str) -> bool:
    """Empty the database for the next test; False where its schema is not the pristine one."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        if _fingerprint(conn) != _PRISTINE.get("schema"):
            return False
        tables = _tables(conn)
        tables.remove("schema_version")
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
    return True


def _fingerprint(conn: psycopg.Connection) -> str:
    """The public schema's tables, columns, indexes, triggers and functions, and the schema
    versions recorded: what a test may have changed beyond its rows."""
    row = conn.execute(
        """
        SELECT
          (SELECT string_agg(c.relname || ':' || c.relkind::text || ':' || coalesce((
              SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                  || CASE WHEN a.attnotnull THEN '!' ELSE '' END, ',' ORDER BY a.attname)
              FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            ), ''), ';' ORDER BY c.relname)
           FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace),
          (SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger t
           JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'public'::regnamespace
             AND NOT t.tgisinternal),
          (SELECT string_agg(proname, ',' ORDER BY proname) FROM pg_proc
           WHERE pronamespace = 'public'::regnamespace),
          (SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace),
          (SELECT string_agg(version::text, ',' ORDER BY version) FROM schema_version)
        """
    ).fetchone()
    return repr(row)


def _tables(conn: psycopg.Connection) -> list[str]:
    """The quoted names of the public schema's tables."""
    query = "SELECT format('%I', relname) FROM pg_class"
    query += " WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')"
    return [name for (name,) in conn.execute(query)]


def _drop(admin_url: str, name: str) -> None:
    _admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin(admin_url: str, sql: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql)


def _url(admin_url: str, name: str) -> str:
    return admin_url.rsplit("/", 1)[0] + f"/{name}"
