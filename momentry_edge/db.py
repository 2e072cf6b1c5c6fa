"""peewee models, the connection (SQLite file or PostgreSQL) and schema migrations.

The models are bound to the database ``connect`` opens; one service process
uses one database. Times are stored as Unix seconds (float) so that the same
arithmetic works on SQLite and PostgreSQL; the API renders them as ISO 8601.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote, urlparse

import peewee as pw
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_migrations
from playhouse.pool import PooledPostgresqlDatabase

from .config import ConfigError

log = logging.getLogger(__name__)


class JobStatus(enum.StrEnum):
    """A job's status; jobs.py is the only module that changes it."""

    PENDING = "pending"
    PROCESSING = "processing"
    RETRYING = "retrying"
    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_STATES = (JobStatus.COMPLETED, JobStatus.PARTIAL, JobStatus.FAILED, JobStatus.CANCELLED)
ACTIVE_STATES = (JobStatus.PENDING, JobStatus.PROCESSING, JobStatus.RETRYING)


class RunStatus(enum.StrEnum):
    """One processor run's status within its job."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"


RUN_DONE = (RunStatus.COMPLETED, RunStatus.SKIPPED)


class FileState(enum.StrEnum):
    """A registered file's state."""

    PRESENT = "present"
    MISSING = "missing"
    REJECTED = "rejected"


PRIORITIES = {"low": 0, "normal": 1, "high": 2}
POOL_SIZE = 16  # PostgreSQL connections per service process
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}


class NotJSON(ValueError):
    """A value strict JSON cannot carry: NaN or Infinity (strict parsers and PostgreSQL's
    json type refuse them), or one that is no JSON at all (a set, a cycle)."""


def to_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)``, but strict: NotJSON, saying
    why, for what JSON cannot carry."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, **options)
    except ValueError as exc:
        if str(exc).startswith("Out of range float"):
            raise NotJSON("it holds NaN or Infinity, which JSON cannot carry") from None
        raise NotJSON(str(exc)) from None  # a circular reference
    except TypeError as exc:  # e.g. "Object of type set is not JSON serializable"
        raise NotJSON(str(exc)) from None
    except RecursionError:
        raise NotJSON("it is nested too deep to be written") from None
    return utf8(text)


def utf8(text: str) -> str:
    """``text``, or NotJSON if UTF-8 cannot carry it (a lone surrogate such as '\\udc80':
    neither a file nor the database could store the text)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise NotJSON(f"it holds {bad!a}, which UTF-8 cannot carry") from None
    return text


class JSONField(pw.TextField):
    def db_value(self, value: Any) -> str | None:
        return None if value is None else to_json(value)

    def python_value(self, value: str | None) -> Any:
        return None if value is None else json.loads(value)


class BaseModel(pw.Model):
    class Meta:
        legacy_table_names = False


class QueueState(BaseModel):
    """One row: the operator's settings that must survive restarts. On a shared
    PostgreSQL queue the concurrency settings are each node's own (Node.own_*): only
    the pause is the queue's."""

    id = pw.IntegerField(primary_key=True, default=1)
    paused = pw.BooleanField(default=False)
    max_concurrent = pw.IntegerField()
    dynamic_concurrency = pw.BooleanField()
    # The config file's values when these were last taken from it: an edited file
    # wins over an older runtime change, an unchanged file does not undo one.
    config_max_concurrent = pw.IntegerField()
    config_dynamic_concurrency = pw.BooleanField()
    updated_at = pw.DoubleField(default=time.time)
    # This queue's identity, made once: the Redis mirror marks the keys it writes with it,
    # so queues of other machines sharing one Redis keep theirs. Nodes of one PostgreSQL
    # queue share it, as they share its jobs.
    queue_id = pw.CharField(max_length=32, default=lambda: uuid.uuid4().hex)


