"""Connections: SQLite or PostgreSQL opened and migrated, released, retried after an outage."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlparse

import peewee as pw
from playhouse.pool import PooledPostgresqlDatabase

from .. import redact
from ..config import ConfigError
from .migrations import SchemaVersion, migrate
from .schema import (
    MODELS,
    Job,
    QueueState,
)

log = logging.getLogger(__name__)

# Seconds a PostgreSQL statement waits for the server's answer (service.database_timeout,
# as SQLite's writers wait for a lock); None: as long as it takes.
answer_timeout: float | None = 15.0


POOL_SIZE = 16  # PostgreSQL connections per service process


def connect(database_url: str, data_dir: Path, busy_timeout: float = 15.0) -> pw.Database:
    """Open the database, bind the models to it and bring its schema up to date."""
    global answer_timeout
    db = open_database(database_url, data_dir, busy_timeout)
    db.bind((*MODELS, SchemaVersion))
    # A migration may index a large table, or wait for another node's: not bounded.
    answer_timeout = None
    try:
        db.connect(reuse_if_open=True)
        migrate(db)
    finally:
        answer_timeout = busy_timeout
    return db


def open_database(database_url: str, data_dir: Path, busy_timeout: float = 15.0) -> pw.Database:
    global answer_timeout
    path = sqlite_file(database_url, data_dir)
    if path is None:
        answer_timeout = busy_timeout
        return postgres(database_url)
    if not database_url:
        data_dir.mkdir(parents=True, exist_ok=True)
    return sqlite(path, busy_timeout)


def sqlite_file(database_url: str, data_dir: Path) -> Path | None:
    """The SQLite file ``database_url`` names (empty: the data dir's), None for PostgreSQL;
    nothing is opened or made."""
    if not database_url:
        return data_dir / "momentry.db"
    try:
        url = urlparse(database_url)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL"; config.load refuses these first
        raise ConfigError(f"service.database_url: not a valid URL: {exc}") from None
    if url.scheme in ("postgres", "postgresql"):
        return None
    if url.scheme == "sqlite":
        path = Path(unquote(url.path))
        if not path.name:  # sqlite:// or sqlite:///: no file
            raise ConfigError("service.database_url: a sqlite URL names a file: sqlite:///path")
        return path
    raise ConfigError(f"service.database_url: unsupported scheme {url.scheme!r}")


# libpq settings the service gives a connection unless the URL sets them: connecting,
# and a connection whose server stops answering (host gone, network cut), fail in a
# bounded time instead of holding the threads that wait on it.

CONNECTION_DEFAULTS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",  # ms unacknowledged; Linux only, elsewhere ignored
}


def postgres(database_url: str) -> PooledPostgresqlDatabase:
    """A pool of connections to the PostgreSQL URL; every libpq parameter in its query
    (sslmode, application_name, ...) is honoured, an unknown one is a ConfigError."""
    import psycopg  # the PostgreSQL driver: not loaded where SQLite is used
    from psycopg.conninfo import conninfo_to_dict

    try:  # libpq's own parser: the URL means what it means to psql
        named = {"application_name": application_name()}
        params = CONNECTION_DEFAULTS | named | conninfo_to_dict(database_url)
    except psycopg.Error as exc:
        # libpq ends its messages with a newline.
        # Its message may quote a part of the URL (a bad %-escape in the password).
        problem = redact.scrub(str(exc).strip(), database_url)
        raise ConfigError(f"service.database_url: {problem}") from None
    # libpq parses the port only when it connects, and then says "connection is bad".
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"service.database_url: the port must be 1..65535, got {port!r}")
    dbname = params.pop("dbname", None) or "postgres"
    # Threads borrow connections from a bounded pool and give them back when idle
    # (release_connection), so a node holds a few connections, not one per thread.
    # Both names: peewee, imported without psycopg (imports.py), would take psycopg2's.
    adapter = _bounded_adapter()
    pool = type(
        "Pool",
        (PooledPostgresqlDatabase,),
        {"psycopg3_adapter": adapter, "psycopg2_adapter": adapter},
    )
    return pool(dbname, max_connections=POOL_SIZE, stale_timeout=300, timeout=30, **params)


def application_name(pid: int | None = None) -> str:
    """The name a node's sessions have on the server (pg_stat_activity), by which another
    process on this host tells whether that node uses this database (dbusers.py)."""
    name = f"momentry-edge {os.getpid() if pid is None else pid} {socket.gethostname()}"
    return name.encode()[:63].decode(errors="ignore")  # the server keeps 63 bytes


def _bounded_adapter() -> type:
    """peewee's psycopg adapter, its connections waiting at most ``answer_timeout`` for
    the server. A server or proxy that keeps the connection open but stops answering
    (TCP keepalives see nothing wrong) would otherwise hold the thread, and peewee's
    database-wide lock that connect and close take, for as long as it lasts."""
    import psycopg
    from psycopg.pq import TransactionStatus
    from psycopg.types.json import Json, Jsonb

    class Connection(psycopg.Connection):
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            try:
                return super().wait(gen, interval, answer_timeout if timeout is None else timeout)
            except psycopg.OperationalError:  # no answer in time (or the link broke)
                self.pgconn.finish()  # cut off mid-statement: not usable again
                raise

    class Adapter(pw.Psycopg3Adapter):
        # peewee was imported without the driver (imports.py): what it would take from it.
        txn_idle = TransactionStatus.IDLE
        txn_inerror = TransactionStatus.INERROR
        txn_unknown = TransactionStatus.UNKNOWN

        def __init__(self) -> None:
            super().__init__()
            self.json_type, self.jsonb_type = Json, Jsonb

        def check_driver(self) -> None:
            pass  # imported above

        def get_binary_type(self) -> Any:
            return psycopg.Binary

        def connect(self, db: pw.Database, **params: Any) -> Any:
            return Connection.connect(dbname=db.database, **params)

        def server_side_cursor(self, conn: Any) -> Any:
            in_txn = self.txn_status(conn) == TransactionStatus.INTRANS
            return conn.cursor(name=str(uuid.uuid1()), withhold=not in_txn)

    return Adapter


class SqliteFile(pw.SqliteDatabase):
    """peewee's SQLite database, whose rollback keeps the error that ended a transaction,
    and whose threads never open a file other than the one opened first.

    On some errors (a full disk, an I/O error) SQLite rolls the transaction back itself;
    peewee's ROLLBACK (or ROLLBACK TO a savepoint) then fails with "no transaction is
    active", and that error would replace the one that says what went wrong.

    Each thread has its connection, opened by path. Were the file deleted or replaced,
    those open keep the old file while new ones open (or make) the one now at the path:
    two databases at once. So a connection is refused once the path holds another file
    (``replaced`` says why); the service stops on it (service.py).
    """

    opened: tuple[int, int] | None = None  # (st_dev, st_ino) of the file first opened

    def _connect(self) -> Any:
        if problem := self.replaced():
            raise pw.OperationalError(problem)
        conn = super()._connect()  # type: ignore[misc]
        if self.opened is None:
            with contextlib.suppress(OSError):  # ":memory:", or no file to stat
                st = os.stat(self.database)
                self.opened = (st.st_dev, st.st_ino)
        return conn

    def replaced(self) -> str | None:
        """Why the file at the path is no longer the one first opened; None while it is."""
        if self.opened is None:
            return None
        try:
            st = os.stat(self.database)
        except FileNotFoundError:
            return f"the database file {self.database} was deleted"
        except OSError:
            return None  # cannot tell (e.g. a folder made unreadable): not known replaced
        if (st.st_dev, st.st_ino) != self.opened:
            return f"the database file {self.database} was replaced"
        return None

    def rollback(self) -> None:
        if self.is_closed() or self.connection().in_transaction:
            super().rollback()

    def savepoint(self) -> pw._savepoint:
        return _Savepoint(self)


class _Savepoint(pw._savepoint):
    def rollback(self, begin: bool = True) -> None:
        if self.db.connection().in_transaction:  # else SQLite has ended it (SqliteFile)
            super().rollback(begin)


def sqlite(path: Path, busy_timeout: float = 15.0) -> pw.SqliteDatabase:
    return SqliteFile(
        str(path),
        pragmas={
            "journal_mode": "wal",
            # FULL: a job the API acknowledged survives a power cut. On macOS only with
            # F_FULLFSYNC, as fsync there leaves the data in the drive's cache (see
            # durable.py); other systems ignore these two.
            "synchronous": "full",
            "fullfsync": 1,
            "checkpoint_fullfsync": 1,
            "foreign_keys": 1,
            # Writers wait for each other instead of failing with "database is locked".
            "busy_timeout": int(busy_timeout * 1000),
        },
        timeout=busy_timeout,
    )


def file_replaced() -> str | None:
    """Why the SQLite file at the database's path is not the one the service opened (see
    SqliteFile); None while it is, and on PostgreSQL."""
    database = Job._meta.database
    return database.replaced() if isinstance(database, SqliteFile) else None


def queue_id() -> str:
    """This queue database's identity (the settings row is made at start)."""
    return QueueState.get_by_id(1).queue_id


