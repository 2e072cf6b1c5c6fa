"""Jobs by the folder their file is in, named as the file list names it (a file's path in
its watched folder without the name; "." the top): a folder's waiting jobs cancelled, its
failures retried, in one request each."""

from __future__ import annotations

from typing import Any

import peewee as pw

from ..errors import ClientError, Invalid, NotFound
from ..store import Job, JobStatus, MediaFile
from . import views
from .submit import clear, retry


def parse(value: Any) -> str | None:
    """A folder as a request gives it: None for every folder ("." or none given)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise Invalid("folder must be a string: a folder as the file list names it, e.g. 'day 1'")
    if "\0" in value or len(value) > 1000:
        raise Invalid("folder must be at most 1000 characters, without NUL")
    folder = value.strip().strip("/")
    return None if folder in ("", ".") else folder


def files_in(folder: str) -> pw.Expression:
    """SQL: the file is in ``folder`` or a folder in it."""
    prefix = folder + "/"
    # Not LIKE: "_" and "%" are common in folder names, and LIKE is not case-exact everywhere.
    return pw.fn.SUBSTR(MediaFile.rel_path, 1, len(prefix)) == prefix


def check_known(folder: str | None) -> None:
    """A folder no known file is in is a mistake (a typo would otherwise do nothing)."""
    if folder is not None and not MediaFile.select().where(files_in(folder)).exists():
        raise NotFound(
            f"no known file is in folder {folder!r} (folders as the file list names them)"
        )


def cancel_waiting(folder: str | None) -> int:
    """Cancel the pending and retrying jobs of ``folder`` (None: all); how many."""
    check_known(folder)
    if folder is None:
        return clear()
    return clear(Job.file.in_(MediaFile.select(MediaFile.id).where(files_in(folder))))


def retry_failed(folder: str | None) -> dict[str, Any]:
    """Put every failed and partial job of ``folder`` (None: all) that a later job of its
    file has not resolved back in line, as Retry does each; those it refuses (the file gone,
    another job running the same processors) are listed with the reason."""
    check_known(folder)
    ended_badly = Job.status.in_((JobStatus.FAILED, JobStatus.PARTIAL))
    unresolved = ~views.resolved()  # type: ignore[operator]
    chosen = Job.select(Job).join(MediaFile).where(ended_badly, unresolved)
    if folder is not None:
        chosen = chosen.where(files_in(folder))
    retried, refused = [], []
    for job in list(chosen.order_by(Job.id)):
        try:
            retried.append(retry(job).task_id)
        except ClientError as exc:
            refused.append({"task_id": job.task_id, "reason": exc.message})
    return {"retried": len(retried), "task_ids": retried, "refused": refused}