class MediaFile(BaseModel):
    file_uuid = pw.CharField(max_length=32, unique=True)
    path = pw.TextField(unique=True)  # absolute
    watch_root = pw.TextField()
    rel_path = pw.TextField()
    name = pw.TextField()
    size = pw.BigIntegerField(default=0)
    mtime = pw.DoubleField(default=0)
    # With size and mtime, what tells that the file may hold other content since it was
    # read (see ``holds``): the inode (another one when a file is renamed over it) and
    # the ctime (moves on every write, and its uploader cannot set it). Null in records
    # older than these columns until a rescan fills them in.
    inode = pw.BigIntegerField(null=True)  # st_ino as a signed 64-bit number
    ctime = pw.DoubleField(null=True)
    fingerprint = pw.CharField(max_length=80, null=True)
    state = pw.CharField(max_length=16, default=FileState.PRESENT, index=True)
    reason = pw.TextField(null=True)
    # Rejected for a cause that can pass without the file changing (permissions, storage):
    # looked at again at each rescan, register and watcher event instead of recognised.
    transient = pw.BooleanField(default=False)
    # blake2b of the whole content, computed when a result is about to be shared by
    # content (the fingerprint only samples it); cleared whenever the file is re-read.
    content_hash = pw.CharField(max_length=64, null=True)
    duration = pw.DoubleField(null=True)
    width = pw.IntegerField(null=True)
    height = pw.IntegerField(null=True)
    fps = pw.DoubleField(null=True)
    video_codec = pw.CharField(max_length=32, null=True)
    audio_codec = pw.CharField(max_length=32, null=True)
    registered_at = pw.DoubleField(default=time.time)
    updated_at = pw.DoubleField(default=time.time)

    def holds(self, st: os.stat_result) -> bool:
        """Whether the file ``st`` describes is still the one read for this record, as far
        as its stat tells (see ``unchanged``)."""
        return unchanged((self.size, self.mtime, self.inode, self.ctime), st)


_FINGERPRINT_SAMPLE = 1 << 20  # bytes hashed at head, middle and tail


