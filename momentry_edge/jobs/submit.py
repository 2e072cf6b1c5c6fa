"""Submitting and steering jobs: submit (a waiting job takes the request on), hold, cancel, clear,
priority, retry."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import peewee as pw

from .. import clock, store
from ..clock import iso
from ..errors import Conflict, Invalid
from ..events import bus
from ..store import FileState, Job, JobStatus, MediaFile, ProcessorRun, RunStatus
from .claims import _finalise, get
from .common import _now, _seq, find_job

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
    priority: int = store.PRIORITIES["normal"],
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
    with bus.held(), store.write_transaction(database):
        if store.is_postgres(database):  # one submit per file at a time (SQLite: the write lock)
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
            store.insert(job)
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
    return store.fetch(
        Job,
        "SELECT * FROM job WHERE file_id = ? AND status IN (?, ?, ?) AND NOT cancel_requested"
        " ORDER BY id",
        file_id,
        *store.ACTIVE_STATES,
    )


def submit_new(
    files: Sequence[MediaFile],
    processors: Sequence[str],
    *,
    priority: int = store.PRIORITIES["normal"],
    max_retries: int,
    not_before: Mapping[str, float] | None = None,
    now: float | None = None,
) -> list[Job]:
    """Queue a deep scan of each of ``files``, just recorded (so none has a job yet to
    join), with one INSERT for the jobs and one for their runs, in line in the order
    given: for ingest's batches of new files, where ``submit`` would cost a few
    queries a file. A file whose path is in ``not_before`` starts no sooner than that.
    Written out (store.insert_many): peewee's insert_many spent longer building the
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
    with store.write_transaction(Job._meta.database):
        store.insert_many(queued, key="task_id")
        runs = [
            ProcessorRun(job=job.id, processor=name, position=i, updated_at=now)
            for job in queued
            for i, name in enumerate(names)
        ]
        store.insert_many(runs)
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


def answer_with_existing(
    job: Job, priority: int, options: dict[str, Any], now: float | None = None
) -> Job:
    """Answer a request with an existing job of the file (an unchanged file registered
    again): an active job is given the request's callbacks and higher priority, as in
    ``submit``; a finished one sends its summary to callback URLs it has not called yet."""
    now = _now(now)
    options = dict(options)
    asked = {key: options.pop(key) for key in SETTINGS if key in options}
    owed = False
    # Held: a priority carried over is announced once committed.
    with bus.held(), store.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status in store.ACTIVE_STATES:
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
    condition = Job.status == JobStatus.PENDING if forcing else Job.status.in_(store.ACTIVE_STATES)
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
    if job.status in store.ACTIVE_STATES:
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
        bus.publish("job.priority", task_id=job.task_id, priority=store.PRIORITY_NAMES[priority])


def _add_runs(job: Job, names: list[str], first_position: int, now: float) -> None:
    for i, name in enumerate(names):
        store.insert(
            ProcessorRun(job=job.id, processor=name, position=first_position + i, updated_at=now)
        )


def cancel(job: Job, reason: str = "cancelled by user") -> str:
    """Cancel a waiting job now, or ask a running one to stop at its next report; the
    job's status before."""
    return _cancel(job, reason, clock.now())


@store.retried
def _cancel(job: Job, reason: str, now: float) -> str:
    with store.write_transaction(Job._meta.database):
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


def clear(among: pw.Expression | None = None) -> int:
    """Cancel every pending and retrying job (``among`` those, if given: a condition on Job)."""
    now = clock.now()
    with store.write_transaction(Job._meta.database):
        # One statement, not a read then a write: on PostgreSQL a job a worker claims
        # meanwhile is re-checked, and neither cancelled while it runs nor counted.
        waiting = list(
            Job.update(
                status=JobStatus.CANCELLED,
                completed_at=now,
                error_message="cleared from the queue",
                next_attempt_at=None,  # a retrying job's attempt is no longer due
            )
            .where(
                Job.status.in_((JobStatus.PENDING, JobStatus.RETRYING)),
                *([] if among is None else [among]),
            )
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
    with store.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status not in (JobStatus.PENDING, JobStatus.RETRYING):
            raise Conflict(f"job {job.task_id} is {job.status}, not waiting in line")
        first = Job.select(pw.fn.MIN(Job.seq)).where(Job.status == JobStatus.PENDING).scalar()
        seq = min(first if first is not None else job.seq, job.seq) - 1
        Job.update(
            priority=store.PRIORITIES["high"],
            seq=seq,
            status=JobStatus.PENDING,
            next_attempt_at=None,
        ).where(Job.id == job.id).execute()
    bus.publish("job.prioritized", task_id=job.task_id)
    return Job.get_by_id(job.id)


def set_priority(job: Job, priority: int) -> Job:
    with store.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status in store.FINAL_STATES:
            raise Conflict(f"job {job.task_id} is already {job.status}")
        if job.cancel_requested:
            raise Conflict(f"job {job.task_id} is being cancelled")
        Job.update(priority=priority).where(Job.id == job.id).execute()
    bus.publish("job.priority", task_id=job.task_id, priority=store.PRIORITY_NAMES[priority])
    return Job.get_by_id(job.id)


def retry(job: Job, now: float | None = None) -> Job:
    """Put a finished job back in line, re-running only what did not complete."""
    now = _now(now)
    with store.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status not in (JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED):
            raise Conflict(
                f"job {job.task_id} is {job.status}; only failed, partial or cancelled jobs retry"
            )
        _check_retry(job)
        ProcessorRun.update(status=RunStatus.PENDING, attempts=0, error=None, updated_at=now).where(
            ProcessorRun.job == job.id, ProcessorRun.status.not_in(store.RUN_DONE)
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


def dismiss(job: Job) -> None:
    """Remove a failed, partial or cancelled job's record (as the retention sweep would
    later): it leaves the failed lists. Its results on disk stay; a callback still owed
    for its ending is sent first (409 until then)."""
    with store.write_transaction(Job._meta.database):
        job = get(job.id, lock=True)
        if job.status not in (JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED):
            raise Conflict(
                f"job {job.task_id} is {job.status}; only failed, partial or cancelled jobs "
                "are dismissed"
            )
        if job.callback_due is not None:
            raise Conflict(f"job {job.task_id} still owes its callback; dismiss it once sent")
        Job.delete().where(Job.id == job.id).execute()
    bus.publish("job.dismissed", task_id=job.task_id)


def _check_retry(job: Job) -> None:
    """Inside retry's transaction: refuse a retry whose file is gone, or that would run a
    processor another active job of the file runs (one file's work is never queued twice)."""
    (file,) = store.fetch(MediaFile, "SELECT * FROM media_file WHERE id = ?", job.file_id)
    if file.state != FileState.PRESENT:
        raise Invalid(f"file {file.file_uuid} is {file.state}: {file.reason or 'not on disk'}")
    again = {
        run.processor
        for run in store.fetch(ProcessorRun, "SELECT * FROM processor_run WHERE job_id = ?", job.id)
        if run.status not in store.RUN_DONE
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
