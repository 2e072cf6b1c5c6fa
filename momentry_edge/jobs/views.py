"""Read-only views of the tables, shaped as API.md's JSON. Nothing here writes."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import peewee as pw

from .. import clock, jobs, store
from ..clock import iso
from ..errors import Invalid
from ..store import FileState, Job, JobStatus, MediaFile, ProcessorRun, RunStatus
from ..words import fold
from . import capacity, estimates, order
from .capacity import Capacity, Here


def running_left(running: Sequence[Job], rates: estimates.Rates, now: float) -> dict[int, float]:
    """Seconds left of each running job (``running`` with their files), where known."""
    done: dict[int, dict[str, float]] = {job.id: {} for job in running}
    if running:
        runs = ProcessorRun.select(
            ProcessorRun.job,
            ProcessorRun.processor,
            ProcessorRun.status,
            ProcessorRun.progress_current,
            ProcessorRun.progress_total,
        ).where(ProcessorRun.job.in_(list(done)))
        for run in runs:
            done[run.job_id][run.processor] = _fraction(run)
    left = {}
    for job in running:
        elapsed = max(now - (job.started_at or now), 0)
        seconds = rates.remaining(done[job.id], job.file.duration, elapsed, job.progress or 0)
        if seconds is not None:
            left[job.id] = seconds
    return left


def _fraction(run: ProcessorRun) -> float:
    if run.status in store.RUN_DONE:
        return 1.0
    return min(run.progress_current / run.progress_total, 1.0) if run.progress_total else 0.0


def _line(limit: int, offset: int = 0) -> list[tuple[Sequence[str], float | None]]:
    """Processors and media duration of the pending jobs in line order, from ``offset``."""
    query = (
        jobs.pending_in_order()
        .select(Job.processors, MediaFile.duration)
        .join(MediaFile)
        .limit(limit)
        .offset(offset)
    )
    return store.rows(query)


def _work_ahead(count: int, rates: estimates.Rates) -> float | None:
    """Expected seconds of the first ``count`` pending jobs together, summed in the database
    by processor set (a job far down a long line is not estimated job by job)."""
    if count <= 0:
        return 0.0
    first = (
        jobs.pending_in_order()
        .select(pw.Cast(Job.processors, "text").alias("names"), MediaFile.duration)
        .join(MediaFile)
        .limit(count)
    )
    sql, params = first.sql()
    rows = store.execute(
        f"SELECT names, SUM(duration), COUNT(*) - COUNT(duration) FROM ({sql}) AS first_jobs"
        " GROUP BY names",
        *params,
    ).fetchall()
    work = 0.0
    for names, seconds, unknown in rows:
        processors = json.loads(names)
        if seconds:
            work += rates.job_seconds(processors, seconds) or 0.0
        if unknown:
            if rates.average_job is None:
                return None
            work += unknown * rates.average_job
    return work


def queue_status(
    here: Here | int,
    load: Any,
    extra: dict[str, Any] | None = None,
    node: str | None = None,
    limit: int = 50,
    offset: int = 0,
    stall_after: float | None = None,
    shown: order.Shown = order.EVERY_WAITING_JOB,
) -> dict[str, Any]:
    """The queue's status as ``node`` (the one answering) sees it: its own concurrency.
    ``queue`` holds the running jobs and a page (``limit``, ``offset``) of the waiting ones;
    a running job without progress for ``stall_after`` seconds is marked stalled; a waiting
    one no node can run says why (``stranded``)."""
    rates = _rates()
    here = here if isinstance(here, Here) else Here(None, here)
    with store.read_snapshot(Job._meta.database):
        return _queue_status(here, load, extra, node, limit, offset, rates, stall_after, shown)


def last_progress(running: list[Job]) -> dict[int, float]:
    """job id -> when each of the ``running`` jobs last reported progress (a report of any
    of its running processors), else when it started."""
    reported = (
        dict(
            store.rows(
                ProcessorRun.select(ProcessorRun.job, pw.fn.MAX(ProcessorRun.updated_at))
                .where(
                    ProcessorRun.job.in_([job.id for job in running]),
                    ProcessorRun.status == RunStatus.RUNNING,
                )
                .group_by(ProcessorRun.job)
            )
        )
        if running
        else {}
    )
    return {job.id: max(reported.get(job.id) or 0.0, job.started_at or 0.0) for job in running}


def _rates() -> estimates.Rates:
    # Taken before a view's snapshot, never inside it: a snapshot begun before a job's end
    # was committed would measure without that job just after the end cleared the cached
    # rates, and keep the stale figures for estimates.REFRESH.
    return estimates.current(latest=True)


def _queue_status(
    here: Here,
    load: Any,
    extra: dict[str, Any] | None,
    node: str | None,
    limit: int,
    offset: int,
    rates: estimates.Rates,
    stall_after: float | None = None,
    shown: order.Shown = order.EVERY_WAITING_JOB,
) -> dict[str, Any]:
    now = clock.now()
    state = jobs.queue_state(node)
    counts = dict(store.rows(Job.select(Job.status, pw.fn.COUNT(Job.id)).group_by(Job.status)))
    pending_count = counts.get(JobStatus.PENDING, 0)
    running = list(
        Job.select(Job, MediaFile)
        .join(MediaFile)
        .where(Job.status == JobStatus.PROCESSING)
        .order_by(Job.started_at)
    )
    pending, retrying, shown_count = order.waiting_page(shown, limit, offset, counts)
    left = running_left(running, rates, now)
    progressed = last_progress(running)
    waiting = [(job.processors, job.file.duration) for job in pending]
    nodes = capacity.read(here, now)
    ends = [(job.node, now + left.get(job.id, 0.0)) for job in running]
    free = capacity.slots(nodes, ends, now)
    if shown.everything:
        positions = list(range(offset + 1, offset + 1 + len(pending)))
        starts = _starts_after(offset, waiting, free, nodes, rates)
    else:  # not one run of the line: each job's place and start of its own
        positions = [jobs.position(job) or 0 for job in pending]
        starts = capacity.starts_at(positions, waiting, free, nodes, rates)
    queue: list[dict[str, Any]] = []
    for job in running:
        queue.append(
            _queue_entry(job)
            | {
                "started_at": iso(job.started_at),
                "progress": job.progress,
                "node": job.node,
                "estimated_end": iso(now + left[job.id]) if job.id in left else None,
                "progress_at": iso(progressed[job.id] or None),
                "stalled": bool(stall_after and now - progressed[job.id] > stall_after),
            }
        )
    for number, job, start in zip(positions, pending, starts, strict=True):
        queue.append(
            _queue_entry(job)
            | {
                "queued_at": iso(job.queued_at),
                "position": number,
                "estimated_start": iso(_held(start, job, nodes)),
                "not_before": iso(job.not_before),
                "stranded": nodes.why_not(job.processors),
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
    return {
        "active_count": len(running),
        "max_concurrent": state.max_concurrent,
        "effective_concurrency": here.limit,
        "dynamic_concurrency": state.dynamic_concurrency,
        "pending_count": pending_count,
        "retrying_count": counts.get(JobStatus.RETRYING, 0),
        "shown_count": shown_count,  # the waiting jobs the filter (status, folder) selects
        "paused": state.paused,
        "queue": queue,
        "statistics": {
            "total_processed": sum(
                counts.get(s, 0) for s in (JobStatus.COMPLETED, JobStatus.PARTIAL, JobStatus.FAILED)
            ),
            "total_failed": counts.get(JobStatus.FAILED, 0),
            "total_partial": counts.get(JobStatus.PARTIAL, 0),
            "total_cancelled": counts.get(JobStatus.CANCELLED, 0),
            "average_time": _round(rates.average_job),
        },
        "resources": {
            "cpu_percent": load.cpu_percent if load else None,
            "memory_percent": load.memory_percent if load else None,
            "gpu_percent": load.gpu_percent if load else None,
        },
        **(extra or {}),
    }


def _held(start: float | None, job: Job, nodes: Capacity) -> float | None:
    """A job asked not to start before a time starts no earlier than that, history or not;
    while no node may start it (paused, blocked, none can run it) it has no estimate, its
    own time or not."""
    if job.not_before is None or not any(t.limit > 0 for t in nodes.takers_of(job.processors)):
        return start
    return max(start or job.not_before, job.not_before)


def _queue_entry(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "task_id": job.task_id,
        "file_uuid": job.file.file_uuid,
        "file_name": job.file.name,
        "status": job.status,
        "priority": store.PRIORITY_NAMES[job.priority],
        "processors": job.processors,
    }


def _runs(job: Job) -> list[ProcessorRun]:
    """The job's runs, each ``last_checkpoint`` cut down in the query to what is shown of
    it (``frame``, ``timestamp``). A checkpoint holds the partial result too: parsing
    them all (and collecting the garbage) made every status request cost ~10 ms of CPU
    beside a running job. The rows are only read here: never saved back."""
    postgres = store.is_postgres(ProcessorRun._meta.database)
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


def _checkpoint_value(key: str, postgres: bool) -> Any:
    """SQL for ``last_checkpoint[key]`` (NULL when absent): as JSON text on PostgreSQL, the
    number itself on SQLite (json_extract)."""
    if postgres:
        return pw.SQL(f"(last_checkpoint::json -> '{key}')::text")
    return pw.fn.json_extract(ProcessorRun.last_checkpoint, f"$.{key}").coerce(False)


def job_summary(job: Job, resolved_by: str | None = None) -> dict[str, Any]:
    runs = _runs(job)
    summary = _queue_entry(job) | {
        "progress": job.progress,
        "completed": [r.processor for r in runs if r.status in store.RUN_DONE],
        "failed": [r.processor for r in runs if r.status == RunStatus.FAILED],
        "created_at": iso(job.created_at),
    }
    if job.status in (JobStatus.FAILED, JobStatus.PARTIAL):
        summary |= {"error": job.error_message, "resolved_by": resolved_by}
    elif job.status == JobStatus.CANCELLED:
        summary["error"] = job.error_message  # why: cancelled by user, cleared from the queue
    return summary


def resolved() -> pw.Node:
    """SQL: the job (failed or partial) has a later job of its file that completed (the
    file uploaded again, or the job retried as new): it is no longer a failure."""
    later = Job.alias()
    newer = later.select(pw.SQL("1")).where(
        later.file == Job.file, later.id > Job.id, later.status == JobStatus.COMPLETED
    )
    return pw.fn.EXISTS(newer)


def _resolvers(page: list[Job]) -> dict[int, str]:
    """job id -> task_id of the later completed job of its file, for the failed in ``page``."""
    failed = [j for j in page if j.status in (JobStatus.FAILED, JobStatus.PARTIAL)]
    if not failed:
        return {}
    later = (
        Job.select(Job.file, Job.id, Job.task_id)
        .where(Job.file.in_({j.file_id for j in failed}), Job.status == JobStatus.COMPLETED)
        .order_by(Job.id)
    )
    completed: dict[int, list[tuple[int, str]]] = {}
    for file_id, job_id, task_id in store.rows(later):
        completed.setdefault(file_id, []).append((job_id, task_id))
    found = {}
    for job in failed:
        after = [task for job_id, task in completed.get(job.file_id, []) if job_id > job.id]
        if after:
            found[job.id] = after[0]
    return found


def job_detail(job: Job, here: Here | int) -> dict[str, Any]:
    rates = _rates()
    here = here if isinstance(here, Here) else Here(None, here)
    with store.read_snapshot(Job._meta.database):
        return _job_detail(Job.get_by_id(job.id), here, rates)


def queue_place(job_id: int, here: Here) -> tuple[Job, int | None, str | None]:
    """A job as it is now, its place in line and estimated start: what the answer to a
    request that queued it says (job_detail's figures without the rest)."""
    rates = _rates()
    with store.read_snapshot(Job._meta.database):
        job = jobs.get(job_id)
        position, start, _ = _place(job, here, rates)
        return job, position, start


def _place(
    job: Job, here: Here, rates: estimates.Rates
) -> tuple[int | None, str | None, str | None]:
    """The job's place in line, its estimated start, and why no node can run it (if so)."""
    position = jobs.position(job)
    if position is None:
        return None, None, None
    now = clock.now()
    running = list(
        Job.select(Job, MediaFile).join(MediaFile).where(Job.status == JobStatus.PROCESSING)
    )
    left = running_left(running, rates, now)
    nodes = capacity.read(here, now)
    ends = [(r.node, now + left.get(r.id, 0.0)) for r in running]
    waiting = _line(1, position - 1)
    start = _starts_after(position - 1, waiting, capacity.slots(nodes, ends, now), nodes, rates)
    return position, iso(_held(start[-1], job, nodes)), nodes.why_not(job.processors)


def _starts_after(
    ahead: int,
    waiting: Sequence[tuple[Sequence[str], float | None]],
    free: dict[str, list[float]],
    nodes: Capacity,
    rates: estimates.Rates,
) -> list[float | None]:
    """Estimated starts of ``waiting`` (in line order), behind ``ahead`` pending jobs."""
    if not free:
        return [None] * len(waiting)
    if ahead:
        work = _work_ahead(ahead, rates)
        if work is None:
            return [None] * len(waiting)
        free = capacity.level(free, work)
    return capacity.estimated_starts(waiting, free, nodes, rates)


def _estimated_end(job: Job, rates: estimates.Rates) -> str | None:
    """When a running job should end (see estimates); None for any other."""
    if job.status != JobStatus.PROCESSING:
        return None
    now = clock.now()
    left = running_left([job], rates, now).get(job.id)
    return None if left is None else iso(now + left)


def _job_detail(job: Job, here: Here, rates: estimates.Rates) -> dict[str, Any]:
    position, estimated, stranded = _place(job, here, rates)
    return _queue_entry(job) | {
        "position": position,
        "estimated_start": estimated,
        "stranded": stranded,
        "progress": job.progress,
        "retry_count": job.retry_count,
        "max_retries": job.max_retries,
        "task_timeout": job.task_timeout,
        "not_before": iso(job.not_before),
        "crash_count": job.crash_count,
        "cancel_requested": job.cancel_requested,
        "node": job.node,
        "next_attempt_at": iso(job.next_attempt_at),
        "estimated_end": _estimated_end(job, rates),
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
    elif run.status in store.RUN_DONE:
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


def list_jobs(
    statuses: list[str], limit: int, offset: int, files: pw.Expression | None = None
) -> dict[str, Any]:
    """A page of jobs, newest first; of ``statuses`` and the files ``files`` selects."""
    # The page is picked by id alone, from the status index, and only its jobs are read
    # with their files: joined and sorted in one query, every job of those statuses was
    # read for each page, so a long history slowed the TUI's two lists a second.
    chosen = Job.select(Job.id)
    if statuses:
        chosen = chosen.where(Job.status.in_(statuses))
    if files is not None:
        chosen = chosen.join(MediaFile).where(files)
    with store.read_snapshot(Job._meta.database):
        total = chosen.count()
        ids = _page(chosen, (Job.id.desc(),), limit, offset)
        page = list(
            Job.select(Job, MediaFile)
            .join(MediaFile)
            .where(Job.id.in_(ids))
            .order_by(Job.id.desc())
        )
        resolvers = _resolvers(page)
        return {"jobs": [job_summary(job, resolvers.get(job.id)) for job in page], "total": total}


def _page(chosen: Any, order: tuple, limit: int, offset: int) -> list[int]:
    """The ids of one page of ``chosen`` (a select of Job.id) in ``order``."""
    return [row[0] for row in store.rows(chosen.order_by(*order).limit(limit).offset(offset))]


def dead_jobs(limit: int, offset: int) -> dict[str, Any]:
    """Jobs that ran out of retries (or could not be retried), newest first, with each
    processor's error; a page of them, as the other lists (they pile up with the history).
    A job whose file completed a later job is no longer a failure: it is left out; so is
    one whose file was rejected (not a readable video): the file's list of rejected files
    says why, once."""
    newest_first = (Job.completed_at.desc(), Job.id.desc())
    ended_badly = Job.status.in_((JobStatus.FAILED, JobStatus.PARTIAL))
    unresolved = ~resolved()  # type: ignore[operator]
    readable = MediaFile.state != FileState.REJECTED
    chosen = Job.select(Job.id).join(MediaFile).where(ended_badly, unresolved, readable)
    with store.read_snapshot(Job._meta.database):
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
        "hdr": record.hdr,
        "sample_aspect_ratio": record.sample_aspect_ratio,
        "mirrored": record.mirrored,
        "fingerprint": record.fingerprint,
        "registered_at": iso(record.registered_at),
        "jobs": [
            {"task_id": j.task_id, "status": j.status, "created_at": iso(j.created_at)}
            for j in history
        ],
    }


def list_files(
    states: list[str], limit: int, offset: int, name: str | None = None
) -> dict[str, Any]:
    query = MediaFile.select()
    if states:
        query = query.where(MediaFile.state.in_(states))
    if name and ("\0" in name or len(name) > 1000):
        raise Invalid("name must be at most 1000 characters, without NUL")
    if name:  # a part of the name, in any case or accents (LIKE's wildcards taken as themselves)
        query = query.where(name_like(name))
    total = query.count()
    page = query.order_by(MediaFile.id.desc()).limit(limit).offset(offset)
    return {"files": [file_summary(f) for f in page], "total": total}


def name_like(part: str) -> pw.Node:
    """Files whose name holds ``part``, as searches compare names (words.fold)."""
    escaped = re.sub(r"([\\%_])", r"\\\1", fold(part))
    return pw.NodeList(
        (MediaFile.folded_name, pw.SQL("LIKE"), f"%{escaped}%", pw.SQL("ESCAPE '\\'"))
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
