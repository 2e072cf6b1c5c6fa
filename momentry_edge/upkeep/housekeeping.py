"""The retention sweep: finished jobs, their results, rotated logs and the records of files
long gone from disk past retention, and the temp files and unfinished backups a crash left
behind."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import peewee as pw

from .. import outputs, store, stored_results, trees, weights
from ..search import index as search_index
from ..store import FileState, Job, MediaFile
from . import backup

log = logging.getLogger(__name__)

# A temp file is renamed into place as soon as it is written, at the latest with its job's
# finish commit, which is tried 4 times (store.RETRY_DELAYS), each waiting for a lock up to
# service.database_timeout (at most an hour): at most some 4 hours even so. One older than
# a day was left by a crash or a power cut, also if the clock has been set forward a while
# or the file server's clock (results on shared storage) is off.
TEMP_FILE_AGE = 86400.0

# The names our writers give a file until it is renamed, each matched whole: outputs.py's
# documents and subtitles (_temp_file: 48 random bits in hex) and a duplicate's links
# (_link_outputs: the pid), processors/keyframes.py's scene JPEGs, weights.py's record.
_RESULTS_TEMP = re.compile(r"\..+\.[0-9a-f]{12}|\..+\.[0-9]+\.link|\.[0-9]{10,}\.jpg\.tmp")
_MODELS_TEMP = re.compile(re.escape(f"{weights.RECORD}.tmp"))

_NOTHING = {"jobs": 0, "files": 0, "results": 0, "logs": 0}


def sweep(
    data_dir: Path, retention_seconds: float | None, now: float | None = None
) -> dict[str, int]:
    """Remove what finished before ``now - retention_seconds`` (None: keep all), the temp
    files older than TEMP_FILE_AGE and the unfinished backups no backup is writing (the
    .partial folders in the backups folder: backup.py says how it tells); returns counts.

    A file's results go only once none of its jobs is active or newer than the
    cutoff, so nothing a user may still ask about disappears, and never while the file is
    still in the drop folder: the file would be known, its results gone, and nothing would
    make them again. Such a file also keeps its newest job, which says what ran.
    """
    now = time.time() if now is None else now
    # First, and without the database: this node's own folders, whatever the database does.
    temp_files = _remove_temp_files(
        outputs.results_root(data_dir), _RESULTS_TEMP, now, outputs.WORK_FOLDER
    )
    temp_files += _remove_temp_files(data_dir / "models", _MODELS_TEMP, now)
    backups = len(backup.remove_leftovers(backup.backups_dir(data_dir)))
    counts = {**_NOTHING, "temp_files": temp_files, "backups": backups}
    if retention_seconds is not None:
        counts |= _sweep_finished(data_dir, now - retention_seconds)
    if any(counts.values()):
        log.info(
            "retention sweep removed %(jobs)d jobs, %(files)d missing files' records,"
            " %(results)d result folders, %(logs)d log"
            " files, %(temp_files)d temp files, %(backups)d unfinished backups",
            counts,
        )
    return counts


def _sweep_finished(data_dir: Path, cutoff: float) -> dict[str, int]:
    database = Job._meta.database
    with store.write_transaction(database):
        if not store.holds_cluster_lock(database, "sweep"):
            return dict(_NOTHING)
        newest_of_present = (
            Job.select(pw.fn.MAX(Job.id))
            .join(MediaFile, on=(Job.file == MediaFile.id))
            .where(MediaFile.state == FileState.PRESENT)
            .group_by(Job.file)
        )
        removed_jobs = (
            Job.delete()
            .where(
                Job.status.in_(store.FINAL_STATES),
                Job.completed_at < cutoff,
                Job.id.not_in(newest_of_present),
            )
            .execute()
        )
        # A file gone from disk since before the cutoff, none of its jobs left: its record
        # tells no one anything more, yet stayed for good (each upload of a drop folder that
        # is emptied after processing), read by every rescan and listed by /api/v1/files.
        removed_files = (
            MediaFile.delete()
            .where(
                MediaFile.state == FileState.MISSING,
                MediaFile.updated_at < cutoff,
                ~pw.fn.EXISTS(Job.select(Job.id).where(Job.file == MediaFile.id)),
            )
            .execute()
        )
    recent = (
        Job.select(Job.file)
        .where(Job.status.in_(store.ACTIVE_STATES) | (Job.completed_at >= cutoff))
        .distinct()
    )
    kept = MediaFile.select(MediaFile.file_uuid).where(
        MediaFile.id.in_(recent) | (MediaFile.state == FileState.PRESENT)
    )
    keep = {f.file_uuid for f in kept}
    removed_results = 0
    with store.write_transaction(database):  # those in the database, by one node
        if store.holds_cluster_lock(database, "sweep"):
            gone = stored_results.sweep(kept.select(MediaFile.id), cutoff)
            search_index.forget(gone)  # no hit left of what is gone
    for file_uuid, modified in outputs.stored(data_dir):
        if file_uuid not in keep and modified < cutoff:
            outputs.remove(data_dir, file_uuid)
            removed_results += 1
    removed_logs = 0
    for rotated in (data_dir / "logs").glob("*.log.*"):
        if rotated.stat().st_mtime < cutoff:
            rotated.unlink(missing_ok=True)
            removed_logs += 1
    return {
        "jobs": removed_jobs,
        "files": removed_files,
        "results": removed_results,
        "logs": removed_logs,
    }


def _remove_temp_files(
    folder: Path, names: re.Pattern[str], now: float, work: re.Pattern[str] | None = None
) -> int:
    """Remove the files under ``folder`` named ``names``, and the folders named ``work``
    (a run's work folders, with what they hold), not modified for TEMP_FILE_AGE; returns
    how many files. A run that ends removes its own: one left was left by a crash. Links
    below ``folder`` (it may be one: results on shared storage) are removed as links and
    never followed, into folders either; a file or folder that cannot be read or removed
    is logged and passed over. Any depth: trees.walk does not recurse."""
    removed = 0

    def unreadable(exc: OSError) -> None:
        if not isinstance(exc, FileNotFoundError):
            log.warning("temp file sweep: cannot read %s: %s", exc.filename, exc)

    for top, dirs, files in trees.walk(folder, onerror=unreadable):
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]  # to folders
        if work is not None:
            for name in [d for d in dirs if d not in links and work.fullmatch(d)]:
                gone = _remove_old_folder(os.path.join(top, name), now)
                if gone is not None:
                    dirs.remove(name)  # not walked into
                    removed += gone
        for name in files + links:
            if not names.fullmatch(name):
                continue
            path = os.path.join(top, name)
            try:
                if now - os.lstat(path).st_mtime > TEMP_FILE_AGE:
                    os.unlink(path)
                    removed += 1
            except FileNotFoundError:
                continue  # placed or discarded meanwhile
            except OSError as exc:
                log.warning("temp file sweep: cannot remove %s: %s", path, exc)
    return removed


def _remove_old_folder(folder: str, now: float) -> int | None:
    """Remove ``folder`` and all in it (links as links) once it is TEMP_FILE_AGE old (its
    mtime moves with each file a run adds); returns how many files it held, None when it
    is kept."""
    try:
        if now - os.lstat(folder).st_mtime <= TEMP_FILE_AGE:
            return None
    except OSError:
        return None
    count = sum(len(files) for _, _, files in trees.walk(folder))
    if not trees.remove(folder):
        log.warning("temp file sweep: cannot remove all of %s", folder)
    return count
