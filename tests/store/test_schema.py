"""A database made by an earlier release is brought up to date in place, data kept."""

from __future__ import annotations

import os

import peewee as pw

from momentry_edge import cluster, jobs, store, stored_results
from momentry_edge.ingest.intake import Intake
from momentry_edge.jobs import views
from momentry_edge.store import FileState, Job, MediaFile, SchemaVersion


def test_a_version_4_database_gains_the_new_columns_and_keeps_its_jobs(tmp_path, database_url):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    record = MediaFile.create(
        file_uuid="c" * 32, path="/drop/a.mp4", watch_root="/drop", rel_path="a.mp4", name="a.mp4"
    )
    job, _ = jobs.submit(record, ["noop"], max_retries=0, options={"callback_url": "http://h/"})
    # Back to what version 4 left: no callback or job-setting columns, no record of
    # versions 5 and 6, and the job's options as they were written then (one callback_url).
    database.execute_sql("DROP INDEX job_callback_due")
    added = ("callback_due", "callback_attempts", "callback_done", "task_timeout", "not_before")
    for column in added:
        database.execute_sql(f"ALTER TABLE job DROP COLUMN {column}")
    SchemaVersion.delete().where(SchemaVersion.version > 4).execute()
    database.execute_sql(
        "UPDATE job SET options = %s"
        if store.is_postgres(database)
        else "UPDATE job SET options = ?",
        ('{"callback_url": "http://h/"}',),
    )
    database.close()

    database = store.connect(database_url, data)

    assert set(added) <= {c.name for c in database.get_columns("job")}
    assert "job_callback_due" in {i.name for i in database.get_indexes("job")}
    assert SchemaVersion.select().count() == len(store.MIGRATIONS)
    jobs.cancel(job)  # ends the job: its callback is owed, in the new column
    assert jobs.claim_callback(hold_seconds=30) == (job.task_id, 1)
    assert Job.get_by_id(job.id).callback_attempts == 1
    assert jobs.owed_callbacks(Job.get_by_id(job.id)) == ["http://h/"]
    database.close()


def test_a_version_6_database_gains_the_file_recheck_columns_and_keeps_its_files(
    tmp_path, database_url
):
    database = _file_database_back_at(
        6,
        ("transient", "content_hash"),
        tmp_path,
        database_url,
        state=FileState.REJECTED,
        reason="truncated or corrupt",
    )
    record = MediaFile.get(MediaFile.path == "/drop/a.mp4")
    assert (record.state, record.transient, record.content_hash) == (
        FileState.REJECTED,
        False,
        None,
    )
    # Run again (another node starting): nothing to do, nothing breaks.
    assert store.migrate(database) == len(store.MIGRATIONS)
    database.close()


def _file_database_back_at(
    version: int, added: tuple[str, ...], tmp_path, database_url, **file
) -> pw.Database:
    """A queue holding one file (/drop/a.mp4 with ``file``'s fields) brought back to
    schema ``version`` (``added`` since: dropped), then opened again as a start would:
    asserts the columns are back and every migration recorded."""
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    MediaFile.create(
        file_uuid="d" * 32,
        path="/drop/a.mp4",
        watch_root="/drop",
        rel_path="a.mp4",
        name="a.mp4",
        **file,
    )
    for column in added:
        database.execute_sql(f"ALTER TABLE media_file DROP COLUMN {column}")
    SchemaVersion.delete().where(SchemaVersion.version > version).execute()
    database.close()

    database = store.connect(database_url, data)
    database.connect(reuse_if_open=True)
    assert set(added) <= {c.name for c in database.get_columns("media_file")}
    assert SchemaVersion.select().count() == len(store.MIGRATIONS)
    return database


def test_a_version_7_database_gains_inode_and_ctime_and_a_rescan_fills_them_in_unread(
    tmp_path, database_url
):
    data, drop = tmp_path / "data", tmp_path / "drop"
    drop.mkdir()
    database = store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    for i in range(3):
        (drop / f"{i}.mp4").write_bytes(bytes([i]) * 4096)
        os.utime(drop / f"{i}.mp4", (1_700_000_000, 1_700_000_000))
    intake = Intake([drop], [".mp4"], 0.5, ["noop"], 0)
    assert intake.reconcile(now=1_700_000_100)["new"] == 3
    for column in ("inode", "ctime"):
        database.execute_sql(f"ALTER TABLE media_file DROP COLUMN {column}")
    SchemaVersion.delete().where(SchemaVersion.version >= 8).execute()
    database.close()

    database = store.connect(database_url, data)
    database.connect(reuse_if_open=True)

    assert {"inode", "ctime"} <= {c.name for c in database.get_columns("media_file")}
    assert SchemaVersion.select().count() == len(store.MIGRATIONS)
    before = {r.path: r for r in MediaFile.select()}
    assert [(r.inode, r.ctime) for r in before.values()] == [(None, None)] * 3
    # The first rescan recognises every file as it did (nothing read, nothing queued) and
    # records its inode and ctime.
    counts = intake.reconcile()
    assert (counts["new"], counts["changed"], counts["unchanged"]) == (0, 0, 3)
    for path, record in before.items():
        now = MediaFile.get_by_id(record.id)
        assert (now.inode, now.ctime) == (os.stat(path).st_ino, os.stat(path).st_ctime)
        assert (now.fingerprint, now.updated_at) == (record.fingerprint, record.updated_at)
    assert Job.select().count() == 3

    # From then on, new content of the same size and mtime is told apart.
    (tmp_path / "new.mp4").write_bytes(b"\xff" * 4096)
    os.utime(tmp_path / "new.mp4", (1_700_000_000, 1_700_000_000))
    os.replace(tmp_path / "new.mp4", drop / "0.mp4")
    assert intake.reconcile()["changed"] == 1
    replaced = MediaFile.get(MediaFile.path == str(drop / "0.mp4"))
    assert replaced.fingerprint != before[replaced.path].fingerprint
    database.close()


