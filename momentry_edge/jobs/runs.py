"""A claimed job's runs: started, reporting progress, completed, skipped, failed, released."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import clock, outputs, store, stored_results
from ..events import bus
from ..search import index as search_index
from ..store import Job, JobStatus, MediaFile, ProcessorRun, RunStatus
from . import estimates
from .common import LeaseLost, _now

# What is shown of a checkpoint (the API, result documents), and all a done run keeps.
POSITION_KEYS = ("frame", "timestamp")


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
    started_at: float | None

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
    lost the job never replaces the document of the one that holds it now. It is stored
    in the database with the record too (stored_results), for every node to serve.
    """
    run_id = params[-1]
    if claim is None:
        store.execute(sql, *params)
        if document is not None:
            document.place()
            _keep(run_id, document)
        return
    lock = " FOR SHARE" if store.is_postgres(Job._meta.database) else ""
    sql += (
        " AND EXISTS (SELECT 1 FROM job WHERE id = ? AND status = ? AND lease_owner = ?"
        f" AND started_at = ?{lock})"
    )
    params += (claim.job_id, JobStatus.PROCESSING, claim.owner, claim.started_at)
    with store.write_transaction(Job._meta.database) if document else contextlib.nullcontext():
        if not store.execute(sql, *params).rowcount:
            raise LeaseLost(f"job {claim.job_id} is no longer held by {claim.owner}")
        if document is not None:
            document.place()
            _keep(run_id, document)


def _keep(run_id: int, document: outputs.Staged) -> None:
    """Store the run's document in the database with the run's record, so every node
    serves it."""
    _index(stored_results.keep_staged(run_id, document))


def _index(kept: stored_results.Kept | None) -> None:
    """A completed document's moments into the search index, with the run's record:
    searchable once the run shows done."""
    if kept is not None and kept.status == outputs.COMPLETED:
        search_index.put(kept.file_id, kept.processor, kept.document)


@store.retried
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
        store.execute(sql + " WHERE id = ?", *params, run_id)
        progress = job_progress(job_id)
        sql = (
            "UPDATE job SET progress = ?, lease_until = ?"
            " WHERE id = ? AND lease_owner = ? AND status = ?"
        )
        params = [progress, now + lease_seconds, job_id, owner, JobStatus.PROCESSING]
        if started_at is not None:
            sql += " AND started_at = ?"
            params.append(started_at)
        held = store.execute(sql + " RETURNING cancel_requested, task_id", *params).fetchall()
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
    row = store.execute(sql, *params).fetchone()
    if row is None:
        return "lost"
    return "cancel" if row[0] else None


def job_progress(job_id: int) -> int:
    """Whole-job percent: each processor weighs its expected work (see estimates)."""
    runs = store.execute(
        "SELECT processor, status, progress_current, progress_total FROM processor_run"
        " WHERE job_id = ?",
        job_id,
    ).fetchall()
    return _progress(runs)


def _progress(runs: Sequence[tuple[str, str, int, int]]) -> int:
    """Whole-job percent of (processor, status, current, total) per run."""
    parts = []
    for processor, status, current, total in runs:
        if status in store.RUN_DONE:
            parts.append((processor, 1.0))
        else:
            parts.append((processor, min(current / total, 1.0) if total else 0.0))
    return estimates.weighted_percent(parts, estimates.current())


def run_errors(runs: Sequence[ProcessorRun]) -> str:
    """The runs' errors for the job's message, each error once: processors of one frame pass
    fail with the same error, which then reads "yolo, ocr, face (3 processors): …"."""
    named: dict[str, list[str]] = {}
    for run in runs:
        named.setdefault(str(run.error), []).append(run.processor)
    return "; ".join(
        f"{names[0]}: {error}"
        if len(names) == 1
        else f"{', '.join(names)} ({len(names)} processors): {error}"
        for error, names in named.items()
    )


@dataclass(frozen=True)
class Completion:
    """A run that completed, with where its document is and its start if not written yet;
    ``document``: that document, to put in place with the record (see _write_run)."""

    run_id: int
    output_path: str
    started: Started | None = None
    document: outputs.Staged | None = None


@store.retried
def complete_run(
    claim: Claim,
    run: ProcessorRun | int,
    output_path: str,
    started: Started | None = None,
    document: outputs.Staged | None = None,
) -> None:
    _complete(
        Completion(run if isinstance(run, int) else run.id, output_path, started, document), claim
    )


def _complete(done: Completion, claim: Claim | None) -> None:
    now = clock.now()
    # Progress shows the run whole: its own total when it reported one, else 1 of 1.
    _write_run(
        claim,
        "UPDATE processor_run SET status = ?, output_path = ?, completed_at = ?, error = NULL,"
        " progress_current = CASE WHEN progress_total > 0 THEN progress_total ELSE 1 END,"
        " progress_total = CASE WHEN progress_total > 0 THEN progress_total ELSE 1 END,"
        " last_checkpoint = ?,"
        f" updated_at = ?{_START_SET if done.started else ''} WHERE id = ?",
        RunStatus.COMPLETED,
        done.output_path,
        now,
        _position_only(done.run_id),
        now,
        *_start_params(done.started),
        done.run_id,
        document=done.document,
    )


@store.retried
def skip_run(claim: Claim, run: ProcessorRun, reason: str, output_path: str | None = None) -> None:
    now = clock.now()
    # Another file's result linked in (outputs.duplicate_output) is stored as this run's.
    linked = output_path is not None and reason.startswith("duplicate of ")
    with store.write_transaction(Job._meta.database) if linked else contextlib.nullcontext():
        _write_run(
            claim,
            "UPDATE processor_run SET status = ?, reason = ?, output_path = ?, completed_at = ?,"
            " last_checkpoint = ?, updated_at = ? WHERE id = ?",
            RunStatus.SKIPPED,
            reason,
            output_path,
            now,
            _position_only(run.id),
            now,
            run.id,
        )
        if linked:
            folder = Path(str(output_path)).parent
            _index(stored_results.keep_folder(run.id, run.processor, folder))


def _position_only(run_id: int) -> str | None:
    """The run's checkpoint cut to where it reached (frame, timestamp), for a run that is
    done: what it kept to resume from (an asr run's ``partial`` transcript, a pass's
    detections) is result content, which lives in the results folder alone once written.
    No other writer touches a run's checkpoint while its claim holds the job."""
    row = store.execute("SELECT last_checkpoint FROM processor_run WHERE id = ?", run_id).fetchone()
    checkpoint = ProcessorRun.last_checkpoint.python_value(row[0]) if row else None
    if not isinstance(checkpoint, dict):
        return None
    kept = {k: checkpoint[k] for k in POSITION_KEYS if k in checkpoint}
    return ProcessorRun.last_checkpoint.db_value(kept) if kept else None


@store.retried
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


def documented(run: ProcessorRun, document: outputs.Staged) -> None:
    """Place and record the failed document written after the run was failed (its job is
    parked already, so nothing else would tell the event stream and the mirror)."""
    if _documented(run, document):
        bus.publish("job.documented", task_id=run.job.task_id, processor=run.processor)


@store.retried
def _documented(run: ProcessorRun, document: outputs.Staged) -> int:
    with store.write_transaction(Job._meta.database):
        output_path = str(document.place())
        updated = (
            ProcessorRun.update(output_path=output_path)
            .where(ProcessorRun.id == run.id, ProcessorRun.status == RunStatus.FAILED)
            .execute()
        )
        if updated:
            _keep(run.id, document)
        return int(updated)


@store.retried
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
