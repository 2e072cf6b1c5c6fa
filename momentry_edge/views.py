"""Read-only views of the tables, shaped as API.md's JSON. Nothing here writes."""

from __future__ import annotations

import heapq
import json
from typing import Any

import peewee as pw

from . import clock, db, jobs
from .clock import iso
from .db import Job, JobStatus, MediaFile, ProcessorRun, RunStatus

HISTORY = 100  # finished jobs that estimate how long the next one takes


def average_job_seconds() -> float | None:
    # Written out (see db.fetch): every queued request's answer estimates its start.
    # SQLite, without statistics, would pick the status index and sort every finished
    # job; newest first along job_completed_at stops after HISTORY of them.
    hint = "" if db.is_postgres(Job._meta.database) else " INDEXED BY job_completed_at"
    recent = db.execute(
        f"SELECT completed_at - started_at FROM job{hint} WHERE status IN (?, ?, ?)"
        " AND started_at IS NOT NULL ORDER BY completed_at DESC LIMIT ?",
        JobStatus.COMPLETED,
        JobStatus.PARTIAL,
        JobStatus.FAILED,
        HISTORY,
    ).fetchall()
    took = [row[0] for row in recent if row[0] is not None and row[0] >= 0]
    return sum(took) / len(took) if took else None


def estimated_starts(count: int, running: list[Job], limit: int, now: float) -> list[float | None]:
    """When each of the first ``count`` pending jobs should start, from the average job time.

    Each of ``limit`` slots frees when its running job should end (from its progress
    when it has some); each job ahead then takes one average. None without history
    or while nothing may start.
    """
    average = average_job_seconds()
    if average is None or limit <= 0:
        return [None] * count
    ends = []
    for job in running:
        elapsed = max(now - (job.started_at or now), 0)
        if job.progress:
            remaining = elapsed * (100 - job.progress) / job.progress
        else:
            remaining = max(average - elapsed, 0)
        ends.append(now + remaining)
    slots = sorted(ends)[:limit] + [now] * max(limit - len(ends), 0)
    heapq.heapify(slots)
    starts: list[float | None] = []
    for _ in range(count):
        start = heapq.heappop(slots)
        starts.append(start)
        heapq.heappush(slots, start + average)
    return starts


def queue_status(
    effective_limit: int, load: Any, extra: dict[str, Any] | None = None, node: str | None = None
) -> dict[str, Any]:
    """The queue's status as ``node`` (the one answering) sees it: its own concurrency."""
    with db.read_snapshot(Job._meta.database):
        return _queue_status(effective_limit, load, extra, node)


def _queue_status(
    effective_limit: int, load: Any, extra: dict[str, Any] | None, node: str | None
) -> dict[str, Any]:
    now = clock.now()
    state = jobs.queue_state(node)
    running = list(
        Job.select(Job, MediaFile)
        .join(MediaFile)
        .where(Job.status == JobStatus.PROCESSING)
        .order_by(Job.started_at)
    )
    pending = list(jobs.pending_in_order().select_extend(MediaFile).join(MediaFile))
    retrying = list(
        Job.select(Job, MediaFile)
        .join(MediaFile)
        .where(Job.status == JobStatus.RETRYING)
        .order_by(Job.next_attempt_at)
    )
    starts = estimated_starts(len(pending), running, effective_limit, now)
    queue: list[dict[str, Any]] = []
    for job in running:
        queue.append(
            _queue_entry(job)
            | {"started_at": iso(job.started_at), "progress": job.progress, "node": job.node}
        )
    for number, (job, start) in enumerate(zip(pending, starts, strict=True), start=1):
        queue.append(
            _queue_entry(job)
            | {
                "queued_at": iso(job.queued_at),
                "position": number,
                "estimated_start": iso(_held(start, job, effective_limit)),
                "not_before": iso(job.not_before),
            }
        )
    for job in retrying:
        queue.append(
            _queue_entry(job)
            | {
                "next_attempt_at": iso(job.next_attempt_at),
                "error": job.error_message,
                "retry_count": job.retry_count,
            }
        )
    counts = dict(Job.select(Job.status, pw.fn.COUNT(Job.id)).group_by(Job.status).tuples())
    return {
        "active_count": len(running),
        "max_concurrent": state.max_concurrent,
        "effective_concurrency": effective_limit,
        "dynamic_concurrency": state.dynamic_concurrency,
        "pending_count": len(pending),
        "retrying_count": len(retrying),
        "paused": state.paused,
        "queue": queue,
        "statistics": {
            "total_processed": sum(
                counts.get(s, 0) for s in (JobStatus.COMPLETED, JobStatus.PARTIAL, JobStatus.FAILED)
            ),
            "total_failed": counts.get(JobStatus.FAILED, 0),
            "total_partial": counts.get(JobStatus.PARTIAL, 0),
            "total_cancelled": counts.get(JobStatus.CANCELLED, 0),
            "average_time": _round(average_job_seconds()),
        },
        "resources": {
            "cpu_percent": load.cpu_percent if load else None,
            "memory_percent": load.memory_percent if load else None,
            "gpu_percent": load.gpu_percent if load else None,
        },
        **(extra or {}),
    }