def test_a_version_8_database_gains_a_queue_identity_that_stays(tmp_path, database_url):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    jobs.init_queue_state(3, False)
    database.execute_sql("ALTER TABLE queue_state DROP COLUMN queue_id")
    SchemaVersion.delete().where(SchemaVersion.version >= 9).execute()
    database.close()

    database = store.connect(database_url, data)
    database.connect(reuse_if_open=True)
    identity = store.queue_id()
    assert len(identity) == 32 and jobs.queue_state().max_concurrent == 3
    database.close()
    # The next start (or another node of the queue) reads the same identity.
    database = store.connect(database_url, data)
    jobs.init_queue_state(3, False)
    assert store.queue_id() == identity
    database.close()
    # Another database is another queue.
    other = store.connect("", tmp_path / "other")
    jobs.init_queue_state(3, False)
    assert store.queue_id() != identity
    other.close()


def test_a_version_9_database_keeps_its_concurrency_change_on_each_node(tmp_path, database_url):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    for node in ("big", "small"):
        cluster.register_node(node, f"{node}-owner", [])
    jobs.init_queue_state(2, True)
    jobs.set_concurrency(3, False, ceiling=8)  # changed through the API under version 9
    for setting in ("max_concurrent", "dynamic_concurrency"):
        for column in (f"own_{setting}", f"config_{setting}"):
            database.execute_sql(f"ALTER TABLE node DROP COLUMN {column}")
    SchemaVersion.delete().where(SchemaVersion.version >= 10).execute()
    database.close()

    database = store.connect(database_url, data)
    # Started with the config file the change was made under: the change stays. Another
    # node's file that says otherwise gives it its own value (only it, on PostgreSQL).
    state = jobs.init_queue_state(2, True, "big")
    assert (state.max_concurrent, state.dynamic_concurrency) == (3, False)
    jobs.init_queue_state(1, True, "small")
    assert jobs.queue_state("small").max_concurrent == 1
    shared = 1 if not store.is_postgres(database) else 3  # SQLite: one node, one setting
    assert jobs.queue_state("big").max_concurrent == shared
    database.close()


def test_a_version_10_database_gains_the_hdr_column_and_keeps_its_files(tmp_path, database_url):
    database = _file_database_back_at(10, ("hdr",), tmp_path, database_url, state=FileState.PRESENT)
    assert MediaFile.get(MediaFile.path == "/drop/a.mp4").hdr is None  # until read again
    assert store.migrate(database) == len(store.MIGRATIONS)
    database.close()


def test_a_version_11_database_gains_the_picture_columns_and_keeps_its_files(
    tmp_path, database_url
):
    added = ("sample_aspect_ratio", "mirrored")
    database = _file_database_back_at(
        11,
        added,
        tmp_path,
        database_url,
        state=FileState.PRESENT,
        width=1024,
        height=576,
        hdr="hlg",
    )
    # The file reads as before; what it was not probed for is not known (null) until re-read.
    detail = views.file_detail(MediaFile.get(MediaFile.path == "/drop/a.mp4"))
    assert (detail["width"], detail["height"], detail["hdr"]) == (1024, 576, "hlg")
    assert (detail["sample_aspect_ratio"], detail["mirrored"]) == (None, None)
    assert store.migrate(database) == len(store.MIGRATIONS)
    database.close()


def test_a_version_12_database_gains_the_results_table_and_keeps_its_files(tmp_path, database_url):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    MediaFile.create(
        file_uuid="d" * 32, path="/drop/a.mp4", watch_root="/drop", rel_path="a.mp4", name="a.mp4"
    )
    database.execute_sql("DROP TABLE result_part")
    SchemaVersion.delete().where(SchemaVersion.version > 12).execute()
    database.close()

    database = store.connect(database_url, data)
    database.connect(reuse_if_open=True)
    assert "result_part" in database.get_tables()
    assert SchemaVersion.select().count() == len(store.MIGRATIONS)
    record = MediaFile.get(MediaFile.path == "/drop/a.mp4")
    # Nothing stored for it yet: its results are read from the results folder.
    assert stored_results.read_document(record, "asr") is None
    database.close()


def test_a_version_13_database_gains_the_search_index_and_finds_its_names(tmp_path, database_url):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    MediaFile.create(
        file_uuid="d" * 32,
        path="/drop/Día de rodaje.mp4",
        watch_root="/drop",
        rel_path="Día de rodaje.mp4",
        name="Día de rodaje.mp4",
    )
    # Back to what version 13 left: none of the later versions' tables and columns.
    tables = ["search_vector", "job_log", "search_indexed", "search_entry"]
    for table in tables if store.is_postgres(database) else ["search_fts", *tables]:
        database.execute_sql(f"DROP TABLE {table}")
    database.execute_sql("ALTER TABLE media_file DROP COLUMN folded_name")
    database.execute_sql("ALTER TABLE node DROP COLUMN worker")
    SchemaVersion.delete().where(SchemaVersion.version > 13).execute()
    database.close()

    database = store.connect(database_url, data)
    database.connect(reuse_if_open=True)
    assert {"search_entry", "search_indexed"} <= set(database.get_tables())
    found = MediaFile.select().where(views.name_like("DIA"))
    assert [f.name for f in found] == ["Día de rodaje.mp4"]
    assert SchemaVersion.select().count() == len(store.MIGRATIONS)
    database.close()
