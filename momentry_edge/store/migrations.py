"""Schema migrations: each version's change, applied in order at start-up."""

from __future__ import annotations

import time
from collections.abc import Callable

import peewee as pw
from playhouse.migrate import SchemaMigrator
from playhouse.migrate import migrate as run_migrations

from .schema import (
    BaseModel,
    Job,
    JobLog,
    MediaFile,
    Node,
    ProcessorRun,
    QueueState,
    ResultPart,
    SearchEntry,
    SearchIndexed,
    SearchVector,
)
from .sql import is_postgres


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


def _v11_file_hdr(db: pw.Database) -> None:
    # Whether a file is HDR video (MediaFile.hdr); files probed before say so once re-read.
    if "hdr" in {c.name for c in db.get_columns("media_file")}:
        return
    migrator = SchemaMigrator.from_database(db)
    run_migrations(migrator.add_column("media_file", "hdr", MediaFile.hdr))


def _v12_file_picture(db: pw.Database) -> None:
    # A file's pixel shape and flip (MediaFile.sample_aspect_ratio, .mirrored); null in
    # files probed before until they are read again.
    have = {c.name for c in db.get_columns("media_file")}
    migrator = SchemaMigrator.from_database(db)
    for name in ("sample_aspect_ratio", "mirrored"):
        if name not in have:
            run_migrations(migrator.add_column("media_file", name, getattr(MediaFile, name)))


def _v13_result_parts(db: pw.Database) -> None:
    # Results kept in the database too, served by every node (ResultPart); those written
    # before are read from the results folder until their processor runs again.
    db.create_tables([ResultPart])


def _v14_search(db: pw.Database) -> None:
    # The search index (SearchEntry, SearchIndexed) and names as searches compare them.
    # Results made before are indexed by the service in the background (search.backfill).
    from ..words import fold  # the one rule, shared with the searches

    db.create_tables([SearchEntry, SearchIndexed])
    if is_postgres(db):
        db.execute_sql(
            "ALTER TABLE search_entry ADD COLUMN IF NOT EXISTS tsv tsvector"
            " GENERATED ALWAYS AS (to_tsvector('simple', terms)) STORED"
        )
        db.execute_sql(
            "CREATE INDEX IF NOT EXISTS search_entry_tsv ON search_entry USING GIN (tsv)"
        )
    else:
        # External content: the words live once, in search_entry; triggers keep the index.
        db.execute_sql(
            "CREATE VIRTUAL TABLE IF NOT EXISTS search_fts USING fts5(terms,"
            " content='search_entry', content_rowid='id', tokenize='unicode61 remove_diacritics 0')"
        )
        db.execute_sql(
            "CREATE TRIGGER IF NOT EXISTS search_entry_ai AFTER INSERT ON search_entry BEGIN"
            " INSERT INTO search_fts (rowid, terms) VALUES (new.id, new.terms); END"
        )
        db.execute_sql(
            "CREATE TRIGGER IF NOT EXISTS search_entry_ad AFTER DELETE ON search_entry BEGIN"
            " INSERT INTO search_fts (search_fts, rowid, terms)"
            " VALUES ('delete', old.id, old.terms); END"
        )
    if "folded_name" not in {c.name for c in db.get_columns("media_file")}:
        migrator = SchemaMigrator.from_database(db)
        run_migrations(migrator.add_column("media_file", "folded_name", MediaFile.folded_name))
    for file_id, name in db.execute_sql("SELECT id, name FROM media_file").fetchall():
        db.execute_sql(
            f"UPDATE media_file SET folded_name = {db.param} WHERE id = {db.param}",
            (fold(name), file_id),
        )


def _v15_search_vectors(db: pw.Database) -> None:
    # Moments' meanings (SearchVector), filled by the service in the background once the
    # sentence model is in place.
    db.create_tables([SearchVector])


def _v16_node_worker(db: pw.Database) -> None:
    # Whether each node takes jobs (Node.worker): nodes known so far count as taking them
    # until their next start or drain says otherwise.
    if "worker" not in {c.name for c in db.get_columns("node")}:
        migrator = SchemaMigrator.from_database(db)
        run_migrations(migrator.add_column("node", "worker", Node.worker))


def _v17_job_log(db: pw.Database) -> None:
    # Each job's log lines in the database, read by every node (JobLog).
    db.create_tables([JobLog])


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
    _v11_file_hdr,
    _v12_file_picture,
    _v13_result_parts,
    _v14_search,
    _v15_search_vectors,
    _v16_node_worker,
    _v17_job_log,
]


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