def _held(start: float | None, job: Job, effective_limit: int) -> float | None:
    """A job asked not to start before a time starts no earlier than that, history or not;
    while nothing may start (paused, blocked) it has no estimate, its own time or not."""
    if job.not_before is None or effective_limit <= 0:
        return start
    return max(start or job.not_before, job.not_before)


def _queue_entry(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "task_id": job.task_id,
        "file_uuid": job.file.file_uuid,
        "file_name": job.file.name,
        "status": job.status,
        "priority": db.PRIORITY_NAMES[job.priority],
        "processors": job.processors,
    }


def _runs(job: Job) -> list[ProcessorRun]:
    """The job's runs, each ``last_checkpoint`` cut down in the query to what is shown of
    it (``frame``, ``timestamp``). A checkpoint holds the partial result too: parsing
    them all (and collecting the garbage) made every status request cost ~10 ms of CPU
    beside a running job. The rows are only read here: never saved back."""
    postgres = db.is_postgres(ProcessorRun._meta.database)
    fields = [f for f in ProcessorRun._meta.sorted_fields if f is not ProcessorRun.last_checkpoint]
    shown = [_checkpoint_value(key, postgres).alias(f"checkpoint_{key}") for key in _SHOWN]
    query = ProcessorRun.select(*fields, *shown).where(ProcessorRun.job == job.id)
    runs = list(query.order_by(ProcessorRun.position))
    for run in runs:
        values = {key: getattr(run, f"checkpoint_{key}") for key in _SHOWN}
        place = {k: json.loads(v) if postgres else v for k, v in values.items() if v is not None}
        run.last_checkpoint = place or None
    return runs


_SHOWN = ("frame", "timestamp")  # of a checkpoint: where the run is (see run_detail)


def _checkpoint_value(key: str, postgres: bool) -> pw.Node:
    """SQL for ``last_checkpoint[key]`` (NULL when absent): as JSON text on PostgreSQL, the
    number itself on SQLite (json_extract)."""
    if postgres:
        return pw.SQL(f"(last_checkpoint::json -> '{key}')::text")
    return pw.fn.json_extract(ProcessorRun.last_checkpoint, f"$.{key}").coerce(False)


def job_summary(job: Job) -> dict[str, Any]:
    runs = _runs(job)
    return _queue_entry(job) | {
        "progress": job.progress,
        "completed": [r.processor for r in runs if r.status in db.RUN_DONE],
        "failed": [r.processor for r in runs if r.status == RunStatus.FAILED],
        "created_at": iso(job.created_at),
    }


def job_detail(job: Job, effective_limit: int) -> dict[str, Any]:
    with db.read_snapshot(Job._meta.database):
        return _job_detail(Job.get_by_id(job.id), effective_limit)


def queue_place(job_id: int, effective_limit: int) -> tuple[Job, int | None, str | None]:
    """A job as it is now, its place in line and estimated start: what the answer to a
    request that queued it says (job_detail's figures without the rest)."""
    with db.read_snapshot(Job._meta.database):
        job = jobs.get(job_id)
        return job, *_place(job, effective_limit)


def _place(job: Job, effective_limit: int) -> tuple[int | None, str | None]:
    position = jobs.position(job)
    if position is None:
        return None, None
    running = db.fetch(Job, "SELECT * FROM job WHERE status = ?", JobStatus.PROCESSING)
    start = estimated_starts(position, running, effective_limit, clock.now())[-1]
    return position, iso(_held(start, job, effective_limit))


def _job_detail(job: Job, effective_limit: int) -> dict[str, Any]:
    position, estimated = _place(job, effective_limit)
    return _queue_entry(job) | {
        "position": position,
        "estimated_start": estimated,
        "progress": job.progress,
        "retry_count": job.retry_count,
        "max_retries": job.max_retries,
        "task_timeout": job.task_timeout,
        "not_before": iso(job.not_before),
        "crash_count": job.crash_count,
        "cancel_requested": job.cancel_requested,
        "node": job.node,
        "next_attempt_at": iso(job.next_attempt_at),
        "options": job.options,
        "processors": {run.processor: run_detail(run) for run in _runs(job)},
        "created_at": iso(job.created_at),
        "queued_at": iso(job.queued_at),
        "started_at": iso(job.started_at),
        "completed_at": iso(job.completed_at),
        "error_message": job.error_message,
    }


