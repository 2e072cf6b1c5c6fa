"""The worker's side: claim, heartbeat, give back, requeue, recover, finish, reap."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import peewee as pw

from .. import clock, store
from ..events import bus
from ..store import Job, JobStatus, MediaFile, ProcessorRun, QueueState, RunStatus
from . import estimates
from .common import LeaseLost, RetryPolicy, _now
from .runs import Completion, _complete, _progress, job_progress, run_errors
from .settings import _state_sql

log = logging.getLogger(__name__)

# Threads of one process claim one at a time; the database serialises processes.
_claim_lock = threading.Lock()
# How long a finish waits for another thread's claim to end, so as to claim the next job
# in its own commit: a claim takes milliseconds, unless it is waiting out a busy
# database or a broken connection, which the finish must not wait for.
CLAIM_WAIT = 0.1
# Claims whose commit failed on a broken connection, by owner: their start times. The
# server may have committed before the connection broke, the job then held by a claim
# no worker has; the next claim looks for it first (under _claim_lock) and takes it up,
# rather than leave it idle until its lease runs out and the reaper counts a crash.
_unconfirmed: dict[str, list[float]] = {}


CLAIM_BATCH = 50


@dataclass(frozen=True)
class ClaimRequest:
    """What a worker asks of ``claim`` (see there), to hand to ``finish_and_claim``.

    ``limit``: how many jobs may run on the node, or how to tell from the queue state
    (paused, the node's max_concurrent, ...), which the claim reads in its own transaction: a
    pause or a lower limit acknowledged before the claim commits holds it back.
    """

    owner: str
    node: str
    limit: int | Callable[[QueueState], int]
    lease_seconds: float
    can_run: set[str] | None = None
    cluster_can_run: set[str] | None = None


def claim(
    owner: str,
    node: str,
    limit: int | Callable[[QueueState], int],
    lease_seconds: float,
    *,
    can_run: set[str] | None = None,
    cluster_can_run: set[str] | None = None,
    now: float | None = None,
) -> Job | None:
    """Atomically take the next job in line, if fewer than ``limit`` run on ``node``
    (see ``ClaimRequest``).

    With ``can_run`` the node skips jobs that need a processor it lacks but another
    live node has (``cluster_can_run``); a processor no node can run does not hold a
    job back: it fails there with its reason instead of waiting forever.
    """
    request = ClaimRequest(owner, node, limit, lease_seconds, can_run, cluster_can_run)
    now = _now(now)
    with _claim_lock, _claiming(request.owner, now):
        job, promoted = _claim(request, now)
    _announce_claim(job, promoted, node)
    return job


@contextlib.contextmanager
def _claiming(owner: str, now: float) -> Iterator[None]:
    """Under _claim_lock: the write transaction of a claim at ``now``, noted unconfirmed
    when its commit fails on a broken connection (see _unconfirmed)."""
    unconfirmed = _unconfirmed.setdefault(owner, [])
    before = list(unconfirmed)
    committing = False
    try:
        with store.write_transaction(Job._meta.database):
            yield
            committing = True
    except BaseException as exc:
        unconfirmed[:] = before  # those the claim looked for are settled only by its commit
        if committing and isinstance(exc, store.OUTAGE_ERRORS):
            unconfirmed.append(now)
        raise


def _claim(request: ClaimRequest, now: float) -> tuple[Job | None, list[str]]:
    """Inside a write transaction: the job claimed, if any, and the retries that fell due
    (their task ids: each is announced, a paused queue leaves them pending)."""
    if adopted := _adopt_unconfirmed(request, now):
        return adopted, []
    promoted = [
        task_id
        for (task_id,) in store.execute(
            "UPDATE job SET status = ?, next_attempt_at = NULL"
            " WHERE status = ? AND next_attempt_at <= ? RETURNING task_id",
            JobStatus.PENDING,
            JobStatus.RETRYING,
            now,
        ).fetchall()
    ]
    limit = request.limit
    if not isinstance(limit, int):
        # PostgreSQL: shared-locked, so a pause or a new limit commits (and is answered)
        # only after this claim; SQLite's write lock already keeps them apart.
        # The node's own settings row is locked likewise (see _state_sql).
        lock = " FOR SHARE" if store.is_postgres(Job._meta.database) else ""
        sql, params = _state_sql(request.node)
        (state,) = store.fetch(QueueState, sql + lock, *params)
        limit = limit(state)
    if limit <= 0:
        return None, promoted
    (running,) = store.execute(
        "SELECT COUNT(*) FROM job WHERE status = ? AND node = ?",
        JobStatus.PROCESSING,
        request.node,
    ).fetchone()
    if running >= limit:
        return None, promoted
    database = Job._meta.database
    job_id = _next_claimable(database, request.can_run, request.cluster_can_run or set(), now)
    if job_id is None:
        return None, promoted
    (job,) = store.fetch(
        Job,
        "UPDATE job SET status = ?, lease_owner = ?, node = ?, lease_until = ?,"
        " started_at = ?, cancel_requested = ? WHERE id = ? RETURNING *",
        JobStatus.PROCESSING,
        request.owner,
        request.node,
        now + request.lease_seconds,
        now,
        False,
        job_id,
    )
    return _with_file(job), promoted


def _with_file(job: Job) -> Job:
    """The worker reads the file at once: in hand, not loaded lazily later."""
    job.file = store.fetch(MediaFile, "SELECT * FROM media_file WHERE id = ?", job.file_id)[0]
    return job


def _adopt_unconfirmed(request: ClaimRequest, now: float) -> Job | None:
    """A job an unconfirmed claim of this owner took after all, its lease renewed. The
    connections those claims went on are gone: the server has settled each of them."""
    unconfirmed = _unconfirmed.get(request.owner, [])
    while unconfirmed:
        held = store.fetch(
            Job,
            "UPDATE job SET lease_until = ?"
            " WHERE status = ? AND lease_owner = ? AND started_at = ? RETURNING *",
            now + request.lease_seconds,
            JobStatus.PROCESSING,
            request.owner,
            unconfirmed.pop(0),
        )
        if held:
            (job,) = held
            log.warning("job %s: claimed by a commit whose answer was lost", job.task_id)
            return _with_file(job)
    return None


def _announce_claim(job: Job | None, promoted: list[str], node: str) -> None:
    for task_id in promoted:
        bus.publish("job.retry_due", task_id=task_id)
    if job is not None:
        bus.publish("job.started", task_id=job.task_id, node=node)


def _next_claimable(
    database: pw.Database, can_run: set[str] | None, cluster_can_run: set[str], now: float
) -> int | None:
    # A job asked to start later keeps its place in line but is passed over until then.
    sql = (
        "SELECT id, processors FROM job"
        " WHERE status = ? AND (not_before IS NULL OR not_before <= ?)"
        " ORDER BY priority DESC, seq, id LIMIT ? OFFSET ?"
    )
    if store.is_postgres(database):
        sql += " FOR UPDATE SKIP LOCKED"
    batch = 1 if can_run is None else CLAIM_BATCH
    offset = 0
    while True:
        rows = store.execute(sql, JobStatus.PENDING, now, batch, offset).fetchall()
        for job_id, processors in rows:
            if can_run is None or set(json.loads(processors)) & cluster_can_run <= can_run:
                return job_id
        if len(rows) < CLAIM_BATCH:
            return None
        offset += len(rows)


def heartbeat(
    owner: str, lease_seconds: float, job_ids: Collection[int], now: float | None = None
) -> int:
    """Renew the leases of ``job_ids``, the jobs this process's workers have in hand.

    Only those: a job whose worker is gone runs out its lease and the reaper recovers it.
    """
    if not job_ids:
        return 0
    now = _now(now)
    return (
        Job.update(lease_until=now + lease_seconds)
        .where(
            Job.id.in_(list(job_ids)), Job.status == JobStatus.PROCESSING, Job.lease_owner == owner
        )
        .execute()
    )


@store.retried
def pending_runs(job_id: int) -> list[ProcessorRun]:
    """The job's runs still to do, in run order."""
    return store.fetch(
        ProcessorRun,
        "SELECT * FROM processor_run WHERE job_id = ? AND status = ? ORDER BY position",
        job_id,
        RunStatus.PENDING,
    )


@store.retried
def same_content_under_way(job: Job, processors: Collection[str]) -> Job | None:
    """A job of this node, started before ``job``, that is running one of ``processors``
    on the same content (another copy of the file): ``job`` waits for it and then takes
    its results (outputs.duplicate_output) rather than computing them a second time.

    Only earlier jobs count, so two copies never wait for each other.
    """
    if job.options.get("force") or not job.file.fingerprint or not processors:
        return None
    earlier = (Job.started_at < job.started_at) | (
        (Job.started_at == job.started_at) & (Job.id < job.id)
    )
    return (
        Job.select(Job.id, Job.task_id)
        .join(MediaFile)
        .switch(Job)
        .join(ProcessorRun)
        .where(
            Job.status == JobStatus.PROCESSING,
            Job.node == job.node,
            earlier,
            MediaFile.fingerprint == job.file.fingerprint,
            ProcessorRun.processor.in_(list(processors)),
            ProcessorRun.status.in_([RunStatus.PENDING, RunStatus.RUNNING]),
        )
        .first()
    )


@store.retried
def requeue(job: Job, owner: str, not_before: float | None = None, why: str | None = None) -> str:
    """Give a running job back to the line at its old place (graceful shutdown), to
    start no sooner than ``not_before`` if given, with ``why`` as its error_message if
    given, or end it cancelled if a cancel was asked meanwhile."""
    with store.write_transaction(Job._meta.database):
        claimed, job = job, get(job.id, lock=True)
        if not _still_held(job, claimed, owner):
            return job.status
        status = _release(job, clock.now(), why)
        if status == JobStatus.PENDING and not_before is not None:
            Job.update(not_before=not_before).where(Job.id == job.id).execute()
    if status == JobStatus.CANCELLED:
        bus.publish("job.finished", task_id=job.task_id, status=status)
    else:
        bus.publish("job.requeued", task_id=job.task_id)
    return status


@store.retried
def give_back(job: Job, owner: str, policy: RetryPolicy, error: str) -> str:
    """Release a job whose run broke down in the worker itself (a database or disk error
    while recording it): back in line with a crash counted, or parked as failed once it
    has happened ``max_crashes`` times, or cancelled if a cancel was asked."""
    with store.write_transaction(Job._meta.database):
        claimed, job = job, get(job.id, lock=True)
        if not _still_held(job, claimed, owner):
            return job.status  # the reaper or a user took it meanwhile
        status = _recover(job, policy, clock.now(), "its worker failed", error)
    _announce_recovered(job.task_id, status)
    return status


def _still_held(current: Job, claimed: Job, owner: str) -> bool:
    """Whether the job is still in the hands of the claim ``claimed`` came from: not
    recovered meanwhile (and perhaps claimed again by another thread of this process)."""
    return (
        current.status == JobStatus.PROCESSING
        and current.lease_owner == owner
        and current.started_at == claimed.started_at
    )


def _release(job: Job, now: float, why: str | None = None) -> str:
    """A running job out of its worker's hands: cancelled if asked, else back in line."""
    if job.cancel_requested:
        # Runs keep their checkpoints and stay to do, as after a cancel mid-run.
        ProcessorRun.update(status=RunStatus.PENDING).where(
            ProcessorRun.job == job.id, ProcessorRun.status == RunStatus.RUNNING
        ).execute()
        return _finalise(job, JobStatus.CANCELLED, "cancelled by user", now)
    _requeue(job.id, why)
    return JobStatus.PENDING


def _requeue(job_id: int, error: str | None = None) -> None:
    ProcessorRun.update(status=RunStatus.PENDING).where(
        ProcessorRun.job == job_id, ProcessorRun.status == RunStatus.RUNNING
    ).execute()
    changes: dict[Any, Any] = {
        Job.status: JobStatus.PENDING,
        Job.lease_owner: None,
        Job.lease_until: None,
        Job.node: None,
    }
    if error is not None:
        changes[Job.error_message] = error  # why it is back in line
    Job.update(changes).where(Job.id == job_id, Job.status == JobStatus.PROCESSING).execute()


def _recover(
    job: Job, policy: RetryPolicy, now: float, failure: str, error: str | None = None
) -> str:
    """A running job whose worker is gone (``failure`` says how), counted as a crash:
    cancelled if asked, parked as failed at ``max_crashes``, else back in line."""
    crashes = job.crash_count + 1
    Job.update(crash_count=crashes).where(Job.id == job.id).execute()
    if job.cancel_requested:
        return _release(job, now)
    if crashes >= policy.max_crashes:
        running = [r.processor for r in job.runs if r.status == RunStatus.RUNNING]
        reason = (
            f"{failure} {crashes} times while running this job"
            f" (during {', '.join(running) or 'start-up'}); parked for inspection"
        )
        if error:
            reason += f"; last: {error}"
        ProcessorRun.update(status=RunStatus.FAILED, error=reason, transient=False).where(
            ProcessorRun.job == job.id, ProcessorRun.status == RunStatus.RUNNING
        ).execute()
        # As _finish counts: the processors that completed before the crashes make it partial.
        runs = store.fetch(ProcessorRun, "SELECT * FROM processor_run WHERE job_id = ?", job.id)
        done = any(r.status in store.RUN_DONE for r in runs)
        return _finalise(job, JobStatus.PARTIAL if done else JobStatus.FAILED, reason, now, runs)
    _requeue(job.id, error)
    return JobStatus.PENDING


def _announce_recovered(task_id: str, status: str) -> None:
    if status in store.FINAL_STATES:
        _ended()
        bus.publish("job.finished", task_id=task_id, status=status)
    else:
        bus.publish("job.recovered", task_id=task_id)


def finish(
    job: Job,
    owner: str,
    policy: RetryPolicy,
    now: float | None = None,
    completed: Sequence[Completion] = (),
) -> str:
    """Decide a run's outcome from its processors: done, retry later, or final.

    ``completed``: runs that completed and are not recorded yet (the job's last), recorded
    in the same commit, as ``complete_run`` would. LeaseLost, with nothing written, when
    the job is no longer this claim's.
    """
    return _finish_alone(job, owner, policy, _now(now), completed)


@store.retried
def _finish_alone(
    job: Job, owner: str, policy: RetryPolicy, now: float, completed: Sequence[Completion]
) -> str:
    with store.write_transaction(Job._meta.database):
        status, job = _finish(job, owner, policy, now, completed)
    _announce_finish(job, status)
    return status


def finish_and_claim(
    job: Job,
    owner: str,
    policy: RetryPolicy,
    request: ClaimRequest,
    completed: Sequence[Completion] = (),
) -> tuple[str, Job | None]:
    """``finish``, then ``claim`` the next job for ``request`` in the same commit: a worker
    draining a backlog commits once a job, not twice. A crash before the commit leaves
    both jobs as they were; after it, the next job is held like any claimed one (its
    lease runs out, the reaper recovers it). No next job when another thread of this
    process is still claiming after CLAIM_WAIT (the caller then claims on its own).
    LeaseLost, with nothing written, when the job is no longer this claim's."""
    return _finish_and_claim(job, owner, policy, request, completed, clock.now())


@store.retried
def _finish_and_claim(
    job: Job,
    owner: str,
    policy: RetryPolicy,
    request: ClaimRequest,
    completed: Sequence[Completion],
    finished_at: float,
) -> tuple[str, Job | None]:
    database = Job._meta.database
    following: Job | None = None
    promoted: list[str] = []
    # The claim lock before the write lock, as in claim. Waiting for it rather than
    # finishing alone saves the commit of a claim of its own (on SQLite the finish would
    # wait as long for the write lock).
    claiming = _claim_lock.acquire(timeout=CLAIM_WAIT)
    now = clock.now()
    if claiming:
        try:
            with _claiming(request.owner, now):
                status, job = _finish(job, owner, policy, finished_at, completed)
                following, promoted = _claim(request, now)
        finally:
            _claim_lock.release()
    else:  # finished alone; the worker claims its next job after
        with store.write_transaction(database):
            status, job = _finish(job, owner, policy, finished_at, completed)
    _announce_finish(job, status)
    _announce_claim(following, promoted, request.node)
    return status, following


def _finish(
    job: Job, owner: str, policy: RetryPolicy, now: float, completed: Sequence[Completion]
) -> tuple[str, Job]:
    """Inside a write transaction: (status, the job's row); LeaseLost, before anything is
    written, when the reaper or a user took the job meanwhile.

    ``now`` is the same on each try of one finish: a try that finds the job ended at
    that very time is after one whose commit landed though its answer was lost.
    """
    claimed, job = job, get(job.id, lock=True)
    if not _still_held(job, claimed, owner):
        if job.status in store.FINAL_STATES and job.completed_at == now:
            return job.status, job
        raise LeaseLost(f"job {job.task_id} is no longer held by {owner}")
    for done in completed:  # held, and the row locked: no other worker can take it now
        _complete(done, None)
    runs = store.fetch(ProcessorRun, "SELECT * FROM processor_run WHERE job_id = ?", job.id)
    if job.cancel_requested:
        return _finalise(job, JobStatus.CANCELLED, "cancelled by user", now, runs), job
    failed = [r for r in runs if r.status == RunStatus.FAILED]
    retryable = [
        r
        for r in failed
        if r.transient
        and r.attempts <= job.max_retries
        and job.options.get("retry_on_failure", True)
    ]
    if retryable:
        return _schedule_retry(job, retryable, policy, now), job
    finished = sum(r.status in store.RUN_DONE for r in runs)
    status = (
        JobStatus.COMPLETED if not failed else JobStatus.PARTIAL if finished else JobStatus.FAILED
    )
    error = run_errors(failed) or None
    return _finalise(job, status, error, now, runs), job


def _announce_finish(job: Job, status: str) -> None:
    final = status in store.FINAL_STATES
    if final:
        _ended()
    # callback: whether this ending owes one, so the callback sender wakes only then.
    extra = {"callback": bool(job.options.get("callback_url"))} if final else {}
    bus.publish(
        "job.finished" if final else "job.retrying", task_id=job.task_id, status=status, **extra
    )


def _ended() -> None:
    # After the commit: a measurement taken between the end and its commit cannot see
    # this job yet, and would be kept for estimates.REFRESH.
    estimates.forget()  # a finished job is one more measurement


def _schedule_retry(job: Job, runs: list[ProcessorRun], policy: RetryPolicy, now: float) -> str:
    # Doubling backoff with jitter that never lets a later delay be shorter than an earlier one.
    delay = policy.retry_delay * (2**job.retry_count) * random.uniform(1.0, 1.25)
    ProcessorRun.update(status=RunStatus.PENDING).where(
        ProcessorRun.id.in_([r.id for r in runs])
    ).execute()
    Job.update(
        status=JobStatus.RETRYING,
        retry_count=Job.retry_count + 1,
        next_attempt_at=now + delay,
        lease_owner=None,
        lease_until=None,
        node=None,
        error_message=run_errors(runs),
    ).where(Job.id == job.id).execute()
    return JobStatus.RETRYING


def _finalise(
    job: Job, status: str, error: str | None, now: float, runs: list[ProcessorRun] | None = None
) -> str:
    """End ``job`` with ``status``; ``runs``: its runs as they are now, if in hand."""
    if runs is None:
        progress = job_progress(job.id)
    else:
        progress = _progress(
            [(r.processor, r.status, r.progress_current, r.progress_total) for r in runs]
        )
    store.execute(
        "UPDATE job SET status = ?, completed_at = ?, error_message = ?, lease_owner = NULL,"
        " lease_until = NULL, next_attempt_at = NULL, progress = ?, callback_due = ?,"
        " callback_attempts = 0 WHERE id = ?",
        status,
        now,
        error,
        progress,
        # Owed from the moment the job ends, in the same commit: a crash cannot lose it.
        now if job.options.get("callback_url") else None,
        job.id,
    )
    return status


def get(job_id: int, lock: bool = False) -> Job:
    """The job's row as it is now (Job.get_by_id, without peewee's query building).

    ``lock``, inside a write transaction: no other transaction changes the row until this
    one ends, so what is decided from it still holds at the commit. SQLite's write lock
    does that already; on PostgreSQL a cancel or retry read before a worker's finish (or
    a claim) commits would otherwise overwrite what that finish wrote, or be overwritten.
    """
    sql = "SELECT * FROM job WHERE id = ?"
    if lock and store.is_postgres(Job._meta.database):
        sql += " FOR UPDATE"
    found = store.fetch(Job, sql, job_id)
    if not found:
        raise Job.DoesNotExist(f"no job {job_id}")
    return found[0]


def reap(
    node: str,
    owner: str,
    policy: RetryPolicy,
    now: float | None = None,
    in_hand: Collection[int] = (),
) -> list[str]:
    """Re-queue jobs whose worker died: an expired lease, or an earlier life of this node.

    They keep their place in line and resume from their checkpoints. A job that
    has taken a process down ``max_crashes`` times is parked as failed instead, and
    one whose cancel was asked ends cancelled: the request outlives the worker.
    ``in_hand`` are this process's running jobs: alive, whatever their lease says
    after the database was out for a while.
    """
    now = _now(now)
    reaped = []
    database = Job._meta.database
    with store.write_transaction(database):
        if not store.holds_cluster_lock(database, "reaper"):
            return []  # another node is reaping right now
        stale = Job.select().where(
            Job.status == JobStatus.PROCESSING,
            (Job.lease_until < now) | ((Job.node == node) & (Job.lease_owner != owner)),
            ~(Job.id.in_(list(in_hand)) & (Job.lease_owner == owner)),
        )
        if store.is_postgres(database):  # a cancel asked meanwhile is seen (see get)
            stale = stale.for_update()
        for job in list(stale):
            reaped.append((job.task_id, _recover(job, policy, now, "the service stopped")))
    for task_id, status in reaped:
        _announce_recovered(task_id, status)
    return [task_id for task_id, _ in reaped]
