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

from . import backup, db, models, outputs
from .db import FileState, Job, MediaFile

log = logging.getLogger(__name__)

# A temp file is renamed into place as soon as it is written, at the latest with its job's
# finish commit, which is tried 4 times (db.RETRY_DELAYS), each waiting for a lock up to
# service.database_timeout (at most an hour): at most some 4 hours even so. One older than
# a day was left by a crash or a power cut, also if the clock has been set forward a while
# or the file server's clock (results on shared storage) is off.
TEMP_FILE_AGE = 86400.0

# The names our writers give a file until it is renamed, each matched whole: outputs.py's
# documents and subtitles (_temp_file: 48 random bits in hex) and a duplicate's links
# (_link_outputs: the pid), processors/keyframes.py's scene JPEGs, models.py's record.
_RESULTS_TEMP = re.compile(r"\..+\.[0-9a-f]{12}|\..+\.[0-9]+\.link|\.[0-9]{10,}\.jpg\.tmp")
_MODELS_TEMP = re.compile(re.escape(f"{models.RECORD}.tmp"))

_NOTHING = {"jobs": 0, "files": 0, "results": 0, "logs": 0}


def sweep(
    data_dir: Path, retention_seconds: float | None, now: float | None = None
) -> dict[str, int]:
    """Remove what finished before ``now - retention_seconds`` (None: keep all), the temp
    files older than TEMP_FILE_AGE and the unfinished backups no backup is writing (the
    .partial folders in the backups folder: backup.py says how it tells); returns counts.

    A file's results go only once none of its jobs is active or newer than the
    cutoff, so nothing a user may still ask about disappears.
    """
    now = time.time() if now is None else now
    # First, and without the database: this node's own folders, whatever the database does.
    temp_files = _remove_temp_files(outputs.results_root(data_dir), _RESULTS_TEMP, now)
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
    with db.write_transaction(database):
        if not db.holds_cluster_lock(database, "sweep"):
            return dict(_NOTHING)
        removed_jobs = (
            Job.delete().where(Job.status.in_(db.FINAL_STATES), Job.completed_at < cutoff).execute()
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
        .where(Job.status.in_(db.ACTIVE_STATES) | (Job.completed_at >= cutoff))
        .distinct()
    )
    kept = MediaFile.select(MediaFile.file_uuid).where(MediaFile.id.in_(recent))
    keep = {f.file_uuid for f in kept}
    removed_results = 0
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


def _remove_temp_files(folder: Path, names: re.Pattern[str], now: float) -> int:
    """Remove the files under ``folder`` named ``names`` and not modified for TEMP_FILE_AGE;
    returns how many. Links below ``folder`` (it may be one: results on shared storage) are
    removed as links and never followed, into folders either; a file or folder that cannot
    be read or removed is logged and passed over."""
    removed = 0
    try:
        with os.scandir(folder) as entries:
            found = list(entries)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("temp file sweep: cannot read %s: %s", folder, exc)
        return 0
    for entry in found:
        try:
            if entry.is_dir(follow_symlinks=False):
                removed += _remove_temp_files(Path(entry.path), names, now)
            elif (
                names.fullmatch(entry.name)
                and now - entry.stat(follow_symlinks=False).st_mtime > TEMP_FILE_AGE
            ):
                os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:
            continue  # placed or discarded meanwhile
        except OSError as exc:
            log.warning("temp file sweep: cannot remove %s: %s", entry.path, exc)
    return removed