def run_detail(run: ProcessorRun) -> dict[str, Any]:
    detail: dict[str, Any] = {"status": run.status, "attempts": run.attempts}
    if run.progress_total:
        detail.update(
            progress=int(100 * min(run.progress_current / run.progress_total, 1)),
            current=run.progress_current,
            total=run.progress_total,
        )
    elif run.status in db.RUN_DONE:
        detail["progress"] = 100
    checkpoint = run.last_checkpoint or {}
    optional = {
        "output_path": run.output_path,
        "started_at": iso(run.started_at),
        "completed_at": iso(run.completed_at),
        "error": run.error,
        "reason": run.reason,
        "backend": run.backend,
        "model": run.model,
        "last_checkpoint": {k: checkpoint[k] for k in ("frame", "timestamp") if k in checkpoint}
        or None,
    }
    return detail | {k: v for k, v in optional.items() if v is not None}


def list_jobs(statuses: list[str], limit: int, offset: int) -> dict[str, Any]:
    # The page is picked by id alone, from the status index, and only its jobs are read
    # with their files: joined and sorted in one query, every job of those statuses was
    # read for each page, so a long history slowed the TUI's two lists a second.
    chosen = Job.select(Job.id)
    if statuses:
        chosen = chosen.where(Job.status.in_(statuses))
    with db.read_snapshot(Job._meta.database):
        total = chosen.count()
        ids = _page(chosen, (Job.id.desc(),), limit, offset)
        page = Job.select(Job, MediaFile).join(MediaFile).where(Job.id.in_(ids))
        return {
            "jobs": [job_summary(job) for job in page.order_by(Job.id.desc())] if ids else [],
            "total": total,
        }


def _page(chosen: pw.ModelSelect, order: tuple, limit: int, offset: int) -> list[int]:
    """The ids of one page of ``chosen`` (a select of Job.id) in ``order``."""
    return [row[0] for row in chosen.order_by(*order).limit(limit).offset(offset).tuples()]


def dead_jobs(limit: int, offset: int) -> dict[str, Any]:
    """Jobs that ran out of retries (or could not be retried), newest first, with each
    processor's error; a page of them, as the other lists (they pile up with the history)."""
    newest_first = (Job.completed_at.desc(), Job.id.desc())
    chosen = Job.select(Job.id).where(Job.status.in_((JobStatus.FAILED, JobStatus.PARTIAL)))
    with db.read_snapshot(Job._meta.database):
        total = chosen.count()
        ids = _page(chosen, newest_first, limit, offset)
        if not ids:
            return {"jobs": [], "total": total}
        page = Job.select(Job, MediaFile).join(MediaFile).where(Job.id.in_(ids))
        failed: dict[int, dict[str, Any]] = {job_id: {} for job_id in ids}
        runs = (
            ProcessorRun.select(
                ProcessorRun.job, ProcessorRun.processor, ProcessorRun.error, ProcessorRun.attempts
            )
            .where(ProcessorRun.job.in_(ids), ProcessorRun.status == RunStatus.FAILED)
            .order_by(ProcessorRun.job, ProcessorRun.position)
        )
        for run in runs:
            failed[run.job_id][run.processor] = {"error": run.error, "attempts": run.attempts}
        dead = [
            _queue_entry(job)
            | {
                "retry_count": job.retry_count,
                "completed_at": iso(job.completed_at),
                "error_message": job.error_message,
                "failed": failed[job.id],
            }
            for job in page.order_by(*newest_first)
        ]
    return {"jobs": dead, "total": total}


def file_summary(record: MediaFile) -> dict[str, Any]:
    newest = Job.select(Job.status).where(Job.file == record.id).order_by(Job.id.desc()).first()
    return {
        "file_uuid": record.file_uuid,
        "file_name": record.name,
        "path": record.rel_path,
        "state": record.state,
        "reason": record.reason,
        "size": record.size,
        "status": newest.status if newest else None,
    }


def file_detail(record: MediaFile) -> dict[str, Any]:
    history = Job.select().where(Job.file == record.id).order_by(Job.id.desc())
    return file_summary(record) | {
        "duration": record.duration,
        "width": record.width,
        "height": record.height,
        "fps": record.fps,
        "video_codec": record.video_codec,
        "audio_codec": record.audio_codec,
        "fingerprint": record.fingerprint,
        "registered_at": iso(record.registered_at),
        "jobs": [
            {"task_id": j.task_id, "status": j.status, "created_at": iso(j.created_at)}
            for j in history
        ],
    }


def list_files(states: list[str], limit: int, offset: int) -> dict[str, Any]:
    query = MediaFile.select()
    if states:
        query = query.where(MediaFile.state.in_(states))
    total = query.count()
    page = query.order_by(MediaFile.id.desc()).limit(limit).offset(offset)
    return {"files": [file_summary(f) for f in page], "total": total}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