def fingerprint(path: Path, size: int) -> str:
    """Size plus a hash of three samples: quick on multi-GB files, changes when content does."""
    digest = hashlib.blake2b(digest_size=16)
    sample = _FINGERPRINT_SAMPLE
    with path.open("rb") as f:
        for offset in sorted({0, max(size // 2 - sample // 2, 0), max(size - sample, 0)}):
            f.seek(offset)
            digest.update(f.read(sample))
    return f"{size}:{digest.hexdigest()}"


def stamp(st: os.stat_result) -> dict[str, Any]:
    """The MediaFile fields a file's stat gives: size, mtime, inode, ctime."""
    inode = st.st_ino - (1 << 64) if st.st_ino >= 1 << 63 else st.st_ino  # fits a BIGINT
    return {"size": st.st_size, "mtime": st.st_mtime, "inode": inode, "ctime": st.st_ctime}


def unchanged(recorded: tuple[int, float, int | None, float | None], st: os.stat_result) -> bool:
    """Whether a file's stat ``st`` still matches the recorded (size, mtime, inode, ctime):
    then it holds the content read for the record, unread. Any change (a chmod or a
    ``touch -a`` moves the ctime too) means only reading it again tells. An inode or
    ctime not recorded yet (a record older than them) is not compared."""
    seen = tuple(stamp(st).values())
    return recorded[:2] == seen[:2] and all(
        known is None or known == now for known, now in zip(recorded[2:], seen[2:], strict=True)
    )


def written(before: os.stat_result, after: os.stat_result) -> bool:
    """Written to, replaced or touched between two looks at one path (to the nanosecond)."""
    return (before.st_size, before.st_mtime_ns, before.st_ino, before.st_ctime_ns) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ino,
        after.st_ctime_ns,
    )


class Job(BaseModel):
    task_id = pw.CharField(max_length=20, unique=True)
    file = pw.ForeignKeyField(MediaFile, backref="jobs", on_delete="CASCADE")
    status = pw.CharField(max_length=16, default=JobStatus.PENDING, index=True)
    priority = pw.SmallIntegerField(default=PRIORITIES["normal"])
    seq = pw.BigIntegerField(index=True)  # place in line within a priority (FIFO)
    processors = JSONField()  # list of names, in run order
    # force, retry_on_failure, callback_urls (callback_url: the first of them, as older rows have)
    options = JSONField(default=dict)
    progress = pw.SmallIntegerField(default=0)
    retry_count = pw.IntegerField(default=0)  # automatic retries used
    max_retries = pw.IntegerField()
    crash_count = pw.IntegerField(default=0)  # runs ended by a process crash, not a failure
    cancel_requested = pw.BooleanField(default=False)
    lease_owner = pw.CharField(max_length=120, null=True, index=True)
    lease_until = pw.DoubleField(null=True)
    node = pw.CharField(max_length=120, null=True)
    next_attempt_at = pw.DoubleField(null=True)
    created_at = pw.DoubleField(default=time.time)
    queued_at = pw.DoubleField(default=time.time)
    started_at = pw.DoubleField(null=True)
    completed_at = pw.DoubleField(null=True)
    error_message = pw.TextField(null=True)
    # A job-end callback still owed: when it is due (null: none), and the attempts so far.
    callback_due = pw.DoubleField(null=True, index=True)
    callback_attempts = pw.IntegerField(default=0)
    callback_done = JSONField(null=True)  # callback URLs delivered for the job's current ending
    # Per-job settings a request may give: seconds per run (null: queue.task_timeout), and
    # the time before which the job is not started (null: as soon as its turn comes).
    task_timeout = pw.DoubleField(null=True)
    not_before = pw.DoubleField(null=True)


class ProcessorRun(BaseModel):
    """One processor of one job (the seeds' processor_results)."""

    job = pw.ForeignKeyField(Job, backref="runs", on_delete="CASCADE")
    processor = pw.CharField(max_length=32)
    position = pw.SmallIntegerField()  # run order within the job
    status = pw.CharField(max_length=16, default=RunStatus.PENDING)
    progress_current = pw.BigIntegerField(default=0)
    progress_total = pw.BigIntegerField(default=0)
    last_checkpoint = JSONField(null=True)
    output_path = pw.TextField(null=True)
    error = pw.TextField(null=True)
    transient = pw.BooleanField(default=True)  # whether the last error may go away on retry
    reason = pw.TextField(null=True)  # why it was skipped
    attempts = pw.IntegerField(default=0)
    backend = pw.CharField(max_length=32, null=True)
    model = pw.CharField(max_length=64, null=True)
    started_at = pw.DoubleField(null=True)
    completed_at = pw.DoubleField(null=True)
    updated_at = pw.DoubleField(default=time.time)

    class Meta:
        indexes = ((("job", "processor"), True),)


class Node(BaseModel):
    """A service process working on this queue; its heartbeat keeps ``last_seen`` fresh."""

    node_id = pw.CharField(max_length=120, primary_key=True)
    host = pw.CharField(max_length=255)
    pid = pw.IntegerField()
    owner = pw.CharField(max_length=120)  # the lease owner id of its current process
    processors = JSONField(default=list)  # the processors it can run (ready here)
    max_concurrent = pw.IntegerField(default=0)  # its effective limit at its last heartbeat
    # On a shared PostgreSQL queue, its own concurrency settings, as QueueState's are on
    # SQLite (machines differ), with its config file's values when last taken from it.
    # Null on SQLite, and until the node's first start with them.
    own_max_concurrent = pw.IntegerField(null=True)
    own_dynamic_concurrency = pw.BooleanField(null=True)
    config_max_concurrent = pw.IntegerField(null=True)
    config_dynamic_concurrency = pw.BooleanField(null=True)
    started_at = pw.DoubleField(default=time.time)
    last_seen = pw.DoubleField(default=time.time, index=True)


MODELS = (QueueState, MediaFile, Job, ProcessorRun, Node)


class SchemaVersion(BaseModel):
    version = pw.IntegerField()
    applied_at = pw.DoubleField(default=time.time)


def _v1_initial(db: pw.Database) -> None:
    db.create_tables([QueueState, MediaFile, Job, ProcessorRun])


def _v2_nodes(db: pw.Database) -> None:
    db.create_tables([Node])


def _v3_line_indexes(db: pw.Database) -> None:
    # The claim's ORDER BY, served by one index instead of a sort of the whole line;
    # completed_at serves the timing history and the retention sweep.
    db.execute_sql("CREATE INDEX job_line ON job (status, priority DESC, seq, id)")
    db.execute_sql("CREATE INDEX job_completed_at ON job (completed_at)")
    db.execute_sql("DROP INDEX IF EXISTS job_status_priority_seq")  # job_line covers it


def _v4_fingerprint_index(db: pw.Database) -> None:
    # Finding earlier results of the same content (up to date, duplicate of) by fingerprint.
    db.execute_sql("CREATE INDEX media_file_fingerprint ON media_file (fingerprint)")


def _v5_callbacks(db: pw.Database) -> None:
    # Callbacks owed live in the job table, so a restart resends them. Databases made
    # by v1 after these columns joined the model have them already.
    if "callback_due" in {c.name for c in db.get_columns("job")}:
        return
    migrator = SchemaMigrator.from_database(db)
    run_migrations(
        migrator.add_column("job", "callback_due", Job.callback_due),  # with its index
        migrator.add_column("job", "callback_attempts", Job.callback_attempts),
    )


def _v6_job_settings(db: pw.Database) -> None:
    # Several callback URLs per job, a per-job task timeout and a delayed start.
    have = {c.name for c in db.get_columns("job")}
    migrator = SchemaMigrator.from_database(db)
    run_migrations(
        *(
            migrator.add_column("job", name, getattr(Job, name))
            for name in ("callback_done", "task_timeout", "not_before")
            if name not in have
        )
    )


def _v7_file_recheck(db: pw.Database) -> None:
    # Transient rejections and whole-content hashes (see MediaFile). Idempotent: a
    # database made by v1 after these columns joined the model has them already.
    have = {c.name for c in db.get_columns("media_file")}
    migrator = SchemaMigrator.from_database(db)
    steps = [
        migrator.add_column("media_file", name, field)
        for name, field in (
            ("transient", MediaFile.transient),
            ("content_hash", MediaFile.content_hash),
        )
        if name not in have
    ]
    if steps:
        run_migrations(*steps)


def _v8_file_identity(db: pw.Database) -> None:
    # Each file's inode and ctime (see MediaFile); existing records get them from the next
    # rescan (Intake.reconcile), without being read again.
    have = {c.name for c in db.get_columns("media_file")}
    migrator = SchemaMigrator.from_database(db)
    steps = [
        migrator.add_column("media_file", name, field)
        for name, field in (("inode", MediaFile.inode), ("ctime", MediaFile.ctime))
        if name not in have
    ]
    if steps:
        run_migrations(*steps)


def _v9_queue_id(db: pw.Database) -> None:
    # The queue's identity (QueueState.queue_id); an existing settings row gets a new one.
    if "queue_id" in {c.name for c in db.get_columns("queue_state")}:
        return
    migrator = SchemaMigrator.from_database(db)
    run_migrations(migrator.add_column("queue_state", "queue_id", QueueState.queue_id))


_NODE_SETTINGS = (
    "own_max_concurrent",
    "own_dynamic_concurrency",
    "config_max_concurrent",
    "config_dynamic_concurrency",
)


def _v10_node_concurrency(db: pw.Database) -> None:
    # Each node's own concurrency settings (Node.own_*). On PostgreSQL the nodes known so
    # far start from the queue's shared ones, so a change made through the API stays
    # (the config rule then gives a node whose file says otherwise its file's value).
    have = {c.name for c in db.get_columns("node")}
    if set(_NODE_SETTINGS) <= have:
        return
    migrator = SchemaMigrator.from_database(db)
    run_migrations(
        *(migrator.add_column("node", name, getattr(Node, name)) for name in _NODE_SETTINGS)
    )
    if is_postgres(db):
        db.execute_sql(
            "UPDATE node SET own_max_concurrent = q.max_concurrent,"
            " own_dynamic_concurrency = q.dynamic_concurrency,"
            " config_max_concurrent = q.config_max_concurrent,"
            " config_dynamic_concurrency = q.config_dynamic_concurrency"
            " FROM queue_state q WHERE q.id = 1"
        )


# Append-only: each entry moves the schema one version forward.
MIGRATIONS: list[Callable[[pw.Database], None]] = [
    _v1_initial,
    _v2_nodes,
    _v3_line_indexes,
    _v4_fingerprint_index,
    _v5_callbacks,
    _v6_job_settings,
    _v7_file_recheck,
    _v8_file_identity,
    _v9_queue_id,
    _v10_node_concurrency,
]


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
        params = CONNECTION_DEFAULTS | conninfo_to_dict(database_url)
    except psycopg.Error as exc:
        # libpq ends its messages with a newline.
        raise ConfigError(f"service.database_url: {str(exc).strip()}") from None
    # libpq parses the port only when it connects, and then says "connection is bad".
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"service.database_url: the port must be 1..65535, got {port!r}")
    dbname = params.pop("dbname", None) or "postgres"
    # Threads borrow connections from a bounded pool and give them back when idle
    # (release_connection), so a node holds a few connections, not one per thread.
    pool = type("Pool", (PooledPostgresqlDatabase,), {"psycopg3_adapter": _bounded_adapter()})
    return pool(dbname, max_connections=POOL_SIZE, stale_timeout=300, timeout=30, **params)


# Seconds a PostgreSQL statement waits for the server's answer (service.database_timeout,
# as SQLite's writers wait for a lock); None: as long as it takes.
answer_timeout: float | None = 15.0


def _bounded_adapter() -> type:
    """peewee's psycopg adapter, its connections waiting at most ``answer_timeout`` for
    the server. A server or proxy that keeps the connection open but stops answering
    (TCP keepalives see nothing wrong) would otherwise hold the thread, and peewee's
    database-wide lock that connect and close take, for as long as it lasts."""
    import psycopg

    class Connection(psycopg.Connection):
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            try:
                return super().wait(gen, interval, answer_timeout if timeout is None else timeout)
            except psycopg.OperationalError:  # no answer in time (or the link broke)
                self.pgconn.finish()  # cut off mid-statement: not usable again
                raise

    class Adapter(pw.Psycopg3Adapter):
        def connect(self, db: pw.Database, **params: Any) -> Any:
            return Connection.connect(dbname=db.database, **params)

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
        conn = super()._connect()
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


# -- hand-written statements for the queue's hot path ---------------------------------------
#
# peewee builds every query anew and maps rows through its cursor wrappers: 0.1-0.8 ms
# of CPU a statement, far more than SQLite takes to run it. The statements each job
# runs through (claim, progress, finish) are written out instead; the rest use peewee.


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
_readings: dict[tuple[type[pw.Model], tuple[str, ...]], list[tuple[str, Any]]] = {}


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


def insert(instance: pw.Model) -> None:
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


def insert_many(instances: Sequence[pw.Model], key: str | None = None) -> None:
    """INSERT ``instances`` of one model with an automatic id (their defaults filled in,
    as peewee fills them), as many rows a statement as the parameter limit allows. With
    ``key`` (a unique field's name), each instance's id is set from the statement's
    RETURNING, matched by that field (RETURNING's row order is not promised). Fields not
    given are stored and left as None, so the instances hold what reading the rows back
    would give."""
    if not instances:
        return
    meta = instances[0]._meta
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
    # insert. Its errors are peewee's, as execute_sql's are (db.OUTAGE_ERRORS).
    import psycopg  # the PostgreSQL driver: not loaded where SQLite is used

    with pw.__exception_wrapper__, psycopg.RawCursor(database.connection()) as cursor:
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


def migrate(db: pw.Database) -> int:
    with db.atomic():
        if is_postgres(db):
            # Several nodes may start at once; one migrates, the others wait here.
            db.execute_sql("SELECT pg_advisory_xact_lock(872301)")
        db.create_tables([SchemaVersion])
        current = SchemaVersion.select(pw.fn.MAX(SchemaVersion.version)).scalar() or 0
        for version, step in enumerate(MIGRATIONS[current:], start=current + 1):
            step(db)
            SchemaVersion.create(version=version)
    return len(MIGRATIONS)