def release_connection() -> None:
    """Return this thread's PostgreSQL connection to the pool (SQLite keeps its own)."""
    database = Job._meta.database
    # Not when it holds none (a request that did not use the database): close() waits
    # for peewee's lock, which a thread connecting over a stalled link may hold.
    if (
        isinstance(database, PooledPostgresqlDatabase)
        and not database.is_closed()
        and not database.in_transaction()
    ):
        database.close()


def after_outage() -> None:
    """A statement failed with an outage: drop this thread's connection, and on PostgreSQL
    the pool's idle ones, which the same restart or cut has broken too (each would fail
    the next statement given it, one after another)."""
    release_connection()
    database = Job._meta.database
    if isinstance(database, PooledPostgresqlDatabase):
        database.close_idle()


def close_connection() -> None:
    """This thread ends: close its connection (a PostgreSQL one goes back to the pool)."""
    database = Job._meta.database
    if not database.in_transaction():
        database.close()


# A busy (SQLite "database is locked") or full database, or a connection that broke.

OUTAGE_ERRORS = (pw.OperationalError, pw.InterfaceError)


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the database's disk is full: SQLite's
    SQLITE_FULL, PostgreSQL's disk_full (53100) or ENOSPC."""
    seen = 0
    while exc is not None and seen < 10:  # the chain, bounded
        if getattr(exc, "sqlstate", None) == "53100" or getattr(exc, "errno", None) == 28:
            return True
        text = str(exc).lower()
        if "database or disk is full" in text or "no space left on device" in text:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


RETRY_DELAYS = (0.5, 1.0, 2.0)  # pauses between the tries of a state change


P = ParamSpec("P")


R = TypeVar("R")


def retried(action: Callable[P, R]) -> Callable[P, R]:
    """``action`` tried again after each of RETRY_DELAYS while the database is out.

    Each try already waits the busy timeout for a lock, so a lock or a dropped
    connection shorter than all of that is ridden out; a longer one raises. Inside
    an enclosing transaction a retry would not help, so there it raises at once.
    """

    @functools.wraps(action)
    def attempt(*args: P.args, **kwargs: P.kwargs) -> R:
        for delay in (*RETRY_DELAYS, None):
            try:
                return action(*args, **kwargs)
            except OUTAGE_ERRORS as exc:
                if delay is None or Job._meta.database.in_transaction():
                    raise
                log.warning("%s: %s; trying again in %g s", action.__name__, exc, delay)
                after_outage()  # the next try is on a fresh connection
                time.sleep(delay)
        raise AssertionError("unreachable")

    return attempt


def safe_url(url: str) -> str:
    """The database URL as it may be shown: its password (in the userinfo or the query)
    masked."""
    return redact.url(url)
