"""Job lifecycle: the one module that changes job and processor-run state.

Every transition is one transaction and publishes one event after it commits; a worker
draining a backlog finishes one job and claims the next in a single commit
(``finish_and_claim``), and a run's start is written with the run's next write.
Order in line is ``priority DESC, seq, id``; ``seq`` is the time a job entered
the line (nanoseconds), so FIFO holds across nodes and ``prioritize`` is a
single UPDATE that gives a job a seq below every other pending one. A worker writes
into a job it claimed only while that claim still holds it (``Claim``, ``_still_held``):
one whose lease ran out and whose job was given away writes nothing more into it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import secrets
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import peewee as pw

from . import clock, db, outputs
from .clock import iso
from .db import FileState, Job, JobStatus, MediaFile, Node, ProcessorRun, QueueState, RunStatus
from .errors import Conflict, Invalid, NotFound
from .events import bus

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


class LeaseLost(Exception):
    """This worker no longer holds the job (the reaper gave it away)."""


@dataclass(frozen=True)
class RetryPolicy:
    retry_delay: float
    max_crashes: int
    lease_seconds: float


def _now(now: float | None) -> float:
    return clock.now() if now is None else now


def _seq(now: float) -> int:
    return int(now * 1e9)


def parse_priority(value: Any) -> int:
    if not isinstance(value, str) or value not in db.PRIORITIES:
        raise Invalid(f"priority must be one of low, normal, high; got {value!r}")
    return db.PRIORITIES[value]


def find_job(ref: str | int) -> Job:
    """A job by task_id, integer id, or file_uuid (that file's newest job)."""
    text = str(ref)
    job = None
    # Only ids of the right shape reach the database ("²".isdigit() is true, but not int()).
    if re.fullmatch(r"task_[0-9a-f]{12}", text):
        job = Job.get_or_none(Job.task_id == text)
    elif re.fullmatch(r"[0-9]{1,18}", text):
        job = Job.get_or_none(Job.id == int(text))
    elif re.fullmatch(r"[0-9a-fA-F]{32}", text):
        job = (
            Job.select()
            .join(MediaFile)
            .where(MediaFile.file_uuid == text.lower())
            .order_by(Job.id.desc())
            .first()
        )
    if job is None:
        raise NotFound(f"no job {text!r}")
    return job


# -- queue settings -------------------------------------------------------------------------


def init_queue_state(
    max_concurrent: int, dynamic: bool, node: str | None = None, ceiling: int | None = None
) -> QueueState:
    """Create the settings row, or take the config file's values where the file changed.

    On a shared PostgreSQL queue the values are ``node``'s own (its row, registered
    first): nodes of one queue run on machines of their own sizes. A kept max_concurrent
    above ``ceiling`` (queue.worker_threads, lowered since it was set) is cut to it.
    """
    database = QueueState._meta.database
    with db.write_transaction(database):
        state = QueueState.get_or_none(QueueState.id == 1)
        if state is None:
            state = QueueState.create(
                id=1,
                max_concurrent=max_concurrent,
                dynamic_concurrency=dynamic,
                config_max_concurrent=max_concurrent,
                config_dynamic_concurrency=dynamic,
            )
        if _own_settings(node):
            own = Node.get_by_id(node)
            if own.config_max_concurrent != max_concurrent:
                own.own_max_concurrent = own.config_max_concurrent = max_concurrent
            if own.config_dynamic_concurrency != dynamic:
                own.own_dynamic_concurrency = own.config_dynamic_concurrency = dynamic
            own.own_max_concurrent = _capped(own.own_max_concurrent, ceiling)
            own.save()
        else:
            if state.config_max_concurrent != max_concurrent:
                state.max_concurrent = state.config_max_concurrent = max_concurrent
            if state.config_dynamic_concurrency != dynamic:
                state.dynamic_concurrency = state.config_dynamic_concurrency = dynamic
            state.max_concurrent = _capped(state.max_concurrent, ceiling)
            state.save()
    return queue_state(node)


def _capped(kept: int, ceiling: int | None) -> int:
    """A kept max_concurrent, at most ``ceiling``: no more jobs run than there are threads,
    and the status, /metrics and the API's range must say what runs."""
    if ceiling is None or kept <= ceiling:
        return kept
    log.warning(
        "max_concurrent %d (set through the API) is more than queue.worker_threads %d: now %d",
        kept,
        ceiling,
        ceiling,
    )
    return ceiling


def _own_settings(node: str | None) -> bool:
    """Whether ``node`` keeps concurrency settings of its own: on PostgreSQL, where several
    nodes share the queue. SQLite's one node keeps them in the queue's row, whatever its id."""
    return node is not None and db.is_postgres(QueueState._meta.database)


def _state_sql(node: str | None) -> tuple[str, tuple[str, ...]]:
    """The statement reading the queue's state as ``node`` works by it: the queue's pause
    with the node's own settings in the place of the queue's, where it has its own."""
    if not _own_settings(node):
        return "SELECT * FROM queue_state WHERE id = 1", ()
    sql = (
        "SELECT q.id, q.paused, n.own_max_concurrent AS max_concurrent,"
        " n.own_dynamic_concurrency AS dynamic_concurrency FROM queue_state q"
        " JOIN node n ON n.node_id = ? WHERE q.id = 1"
    )
    return sql, (node,)


@db.retried  # read as a job starts: a dropped connection must not give the job back
def queue_state(node: str | None = None) -> QueueState:
    """The pause, and ``node``'s max_concurrent and dynamic_concurrency (see _state_sql)."""
    # Read before every claim: written out (see db.fetch) rather than built by peewee.
    sql, params = _state_sql(node)
    return db.fetch(QueueState, sql, *params)[0]


def set_paused(paused: bool) -> QueueState:
    QueueState.update(paused=paused, updated_at=clock.now()).where(QueueState.id == 1).execute()
    bus.publish("queue.paused" if paused else "queue.resumed", paused=paused)
    return queue_state()


def set_concurrency(
    max_concurrent: int | None, dynamic: bool | None, ceiling: int, node: str | None = None
) -> QueueState:
    """Change the concurrency settings ``node`` works by: its own on a shared PostgreSQL
    queue (see _own_settings), so a change through one node leaves the others as they are."""
    changes: dict[str, Any] = {}
    if max_concurrent is not None:
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise Invalid("max_concurrent must be a whole number")
        if not 1 <= max_concurrent <= ceiling:
            raise Invalid(f"max_concurrent must be between 1 and {ceiling} (queue.worker_threads)")
        changes["max_concurrent"] = max_concurrent
    if dynamic is not None:
        if not isinstance(dynamic, bool):
            raise Invalid("dynamic_concurrency must be true or false")
        changes["dynamic_concurrency"] = dynamic
    if not changes:  # both null: answered as changed, it would have changed nothing
        raise Invalid("give max_concurrent and/or dynamic_concurrency")
    if _own_settings(node):
        own = {getattr(Node, f"own_{name}"): value for name, value in changes.items()}
        Node.update(own).where(Node.node_id == node).execute()
    else:
        QueueState.update(changes, updated_at=clock.now()).where(QueueState.id == 1).execute()
    state = queue_state(node)
    bus.publish(
        "queue.concurrency",
        max_concurrent=state.max_concurrent,
        dynamic_concurrency=state.dynamic_concurrency,
    )
    return state


# -- submit and steer -----------------------------------------------------------------------


# What a request may set for its job besides processors, priority and callbacks, with the
# value a job has when nobody set it (None: the queue's setting applies).
SETTINGS = ("force", "retry_on_failure", "max_retries", "task_timeout", "not_before")


def callback_urls(options: dict[str, Any]) -> list[str]:
    """A job's callback URLs (rows written before there could be several have one)."""
    urls = options.get("callback_urls") or []
    single = options.get("callback_url")
    return list(dict.fromkeys([*([single] if single else []), *urls]))


# Callback URLs one job takes (requests joining it each add theirs): every attempt posts to
# each in turn, so their number bounds how long one attempt can hold the callback sender.
MAX_CALLBACK_URLS = 10


def _with_callbacks(options: dict[str, Any], urls: Sequence[str]) -> dict[str, Any]:
    merged = list(dict.fromkeys([*callback_urls(options), *urls]))
    if len(merged) > MAX_CALLBACK_URLS:
        raise Conflict(
            f"the file's job already has {MAX_CALLBACK_URLS} callback URLs, the most one job "
            "takes; ask again once it has ended, or without a callback_url"
        )
    rest = {k: v for k, v in options.items() if k not in ("callback_url", "callback_urls")}
    if not merged:
        return rest
    # callback_url stays the first one, so readers of the single-URL field still find it.
    return rest | {"callback_url": merged[0], "callback_urls": merged}


def submit(
    file: MediaFile,
    processors: Sequence[str],
    *,
    priority: int = db.PRIORITIES["normal"],
    max_retries: int,
    options: dict[str, Any] | None = None,
    now: float | None = None,
) -> tuple[Job, bool]:
    """Queue a deep scan of ``file``; returns (job, created).

    ``options`` holds what the request set: force, retry_on_failure, callback_url(s),
    and the per-job max_retries, task_timeout (seconds) and not_before (Unix time).

    One file's work is never queued twice, whichever way it is asked for (watcher,
    upload hook, API). Processors an active job of the file already runs are left
    to it, and that job is given the request's callbacks and higher priority; a job
    still waiting in line takes on the rest when it was asked with the same settings;
    only what is left then gets a new job. When nothing is left, the active job that
    runs what was asked (the newest, if several share it) is returned. A request whose
    settings an active job that runs part of it cannot honour is refused (Conflict),
    never answered with a job that ignores them.
    """
    now = _now(now)
    wanted = list(dict.fromkeys(processors))
    options = dict(options or {})
    asked = {key: options.pop(key) for key in SETTINGS if key in options}
    urls = callback_urls(options)
    added: list[str] = []
    database = Job._meta.database
    # Held: a priority carried over to a job is announced once committed.
    with bus.held(), db.write_transaction(database):
        if db.is_postgres(database):  # one submit per file at a time (SQLite: the write lock)
            MediaFile.select(MediaFile.id).where(MediaFile.id == file.id).for_update().execute()
        active = _active_jobs(file.id)
        covering = [job for job in active if set(wanted) <= set(job.processors)]
        sharing = covering[:1] or [job for job in active if set(wanted) & set(job.processors)]
        for job in sharing:
            _carry_over(job, priority, asked, urls, now)
        if covering:
            return Job.get_by_id(covering[0].id), False
        running = {name for job in active for name in job.processors}
        left = [name for name in wanted if name not in running]
        if not left:
            return Job.get_by_id(sharing[-1].id), False
        for job in active:
            if job.status == JobStatus.PENDING and _clash(job, asked, strict=True) is None:
                added = _take_on(job, left, priority, now)
                if added:
                    _carry_over(job, priority, asked, urls, now)
                    break
        if not added:
            job = Job(
                task_id="task_" + secrets.token_hex(6),
                file=file,
                priority=priority,
                seq=_seq(now),
                processors=left,
                options=_with_callbacks(
                    {k: asked[k] for k in ("force", "retry_on_failure") if k in asked}, urls
                ),
                max_retries=asked.get("max_retries", max_retries),
                task_timeout=asked.get("task_timeout"),
                not_before=asked.get("not_before"),
                created_at=now,
                queued_at=now,
            )
            db.insert(job)
            _add_runs(job, left, 0, now)
    if added:
        bus.publish("job.extended", task_id=job.task_id, added=added)
        return Job.get_by_id(job.id), False
    # not_before: the workers schedule a wake-up for the job's start time.
    bus.publish(
        "job.queued", task_id=job.task_id, file_uuid=file.file_uuid, not_before=job.not_before
    )
    return job, True


def _active_jobs(file_id: int) -> list[Job]:
    """The file's jobs that are to run or running, oldest first; not one being cancelled
    (its processors stop at their next report: it serves no new request)."""
    return db.fetch(
        Job,
        "SELECT * FROM job WHERE file_id = ? AND status IN (?, ?, ?) AND NOT cancel_requested"
        " ORDER BY id",
        file_id,
        *db.ACTIVE_STATES,
    )


def submit_new(
    files: Sequence[MediaFile],
    processors: Sequence[str],
    *,
    priority: int = db.PRIORITIES["normal"],
    max_retries: int,
    not_before: Mapping[str, float] | None = None,
    now: float | None = None,
) -> list[Job]:
    """Queue a deep scan of each of ``files``, just recorded (so none has a job yet to
    join), with one INSERT for the jobs and one for their runs, in line in the order
    given: for ingest's batches of new files, where ``submit`` would cost a few
    queries a file. A file whose path is in ``not_before`` starts no sooner than that.
    Written out (db.insert_many): peewee's insert_many spent longer building the
    statements than the database took to run them."""
    not_before = not_before or {}
    now = _now(now)
    names = list(dict.fromkeys(processors))
    queued = [
        Job(
            task_id="task_" + secrets.token_hex(6),
            file=file.id,
            priority=priority,
            seq=_seq(now),
            processors=names,
            options={},
            max_retries=max_retries,
            not_before=not_before.get(file.path),
            created_at=now,
            queued_at=now,
        )
        for file in files
    ]
    if not queued:
        return []
    with db.write_transaction(Job._meta.database):
        db.insert_many(queued, key="task_id")
        runs = [
            ProcessorRun(job=job.id, processor=name, position=i, updated_at=now)
            for job in queued
            for i, name in enumerate(names)
        ]
        db.insert_many(runs)
    for job, file in zip(queued, files, strict=True):
        bus.publish(
            "job.queued", task_id=job.task_id, file_uuid=file.file_uuid, not_before=job.not_before
        )
    return queued


def hold(job: Job, until: float) -> None:
    """Keep ``job``, if still waiting in line, from starting before ``until`` (its file's
    writer closed it again: a part more of a resumed upload)."""
    held = (
        Job.update(not_before=until)
        .where(
            Job.id == job.id,
            Job.status == JobStatus.PENDING,
            Job.not_before.is_null() | (Job.not_before < until),
        )
        .execute()
    )
    if held:  # the workers schedule a wake-up for the new start time
        bus.publish("job.held", task_id=job.task_id, not_before=until)


def release_hold(job: Job, until: float) -> None:
    """Let ``job`` start now if ``hold`` is what keeps it waiting (``until``, as held), not
    a start time asked for."""
    released = (
        Job.update(not_before=None)
        .where(Job.id == job.id, Job.status == JobStatus.PENDING, Job.not_before == until)
        .execute()
    )
    if released:
        bus.publish("job.requeued", task_id=job.task_id)


def join(job: Job, priority: int, options: dict[str, Any], now: float | None = None) -> Job:
    """Answer a request with an existing job of the file (an unchanged file registered
    again): an active job is given the request's callbacks and higher priority, as in
    ``submit``; a finished one sends its summary to callback URLs it has not called yet."""
    now = _now(now)
    options = dict(options)
    asked = {key: options.pop(key) for key in SETTINGS if key in options}
    owed = False
    # Held: a priority carried over is announced once committed.
    with bus.held(), db.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status in db.ACTIVE_STATES:
            _carry_over(job, priority, asked, callback_urls(options), now)
        else:
            owed = _owe_callbacks(job, callback_urls(options), now)
    if owed:
        bus.publish("job.callback_owed", task_id=job.task_id)
    return Job.get_by_id(job.id)


def _settings(job: Job) -> dict[str, Any]:
    """The job's value of each of SETTINGS, defaults filled in."""
    return {
        "force": bool(job.options.get("force", False)),
        "retry_on_failure": bool(job.options.get("retry_on_failure", True)),
        "max_retries": job.max_retries,
        "task_timeout": job.task_timeout,
        "not_before": job.not_before,
    }


def _clash(job: Job, asked: dict[str, Any], strict: bool = False) -> str | None:
    """Why ``job`` cannot serve a request that set ``asked``; None when it can.

    A forced re-run serves a request that did not ask for one; a request that asks to
    force is served by a job that has not started any processor yet (it is made forced),
    unless ``strict`` (work that could as well go to a job of its own).
    """
    have = _settings(job)
    for key, value in asked.items():
        if key == "force" and (not value or have["force"] or (not strict and _untouched(job))):
            continue
        if value != have[key]:
            return (
                f"the file's job {job.task_id} ({job.status}) for {', '.join(job.processors)}"
                f" has {key} {_shown(key, have[key])}, this request asks"
                f" {_shown(key, value)}; cancel that job, or ask again once it has ended"
            )
    return None


def _shown(key: str, value: Any) -> str:
    if value is None:
        return "unset"
    return iso(value) if key == "not_before" else json.dumps(value)


def _untouched(job: Job) -> bool:
    return job.status == JobStatus.PENDING and not (
        ProcessorRun.select().where(ProcessorRun.job == job.id, ProcessorRun.attempts > 0).exists()
    )


def _carry_over(
    job: Job, priority: int, asked: dict[str, Any], urls: list[str], now: float
) -> None:
    """Give an active job what a later request asked of it, or raise Conflict. Inside a
    write transaction, with the bus held."""
    job = Job.get_by_id(job.id)
    problem = _clash(job, asked)
    if problem:
        raise Conflict(problem)
    options = _with_callbacks(job.options, urls)
    forcing = bool(asked.get("force")) and not job.options.get("force")
    if forcing:
        options["force"] = True
    if options == job.options and priority <= job.priority:
        return
    condition = Job.status == JobStatus.PENDING if forcing else Job.status.in_(db.ACTIVE_STATES)
    changed = (
        Job.update(options=options, priority=max(job.priority, priority))
        .where(Job.id == job.id, condition)
        .execute()
    )
    if changed:
        _announce_raised(job, priority)
        return
    # It moved on between the read and the write (another node claimed or ended it).
    job = Job.get_by_id(job.id)
    if job.status in db.ACTIVE_STATES:
        raise Conflict(f"job {job.task_id} has started meanwhile; ask again to force a re-run")
    _owe_callbacks(job, urls, now)


def _owe_callbacks(job: Job, urls: list[str], now: float) -> bool:
    """Add callback URLs to a finished job: its summary is owed to the new ones now."""
    options = _with_callbacks(job.options, urls)
    if options == job.options:
        return False
    Job.update(options=options, callback_due=now, callback_attempts=0).where(
        Job.id == job.id
    ).execute()
    return True


def _take_on(job: Job, missing: list[str], priority: int, now: float) -> list[str]:
    """Add processors to a waiting job; returns them (none if a worker claimed it)."""
    updated = (
        Job.update(processors=[*job.processors, *missing], priority=max(job.priority, priority))
        .where(Job.id == job.id, Job.status == JobStatus.PENDING)  # claims change the status first
        .execute()
    )
    if not updated:
        return []
    _announce_raised(job, priority)
    _add_runs(job, missing, len(job.processors), now)
    return missing


def _announce_raised(job: Job, priority: int) -> None:
    """A job given a higher priority by a request that joined it: told as set_priority tells
    of one (the bus is held until the change commits)."""
    if priority > job.priority:
        bus.publish("job.priority", task_id=job.task_id, priority=db.PRIORITY_NAMES[priority])


def _add_runs(job: Job, names: list[str], first_position: int, now: float) -> None:
    for i, name in enumerate(names):
        db.insert(
            ProcessorRun(job=job.id, processor=name, position=first_position + i, updated_at=now)
        )


def cancel(job: Job, reason: str = "cancelled by user") -> str:
    """Cancel a waiting job now, or ask a running one to stop at its next report; the
    job's status before."""
    return _cancel(job, reason, clock.now())


@db.retried
def _cancel(job: Job, reason: str, now: float) -> str:
    with db.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status in (JobStatus.PENDING, JobStatus.RETRYING):
            _finalise(job, JobStatus.CANCELLED, reason, now)
        elif job.status == JobStatus.PROCESSING:
            Job.update(cancel_requested=True).where(Job.id == job.id).execute()
        elif job.status == JobStatus.CANCELLED and job.completed_at == now:
            pass  # by this cancel's earlier try, committed though its answer was lost
        else:
            raise Conflict(f"job {job.task_id} is already {job.status}")
    if job.status == JobStatus.PROCESSING:
        bus.publish("job.cancelling", task_id=job.task_id)
    else:
        bus.publish("job.finished", task_id=job.task_id, status=JobStatus.CANCELLED)
    return job.status


def clear() -> int:
    """Cancel every pending and retrying job."""
    now = clock.now()
    with db.write_transaction(Job._meta.database):
        # One statement, not a read then a write: on PostgreSQL a job a worker claims
        # meanwhile is re-checked, and neither cancelled while it runs nor counted.
        waiting = list(
            Job.update(
                status=JobStatus.CANCELLED,
                completed_at=now,
                error_message="cleared from the queue",
                next_attempt_at=None,  # a retrying job's attempt is no longer due
            )
            .where(Job.status.in_((JobStatus.PENDING, JobStatus.RETRYING)))
            .returning(Job.id, Job.task_id, Job.options)
            .execute()
        )
        cleared = [job.task_id for job in waiting]
        hooked = [job.id for job in waiting if job.options.get("callback_url")]
        Job.update(callback_due=now, callback_attempts=0).where(Job.id.in_(hooked)).execute()
    for task_id in cleared:
        bus.publish("job.finished", task_id=task_id, status=JobStatus.CANCELLED)
    bus.publish("queue.cleared", cleared=len(cleared))
    return len(cleared)


def prioritize(job: Job) -> Job:
    """Put a waiting job at position 1."""
    with db.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status not in (JobStatus.PENDING, JobStatus.RETRYING):
            raise Conflict(f"job {job.task_id} is {job.status}, not waiting in line")
        first = Job.select(pw.fn.MIN(Job.seq)).where(Job.status == JobStatus.PENDING).scalar()
        seq = min(first if first is not None else job.seq, job.seq) - 1
        Job.update(
            priority=db.PRIORITIES["high"], seq=seq, status=JobStatus.PENDING, next_attempt_at=None
        ).where(Job.id == job.id).execute()
    bus.publish("job.prioritized", task_id=job.task_id)
    return Job.get_by_id(job.id)


def set_priority(job: Job, priority: int) -> Job:
    with db.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status in db.FINAL_STATES:
            raise Conflict(f"job {job.task_id} is already {job.status}")
        if job.cancel_requested:
            raise Conflict(f"job {job.task_id} is being cancelled")
        Job.update(priority=priority).where(Job.id == job.id).execute()
    bus.publish("job.priority", task_id=job.task_id, priority=db.PRIORITY_NAMES[priority])
    return Job.get_by_id(job.id)


def retry(job: Job, now: float | None = None) -> Job:
    """Put a finished job back in line, re-running only what did not complete."""
    now = _now(now)
    with db.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status not in (JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED):
            raise Conflict(
                f"job {job.task_id} is {job.status}; only failed, partial or cancelled jobs retry"
            )
        _check_retry(job)
        ProcessorRun.update(status=RunStatus.PENDING, attempts=0, error=None, updated_at=now).where(
            ProcessorRun.job == job.id, ProcessorRun.status.not_in(db.RUN_DONE)
        ).execute()
        Job.update(
            status=JobStatus.PENDING,
            seq=_seq(now),
            queued_at=now,
            retry_count=0,
            crash_count=0,
            cancel_requested=False,
            next_attempt_at=None,
            completed_at=None,
            error_message=None,
            callback_due=None,  # the earlier ending is superseded; the next one is owed
            callback_done=None,  # to every callback URL again
        ).where(Job.id == job.id).execute()
    bus.publish("job.queued", task_id=job.task_id, retry=True)
    return Job.get_by_id(job.id)


def _check_retry(job: Job) -> None:
    """Inside retry's transaction: refuse a retry whose file is gone, or that would run a
    processor another active job of the file runs (one file's work is never queued twice)."""
    (file,) = db.fetch(MediaFile, "SELECT * FROM media_file WHERE id = ?", job.file_id)
    if file.state != FileState.PRESENT:
        raise Invalid(f"file {file.file_uuid} is {file.state}: {file.reason or 'not on disk'}")
    again = {
        run.processor
        for run in db.fetch(ProcessorRun, "SELECT * FROM processor_run WHERE job_id = ?", job.id)
        if run.status not in db.RUN_DONE
    }
    for other in _active_jobs(job.file_id):
        if shared := again & set(other.processors):
            raise Conflict(
                f"job {other.task_id} ({other.status}) runs {', '.join(sorted(shared))} for"
                f" this file already; cancel it first, or ask a deep scan of what is missing"
            )


def waiting_job(file_uuid: str) -> Job:
    """The file's job waiting in line (the first, if several), else its newest job (which
    prioritize then refuses with its status)."""
    waiting = (
        Job.select()
        .join(MediaFile)
        .where(
            MediaFile.file_uuid == file_uuid,
            Job.status.in_((JobStatus.PENDING, JobStatus.RETRYING)),
        )
        .order_by(Job.priority.desc(), Job.seq, Job.id)
        .first()
    )
    return waiting or find_job(file_uuid)


# -- the worker's side ----------------------------------------------------------------------


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
        with db.write_transaction(Job._meta.database):
            yield
            committing = True
    except BaseException as exc:
        unconfirmed[:] = before  # those the claim looked for are settled only by its commit
        if committing and isinstance(exc, db.OUTAGE_ERRORS):
            unconfirmed.append(now)
        raise


def _claim(request: ClaimRequest, now: float) -> tuple[Job | None, list[str]]:
    """Inside a write transaction: the job claimed, if any, and the retries that fell due
    (their task ids: each is announced, a paused queue leaves them pending)."""
    if adopted := _adopt_unconfirmed(request, now):
        return adopted, []
    promoted = [
        task_id
        for (task_id,) in db.execute(
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
        lock = " FOR SHARE" if db.is_postgres(Job._meta.database) else ""
        sql, params = _state_sql(request.node)
        (state,) = db.fetch(QueueState, sql + lock, *params)
        limit = limit(state)
    if limit <= 0:
        return None, promoted
    (running,) = db.execute(
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
    (job,) = db.fetch(
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
    job.file = db.fetch(MediaFile, "SELECT * FROM media_file WHERE id = ?", job.file_id)[0]
    return job


def _adopt_unconfirmed(request: ClaimRequest, now: float) -> Job | None:
    """A job an unconfirmed claim of this owner took after all, its lease renewed. The
    connections those claims went on are gone: the server has settled each of them."""
    unconfirmed = _unconfirmed.get(request.owner, [])
    while unconfirmed:
        held = db.fetch(
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
    if db.is_postgres(database):
        sql += " FOR UPDATE SKIP LOCKED"
    batch = 1 if can_run is None else CLAIM_BATCH
    offset = 0
    while True:
        rows = db.execute(sql, JobStatus.PENDING, now, batch, offset).fetchall()
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


@db.retried
def pending_runs(job_id: int) -> list[ProcessorRun]:
    """The job's runs still to do, in run order."""
    return db.fetch(
        ProcessorRun,
        "SELECT * FROM processor_run WHERE job_id = ? AND status = ? ORDER BY position",
        job_id,
        RunStatus.PENDING,
    )


@db.retried
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


@dataclass(frozen=True)
class Started:
    """A run's start not yet written: the worker writes it with the run's next write (its
    first progress report, or how it ended), which saves the start a commit of its own."""

    at: float
    backend: str | None
    model: str | None


# What a start sets, appended to the SET list of the run's next write. An attempt is
# counted once a start: a write whose commit landed though its answer was lost, carried
# again by the next write, finds its start already there.
_START_SET = (
    ", attempts = attempts + CASE WHEN started_at = ? THEN 0 ELSE 1 END,"
    " started_at = ?, backend = ?, model = ?"
)


def _start_params(started: Started | None) -> list[Any]:
    if started is None:
        return []
    return [started.at, started.at, started.backend, started.model]


@dataclass(frozen=True)
class Claim:
    """One claim of a job by a worker: the job, the lease owner and the claim's
    ``started_at``, which tells it from a later claim of the same job (see _still_held)."""

    job_id: int
    owner: str
    started_at: float

    @classmethod
    def of(cls, job: Job, owner: str) -> Claim:
        return cls(job.id, owner, job.started_at)


def _write_run(
    claim: Claim | None, sql: str, *params: Any, document: outputs.Staged | None = None
) -> None:
    """Run ``sql``, an UPDATE of one run ending in ``WHERE id = ?``, only while ``claim``
    still holds the job, else raise LeaseLost: a worker that lost the job writes nothing
    into it. None: inside the caller's transaction, which checked that with the job's row
    locked.

    The condition is in the statement itself (no read-then-write race); on PostgreSQL it
    share-locks the job's row, so the reaper cannot give the job away before the commit.
    ``document``, the run's document, is put in place before that commit: a worker that
    lost the job never replaces the document of the one that holds it now.
    """
    if claim is None:
        db.execute(sql, *params)
        if document is not None:
            document.place()
        return
    lock = " FOR SHARE" if db.is_postgres(Job._meta.database) else ""
    sql += (
        " AND EXISTS (SELECT 1 FROM job WHERE id = ? AND status = ? AND lease_owner = ?"
        f" AND started_at = ?{lock})"
    )
    params += (claim.job_id, JobStatus.PROCESSING, claim.owner, claim.started_at)
    with db.write_transaction(Job._meta.database) if document else contextlib.nullcontext():
        if not db.execute(sql, *params).rowcount:
            raise LeaseLost(f"job {claim.job_id} is no longer held by {claim.owner}")
        if document is not None:
            document.place()


@db.retried
def start_run(
    claim: Claim,
    run: ProcessorRun | int,
    backend: str | None,
    model: str | None,
    at: float | None = None,
) -> None:
    """Mark the run running (``at``: when it began, if before now; the same ``at`` again
    counts no second attempt)."""
    _write_run(
        claim,
        f"UPDATE processor_run SET status = ?, completed_at = NULL, error = NULL,"
        f" updated_at = ?{_START_SET} WHERE id = ?",
        RunStatus.RUNNING,
        clock.now(),
        *_start_params(Started(_now(at), backend, model)),
        getattr(run, "id", run),
    )


def report(
    job_id: int,
    run_id: int,
    owner: str,
    *,
    current: int,
    total: int,
    checkpoint: dict[str, Any] | None,
    lease_seconds: float,
    started_at: float | None = None,
    run_started: Started | None = None,
) -> bool:
    """Save progress (and a checkpoint), renew the lease; returns whether cancel was asked.

    ``started_at`` (the claim's) tells this claim from a later one of the same job;
    ``run_started``: the run's start, when it is not written yet.
    """
    now = clock.now()
    sql = "UPDATE processor_run SET progress_current = ?, progress_total = ?, updated_at = ?"
    params: list[Any] = [current, total, now]
    if checkpoint is not None:
        sql += ", last_checkpoint = ?"
        params.append(ProcessorRun.last_checkpoint.db_value(checkpoint))
    if run_started is not None:
        sql += ", status = ?, completed_at = NULL, error = NULL" + _START_SET
        params += [RunStatus.RUNNING, *_start_params(run_started)]
    with Job._meta.database.atomic():
        db.execute(sql + " WHERE id = ?", *params, run_id)
        progress = job_progress(job_id)
        sql = (
            "UPDATE job SET progress = ?, lease_until = ?"
            " WHERE id = ? AND lease_owner = ? AND status = ?"
        )
        params = [progress, now + lease_seconds, job_id, owner, JobStatus.PROCESSING]
        if started_at is not None:
            sql += " AND started_at = ?"
            params.append(started_at)
        held = db.execute(sql + " RETURNING cancel_requested, task_id", *params).fetchall()
        if not held:
            raise LeaseLost(f"job {job_id} is no longer held by {owner}")
        ((cancel, task_id),) = held
    bus.publish(
        "job.progress",
        task_id=task_id,
        job_id=job_id,
        progress=progress,
        current=current,
        total=total,
    )
    return bool(cancel)


def stop_asked(job_id: int, owner: str, started_at: float | None) -> str | None:
    """For a run that has not reported for a while: "cancel" when a user asked the job to
    stop, "lost" when it is no longer this claim's (another worker has it), else None."""
    sql = "SELECT cancel_requested FROM job WHERE id = ? AND lease_owner = ? AND status = ?"
    params: list[Any] = [job_id, owner, JobStatus.PROCESSING]
    if started_at is not None:
        sql += " AND started_at = ?"
        params.append(started_at)
    row = db.execute(sql, *params).fetchone()
    if row is None:
        return "lost"
    return "cancel" if row[0] else None


def job_progress(job_id: int) -> int:
    """Whole-job percent: each processor weighs the same."""
    runs = db.execute(
        "SELECT status, progress_current, progress_total FROM processor_run WHERE job_id = ?",
        job_id,
    ).fetchall()
    return _progress(runs)


def _progress(runs: Sequence[tuple[str, int, int]]) -> int:
    """Whole-job percent of (status, current, total) per run."""
    if not runs:
        return 0
    parts = []
    for status, current, total in runs:
        if status in db.RUN_DONE:
            parts.append(1.0)
        elif total:
            parts.append(min(current / total, 1.0))
        else:
            parts.append(0.0)
    return int(100 * sum(parts) / len(parts))


@dataclass(frozen=True)
class Completion:
    """A run that completed, with where its document is and its start if not written yet;
    ``document``: that document, to put in place with the record (see _write_run)."""

    run_id: int
    output_path: str
    started: Started | None = None
    document: outputs.Staged | None = None


@db.retried
def complete_run(
    claim: Claim,
    run: ProcessorRun | int,
    output_path: str,
    started: Started | None = None,
    document: outputs.Staged | None = None,
) -> None:
    _complete(Completion(getattr(run, "id", run), output_path, started, document), claim)


def _complete(done: Completion, claim: Claim | None) -> None:
    now = clock.now()
    # Progress shows the run whole: its own total when it reported one, else 1 of 1.
    _write_run(
        claim,
        "UPDATE processor_run SET status = ?, output_path = ?, completed_at = ?, error = NULL,"
        " progress_current = CASE WHEN progress_total > 0 THEN progress_total ELSE 1 END,"
        " progress_total = CASE WHEN progress_total > 0 THEN progress_total ELSE 1 END,"
        f" updated_at = ?{_START_SET if done.started else ''} WHERE id = ?",
        RunStatus.COMPLETED,
        done.output_path,
        now,
        now,
        *_start_params(done.started),
        done.run_id,
        document=done.document,
    )


@db.retried
def skip_run(claim: Claim, run: ProcessorRun, reason: str, output_path: str | None = None) -> None:
    now = clock.now()
    _write_run(
        claim,
        "UPDATE processor_run SET status = ?, reason = ?, output_path = ?, completed_at = ?,"
        " updated_at = ? WHERE id = ?",
        RunStatus.SKIPPED,
        reason,
        output_path,
        now,
        now,
        run.id,
    )


@db.retried
def fail_run(
    claim: Claim,
    run: ProcessorRun,
    error: str,
    *,
    transient: bool,
    document: outputs.Staged | None = None,
    started: Started | None = None,
) -> None:
    """``document``: the failed document written for it, when one could be."""
    now = clock.now()
    _write_run(
        claim,
        "UPDATE processor_run SET status = ?, error = ?, transient = ?, output_path = ?,"
        f" completed_at = ?, updated_at = ?{_START_SET if started else ''} WHERE id = ?",
        RunStatus.FAILED,
        error,
        transient,
        document and str(document.path),
        now,
        now,
        *_start_params(started),
        run.id,
        document=document,
    )


def undocumented_failures(task_ids: Collection[str]) -> list[ProcessorRun]:
    """Failed runs of these jobs with no document written: those a crash loop parked
    (``_recover``), whose worker was gone, and those whose document could not be written."""
    if not task_ids:
        return []
    return list(
        ProcessorRun.select(ProcessorRun, Job, MediaFile)
        .join(Job)
        .join(MediaFile)
        .where(
            Job.task_id.in_(list(task_ids)),
            ProcessorRun.status == RunStatus.FAILED,
            ProcessorRun.output_path.is_null(),
        )
    )


def documented(run: ProcessorRun, output_path: str) -> None:
    """Record the failed document written after the run was failed (its job is parked
    already, so nothing else would tell the event stream and the mirror)."""
    if _documented(run, output_path):
        bus.publish("job.documented", task_id=run.job.task_id, processor=run.processor)


@db.retried
def _documented(run: ProcessorRun, output_path: str) -> int:
    return (
        ProcessorRun.update(output_path=output_path)
        .where(ProcessorRun.id == run.id, ProcessorRun.status == RunStatus.FAILED)
        .execute()
    )


@db.retried
def release_run(
    claim: Claim,
    run: ProcessorRun,
    started: Started | None = None,
    document: outputs.Staged | None = None,
) -> None:
    """Back to pending, keeping the checkpoint (shutdown or cancel mid-run); ``document``:
    its partial document."""
    start = ", completed_at = NULL, error = NULL" + _START_SET if started else ""
    _write_run(
        claim,
        f"UPDATE processor_run SET status = ?, updated_at = ?{start} WHERE id = ?",
        RunStatus.PENDING,
        clock.now(),
        *_start_params(started),
        run.id,
        document=document,
    )


@db.retried
def requeue(job: Job, owner: str, not_before: float | None = None, why: str | None = None) -> str:
    """Give a running job back to the line at its old place (graceful shutdown), to
    start no sooner than ``not_before`` if given, with ``why`` as its error_message if
    given, or end it cancelled if a cancel was asked meanwhile."""
    with db.write_transaction(Job._meta.database):
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


@db.retried
def give_back(job: Job, owner: str, policy: RetryPolicy, error: str) -> str:
    """Release a job whose run broke down in the worker itself (a database or disk error
    while recording it): back in line with a crash counted, or parked as failed once it
    has happened ``max_crashes`` times, or cancelled if a cancel was asked."""
    with db.write_transaction(Job._meta.database):
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
        runs = db.fetch(ProcessorRun, "SELECT * FROM processor_run WHERE job_id = ?", job.id)
        done = any(r.status in db.RUN_DONE for r in runs)
        return _finalise(job, JobStatus.PARTIAL if done else JobStatus.FAILED, reason, now, runs)
    _requeue(job.id, error)
    return JobStatus.PENDING


def _announce_recovered(task_id: str, status: str) -> None:
    if status in db.FINAL_STATES:
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


@db.retried
def _finish_alone(
    job: Job, owner: str, policy: RetryPolicy, now: float, completed: Sequence[Completion]
) -> str:
    with db.write_transaction(Job._meta.database):
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


@db.retried
def _finish_and_claim(
    job: Job,
    owner: str,
    policy: RetryPolicy,
    request: ClaimRequest,
    completed: Sequence[Completion],
    finished_at: float,
) -> tuple[str, Job | None]:
    database = Job._meta.database
    following, promoted = None, []
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
        with db.write_transaction(database):
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
        if job.status in db.FINAL_STATES and job.completed_at == now:
            return job.status, job
        raise LeaseLost(f"job {job.task_id} is no longer held by {owner}")
    for done in completed:  # held, and the row locked: no other worker can take it now
        _complete(done, None)
    runs = db.fetch(ProcessorRun, "SELECT * FROM processor_run WHERE job_id = ?", job.id)
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
    done = sum(r.status in db.RUN_DONE for r in runs)
    status = JobStatus.COMPLETED if not failed else JobStatus.PARTIAL if done else JobStatus.FAILED
    error = "; ".join(f"{r.processor}: {r.error}" for r in failed) or None
    return _finalise(job, status, error, now, runs), job


def _announce_finish(job: Job, status: str) -> None:
    final = status in db.FINAL_STATES
    # callback: whether this ending owes one, so the callback sender wakes only then.
    extra = {"callback": bool(job.options.get("callback_url"))} if final else {}
    bus.publish(
        "job.finished" if final else "job.retrying", task_id=job.task_id, status=status, **extra
    )


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
        error_message="; ".join(f"{r.processor}: {r.error}" for r in runs),
    ).where(Job.id == job.id).execute()
    return JobStatus.RETRYING


def _finalise(
    job: Job, status: str, error: str | None, now: float, runs: list[ProcessorRun] | None = None
) -> str:
    """End ``job`` with ``status``; ``runs``: its runs as they are now, if in hand."""
    if runs is None:
        progress = job_progress(job.id)
    else:
        progress = _progress([(r.status, r.progress_current, r.progress_total) for r in runs])
    db.execute(
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
    if lock and db.is_postgres(Job._meta.database):
        sql += " FOR UPDATE"
    found = db.fetch(Job, sql, job_id)
    if not found:
        raise Job.DoesNotExist(f"no job {job_id}")
    return found[0]


# -- job-end callbacks ---------------------------------------------------------------------


def claim_callback(hold_seconds: float, now: float | None = None) -> tuple[str, int] | None:
    """The next callback due, as (task_id, attempt), held for ``hold_seconds`` so no other
    sender (thread or node) takes it meanwhile; None when none is due."""
    now = _now(now)
    database = Job._meta.database
    with db.write_transaction(database):
        query = (
            Job.select(Job.id, Job.task_id, Job.callback_attempts)
            .where(Job.callback_due <= now)
            .order_by(Job.callback_due)
            .limit(1)
        )
        if db.is_postgres(database):
            query = query.for_update("FOR UPDATE SKIP LOCKED")
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


@db.retried  # a delivery not recorded would be sent again
def callback_delivered(task_id: str, url: str) -> None:
    """Record one URL delivered, so a retry of the others does not send it again."""
    with db.write_transaction(Job._meta.database):
        job = Job.get(Job.task_id == task_id)
        done = [*(job.callback_done or []), url]
        Job.update(callback_done=done).where(Job.id == job.id).execute()


@db.retried  # a delivery not recorded would be sent again
def settle_callback(task_id: str, retry_at: float | None) -> None:
    """After a delivery attempt: owed again at ``retry_at``, or no more (None)."""
    Job.update(callback_due=retry_at).where(Job.task_id == task_id).execute()


def next_callback_due() -> float | None:
    return db.execute("SELECT MIN(callback_due) FROM job").fetchone()[0]


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
    with db.write_transaction(database):
        if not db.holds_cluster_lock(database, "reaper"):
            return []  # another node is reaping right now
        stale = Job.select().where(
            Job.status == JobStatus.PROCESSING,
            (Job.lease_until < now) | ((Job.node == node) & (Job.lease_owner != owner)),
            ~(Job.id.in_(list(in_hand)) & (Job.lease_owner == owner)),
        )
        if db.is_postgres(database):  # a cancel asked meanwhile is seen (see get)
            stale = stale.for_update()
        for job in list(stale):
            reaped.append((job.task_id, _recover(job, policy, now, "the service stopped")))
    for task_id, status in reaped:
        _announce_recovered(task_id, status)
    return [task_id for task_id, _ in reaped]


# -- reads that steer ordering ---------------------------------------------------------------


def pending_in_order() -> pw.ModelSelect:
    return (
        Job.select()
        .where(Job.status == JobStatus.PENDING)
        .order_by(Job.priority.desc(), Job.seq, Job.id)
    )


def position(job: Job) -> int | None:
    """1-based place in line, exact at the moment of the call; None when not pending."""
    if job.status != JobStatus.PENDING:
        return None
    (ahead,) = db.execute(
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
