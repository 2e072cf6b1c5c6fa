"""Reads that steer the line's order: the waiting jobs in order, a job's place."""

from __future__ import annotations

import peewee as pw

from .. import store
from ..store import Job, JobStatus


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
