"""The retention sweep: finished jobs, their results and rotated logs past retention."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from . import db, outputs
from .db import Job, MediaFile

log = logging.getLogger(__name__)


def sweep(data_dir: Path, retention_seconds: float, now: float | None = None) -> dict[str, int]:
    """Remove what finished before ``now - retention_seconds``; returns counts.

    A file's results go only once none of its jobs is active or newer than the
    cutoff, so nothing a user may still ask about disappears.
    """
    now = time.time() if now is None else now
    cutoff = now - retention_seconds
    database = Job._meta.database
    with db.write_transaction(database):
        if not db.holds_cluster_lock(database, "sweep"):
            return {"jobs": 0, "results": 0, "logs": 0}
        removed_jobs = (
            Job.delete().where(Job.status.in_(db.FINAL_STATES), Job.completed_at < cutoff).execute()
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
    counts = {"jobs": removed_jobs, "results": removed_results, "logs": removed_logs}
    if any(counts.values()):
        log.info(
            "retention sweep removed %(jobs)d jobs, %(results)d result folders, %(logs)d log files",
            counts,
        )
    return counts
