"""What the benchmarks share: a scratch PostgreSQL database and an in-process service."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator

import psycopg

from momentry_edge import config as config_module
from momentry_edge.events import bus
from momentry_edge.service import Service

PG_ADMIN_URL = os.environ.get("MOMENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def scratch_postgres(
    admin_url: str = PG_ADMIN_URL, prefix: str = "momentry_bench"
) -> Iterator[str]:
    """A fresh, empty database for this run; dropped afterwards."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def running_service(cfg: config_module.Config) -> Iterator[Service]:
    """An in-process Service with its housekeeping loop in a thread, as `run` has it.

    The service logs at its configured level (info) to its log file as usual; its
    stderr handler goes to /dev/null so that the table stays readable. What a
    Service leaves behind in the process (log handlers, event-bus listeners) is
    removed afterwards, so that the next Service measured starts clean.
    """
    root = logging.getLogger()
    handlers, listeners = list(root.handlers), list(bus._listeners)
    with open(os.devnull, "w") as devnull:
        service = Service(cfg)
        with contextlib.redirect_stderr(devnull):
            service.start()
        loop = threading.Thread(target=service.run_forever, name="housekeeping", daemon=True)
        loop.start()
        try:
            yield service
        finally:
            service.stopping.set()
            loop.join()
            service.stop()
            bus._listeners[:] = listeners  # Service.start adds listeners; stop removes none
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:] = handlers
