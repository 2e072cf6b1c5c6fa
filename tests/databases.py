"""Scratch PostgreSQL databases on the test server, for the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

import psycopg

PG_ADMIN_URL = os.environ.get("MOMENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def scratch_postgres(admin_url: str = PG_ADMIN_URL, prefix: str = "momentry") -> Iterator[str]:
    """The URL of a fresh, empty database; dropped afterwards."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
