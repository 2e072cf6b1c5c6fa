"""Job-end callbacks owed, claimed for delivery, delivered or settled."""

from __future__ import annotations

from .. import store
from ..store import Job
from .common import _now
from .submit import callback_urls


def claim_callback(hold_seconds: float, now: float | None = None) -> tuple[str, int] | None:
    """The next callback due, as (task_id, attempt), held for ``hold_seconds`` so no other
    sender (thread or node) takes it meanwhile; None when none is due."""
    now = _now(now)
    database = Job._meta.database
    with store.write_transaction(database):
        query = (
            Job.select(Job.id, Job.task_id, Job.callback_attempts)
            .where(Job.callback_due <= now)
            .order_by(Job.callback_due)
            .limit(1)
        )
        if store.is_postgres(database):
            query = query.for_update("FOR UPDATE SKIP LOCKED")  # type: ignore[arg-type]
        row = query.first()
        if row is None:
            return None
        attempt = row.callback_attempts + 1
        Job.update(callback_due=now + hold_seconds, callback_attempts=attempt).where(
            Job.id == row.id
        ).execute()
    return row.task_id, attempt


def owed_callbacks(job: Job) -> list[str]:
    """The job's callback URLs not yet delivered for its current ending."""
    done = set(job.callback_done or [])
    return [url for url in callback_urls(job.options) if url not in done]


@store.retried  # a delivery not recorded would be sent again
def callback_delivered(task_id: str, url: str) -> None:
    """Record one URL delivered, so a retry of the others does not send it again."""
    with store.write_transaction(Job._meta.database):
        job = Job.get(Job.task_id == task_id)
        done = [*(job.callback_done or []), url]
        Job.update(callback_done=done).where(Job.id == job.id).execute()


@store.retried  # a delivery not recorded would be sent again
def settle_callback(task_id: str, retry_at: float | None) -> None:
    """After a delivery attempt: owed again at ``retry_at``, or no more (None)."""
    Job.update(callback_due=retry_at).where(Job.task_id == task_id).execute()


def next_callback_due() -> float | None:
    return store.execute("SELECT MIN(callback_due) FROM job").fetchone()[0]
