"""Reads that steer the line's order: the waiting jobs in order, a job's place, a page
of the waiting line (filtered by status and folder)."""

from __future__ import annotations

from dataclasses import dataclass

import peewee as pw

from .. import store
from ..store import Job, JobStatus, MediaFile


def pending_in_order() -> pw.ModelSelect[Job]:
    return (
        Job.select()
        .where(Job.status == JobStatus.PENDING)
        .order_by(Job.priority.desc(), Job.seq, Job.id)
    )


def position(job: Job) -> int | None:
    """1-based place in line, exact at the moment of the call; None when not pending."""
    if job.status != JobStatus.PENDING:
        return None
    (ahead,) = store.execute(
        "SELECT COUNT(*) FROM job WHERE status = ?"
        " AND (priority > ? OR (priority = ? AND (seq < ? OR (seq = ? AND id < ?))))",
        JobStatus.PENDING,
        job.priority,
        job.priority,
        job.seq,
        job.seq,
        job.id,
    ).fetchone()
    return ahead + 1


@dataclass(frozen=True)
class Shown:
    """Which waiting jobs a status page lists: of these statuses (pending, retrying), of the
    files ``files`` selects (an expression on MediaFile, e.g. folders.files_in), if given."""

    statuses: tuple[str, ...] = (JobStatus.PENDING, JobStatus.RETRYING)
    files: pw.Expression | None = None

    @property
    def everything(self) -> bool:
        return self.files is None and set(self.statuses) >= {JobStatus.PENDING, JobStatus.RETRYING}


EVERY_WAITING_JOB = Shown()


def waiting_page(
    shown: Shown, limit: int, offset: int, counts: dict[str, int]
) -> tuple[list[Job], list[Job], int]:
    """The page: pending jobs by position, then retrying ones by their next attempt, of
    those ``shown`` selects; and how many it selects in all."""
    pending_query = pending_in_order().select_extend(MediaFile).join(MediaFile)
    retrying_query = (
        Job.select(Job, MediaFile)
        .join(MediaFile)
        .where(Job.status == JobStatus.RETRYING)
        .order_by(Job.next_attempt_at, Job.id)
    )
    if shown.files is not None:
        pending_query = pending_query.where(shown.files)
        retrying_query = retrying_query.where(shown.files)
    if shown.files is None:
        pending_total = counts.get(JobStatus.PENDING, 0)
        retrying_total = counts.get(JobStatus.RETRYING, 0)
    else:
        pending_total, retrying_total = pending_query.count(), retrying_query.count()
    if JobStatus.PENDING not in shown.statuses:
        pending_total = 0
    if JobStatus.RETRYING not in shown.statuses:
        retrying_total = 0
    pending = list(pending_query.limit(limit).offset(offset)) if pending_total else []
    retrying = []
    if len(pending) < limit and retrying_total:
        retrying = list(
            retrying_query.limit(limit - len(pending)).offset(max(offset - pending_total, 0))
        )
    return pending, retrying, pending_total + retrying_total
