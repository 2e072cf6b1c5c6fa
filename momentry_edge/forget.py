"""Forgetting a file on request (footage withdrawn): its jobs stopped, its results,
thumbnails and subtitles removed, its rows deleted, the log lines naming it taken out,
its keys gone from a Redis mirror; the backups that still hold it named, not changed."""

# The file in the drop folder is the studio's: forget leaves it where it is unless told to
# remove it (delete_source), and refuses while it is there otherwise, as the next rescan
# would register it again (a new record, a new job: the opposite of forgetting). A marker
# kept to skip it would itself name the file.
#
# Backups are copies made for a disaster: changing them would make them something else.
# Forget says which still hold the file, to be removed by the operator if they must.

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import peewee as pw

from . import jobs, logs, outputs, store, trees
from .errors import Conflict
from .events import bus
from .store import Job, JobStatus, MediaFile
from .upkeep import backup

log = logging.getLogger(__name__)

# The tables holding rows of a file, each with the condition that finds them by the
# file's id (media_file.id); the rows that others point to come last. A table that
# keeps a file's content (search entries, ...) adds its line here.
ROWS_OF_FILE: tuple[tuple[str, str], ...] = (
    ("processor_run", "job_id IN (SELECT id FROM job WHERE file_id = ?)"),
    ("job_log", "job_id IN (SELECT id FROM job WHERE file_id = ?)"),  # its jobs' log lines
    ("job", "file_id = ?"),
    ("result_part", "file_id = ?"),  # its results as the database keeps them
    ("search_entry", "file_id = ?"),  # its moments in the search index (triggers: FTS5)
    ("search_indexed", "file_id = ?"),
    ("media_file", "id = ?"),
)
STOP_WAIT = 30.0  # seconds for a running job of the file to stop at its next report


@dataclass
class Forgotten:
    file_uuid: str
    jobs: list[str] = field(default_factory=list)  # task ids, cancelled where they ran
    results: list[str] = field(default_factory=list)  # folders removed
    source_removed: bool = False
    log_lines: int = 0  # log lines removed
    backups: list[str] = field(default_factory=list)  # backup folders that still hold it

    def as_dict(self) -> dict[str, Any]:
        return {
            "success": True,
            "file_uuid": self.file_uuid,
            "jobs": self.jobs,
            "results_removed": self.results,
            "source_removed": self.source_removed,
            "log_lines_removed": self.log_lines,
            "backups": self.backups,
        }


def forget(
    data_dir: Path,
    record: MediaFile,
    *,
    delete_source: bool = False,
    stopping: Callable[[], bool] = lambda: False,
    in_hand: Callable[[], Collection[int]] = set,
) -> Forgotten:
    """Forget ``record``'s file. Conflict (nothing removed) while the file is still in the
    drop folder and ``delete_source`` is not set, or while one of its jobs does not stop.
    ``in_hand``: the ids of the jobs this process's workers hold (they log their job's
    end after its status is written)."""
    source = Path(record.path)
    if trees.lstat_regular(source) is not None and not delete_source:
        raise Conflict(
            f"{record.rel_path} is still in the watched folder, where the next rescan would "
            "register it again: move it away first, or ask for it to be deleted too "
            "(delete_source, --delete-source)"
        )
    done = Forgotten(record.file_uuid)
    task_ids = _stop_jobs(record, stopping, in_hand)
    done.jobs = task_ids
    for folder in outputs.result_folders(data_dir, record):
        if folder.exists() and trees.remove(folder):
            done.results.append(str(folder))
    if delete_source and trees.lstat_regular(source) is not None:
        source.unlink()
        done.source_removed = True
    remove_rows(record.id)
    for task_id in task_ids:
        bus.publish("job.forgotten", task_id=task_id)  # the Redis mirror drops its keys
    words = {record.file_uuid, record.path, record.rel_path, record.name, *task_ids}
    done.log_lines = logs.forget(data_dir, words)
    done.backups = holding(data_dir, record.file_uuid)
    # Neither its name nor its uuid: this line outlives the file.
    log.info(
        "forgot a file: %d job(s), %d results folder(s); %d backup(s) still hold it",
        len(task_ids),
        len(done.results),
        len(done.backups),
    )
    return done


@store.retried
def remove_rows(file_id: int) -> None:
    """Every row of the file (ROWS_OF_FILE), in one transaction; on SQLite the file's bytes
    too: deleted rows and earlier versions of them stay in the file's free space and its
    WAL until overwritten, so the database is rebuilt (VACUUM) and its WAL emptied."""
    database = Job._meta.database
    with store.write_transaction(database):
        for table, where in ROWS_OF_FILE:
            store.execute(f"DELETE FROM {table} WHERE {where}", file_id)
    if store.is_postgres(database):
        return  # the server's own files: its autovacuum reclaims the rows
    try:
        database.execute_sql("VACUUM")
        # The WAL's older frames go once no reader needs them: a reader's snapshot keeps
        # them (busy), for moments only.
        for _ in range(50):
            if not database.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                return
            time.sleep(0.1)
        log.warning("the database's WAL could not be emptied after forgetting a file")
    except pw.OperationalError as exc:  # busy past the timeout: the rows are gone all the same
        log.warning("the database file could not be compacted after forgetting a file: %s", exc)


def _stop_jobs(
    record: MediaFile, stopping: Callable[[], bool], in_hand: Callable[[], Collection[int]]
) -> list[str]:
    """Cancel the file's jobs still to run or running, and wait for the running ones to
    stop (their last documents written, their workers done with them); returns all its
    jobs' task ids."""
    all_jobs = list(Job.select().where(Job.file == record.id))
    ids = {job.id for job in all_jobs}
    for job in all_jobs:
        if job.status in (JobStatus.PENDING, JobStatus.RETRYING, JobStatus.PROCESSING):
            with contextlib.suppress(Conflict):  # ended meanwhile
                jobs.cancel(job, "its file is being forgotten")
    deadline = time.monotonic() + STOP_WAIT
    while running := [
        job.task_id
        for job in Job.select().where(Job.file == record.id)
        if job.status == JobStatus.PROCESSING or job.id in ids & set(in_hand())
    ]:
        if time.monotonic() > deadline or stopping():
            raise Conflict(
                f"job {running[0]} of this file has not stopped yet; forget it again in a moment"
            )
        time.sleep(0.1)
    return [job.task_id for job in all_jobs]


def holding(data_dir: Path, file_uuid: str) -> list[str]:
    """The backups in <data_dir>/backups that hold the file: its row in their database, or
    its results. Backups written elsewhere (``backup DEST``) are not known here."""
    found = []
    for folder in backup.taken(data_dir):
        if (folder / "results" / file_uuid).exists() or _in_database(folder, file_uuid):
            found.append(str(folder))
    return found


def _in_database(folder: Path, file_uuid: str) -> bool:
    copy = folder / backup.SQLITE_NAME
    if copy.is_file():
        try:
            with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as conn:
                row = conn.execute(
                    "SELECT 1 FROM media_file WHERE file_uuid = ?", (file_uuid,)
                ).fetchone()
            conn.close()
        except sqlite3.Error:
            return True  # cannot tell: said to hold it
        return row is not None
    dump = folder / backup.DUMP_NAME
    if dump.is_file():
        # pg_restore writes the dump's rows out without a server.
        tool = shutil.which("pg_restore")
        if tool is None:
            return True
        listed = subprocess.run(
            [tool, "--data-only", "--table=media_file", "--file=-", str(dump)],
            capture_output=True,
            timeout=120,
        )
        return listed.returncode != 0 or file_uuid.encode() in listed.stdout
    return False
