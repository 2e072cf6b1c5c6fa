"""Settling a run: its outcome (a result, a stop, an error) recorded, with its document."""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import jobs, outputs, store
from ..processors.base import PermanentError, Processor, ProcessorError, Stop, StopReason
from ..store import Job, ProcessorRun

if TYPE_CHECKING:
    from .job_run import JobRun
    from .progress import RunReporter

log = logging.getLogger(__name__)


def settle(
    job_run: JobRun,
    run: ProcessorRun,
    processor: Processor | None,
    reporter: RunReporter,
    outcome: Any,
) -> Stop | None:
    """Record how a run ended: its result, or the exception it ended with."""
    job, out_dir = job_run.job, job_run.out_dir
    last = job_run.runs_left.settled(run)
    problem = job_run.guard.problem()

    def failed(error: str, transient: bool) -> None:
        with reporter.carrying_start() as started:
            fail(job_run, run, processor, reporter.checkpoint, error, transient, started)

    if problem and not isinstance(outcome, BaseException):
        outcome = PermanentError(problem)  # a result for content that is no longer there
    elif not isinstance(outcome, BaseException) and time.monotonic() > job_run.deadline:
        # Returned past its deadline without a report to stop it at: timed out all the
        # same, its result not kept; the job's other parts stop too.
        job_run.shared_stop.stop(StopReason.TIMEOUT)
        outcome = Stop(StopReason.TIMEOUT)
    if (full := disk_full(outcome)) is not None:
        return _wait_for_disk(job_run, run, reporter, full)
    if isinstance(outcome, Stop):
        if outcome.reason != StopReason.SHUTDOWN:  # a shutdown's run resumes with them
            outputs.remove_work(out_dir, run.processor)
        if outcome.reason == StopReason.TIMEOUT:
            limit, source = job.task_timeout, "the job's task_timeout"
            if limit is None:
                limit, source = job_run.config.queue.task_timeout, "queue.task_timeout"
            error = f"timed out after {limit:g} s ({source})"
            failed(error, True)
            return outcome
        partial = None
        if outcome.reason == StopReason.CANCELLED and reporter.checkpoint and processor:
            try:
                partial = stage_output(
                    job,
                    run,
                    processor,
                    outputs.PARTIAL,
                    reporter.checkpoint.get("partial"),
                    None,
                    reporter.checkpoint,
                    out_dir,
                )
            except OSError as exc:  # the checkpoint in the database is kept all the same
                log.warning("job %s: partial output not written: %s", job.task_id, exc)
                job_run.check_disk()
        claim = job_run.claim()
        try:
            with reporter.carrying_start() as started:
                jobs.release_run(claim, run, started, partial)
        finally:
            if partial is not None:
                partial.discard()  # not placed with the record: the job is lost
        return outcome
    if isinstance(outcome, ProcessorError):
        # A read error because the file went away is reported as just that.
        error = problem or message(outcome) or type(outcome).__name__
        log.warning("job %s: %s failed: %s", job.task_id, run.processor, error)
        transient = outcome.transient and not problem
        failed(error, transient)
    elif isinstance(outcome, BaseException):
        log.error("job %s: %s crashed", job.task_id, run.processor, exc_info=outcome)
        failed(describe(outcome), True)
        if isinstance(outcome, OSError):
            job_run.check_disk()
    else:
        assert processor is not None
        try:
            document = stage_output(
                job,
                run,
                processor,
                outputs.COMPLETED,
                outcome,
                None,
                reporter.checkpoint,
                out_dir,
            )
        except store.NotJSON as exc:
            # Not kept as completed: no strict parser could read it. The model gives the
            # same on every try, so not retried.
            error = f"the result cannot be written: {message(exc)}"
            log.error("job %s: %s %s", job.task_id, run.processor, error)
            failed(error, False)
            return None
        except OSError as exc:
            if disk_full(exc) is not None:
                return _wait_for_disk(job_run, run, reporter, exc)
            # A failing disk: the run fails for now and the job retries later.
            error = f"cannot write the result: {message(exc)}"
            log.error("job %s: %s %s", job.task_id, run.processor, error)
            failed(error, True)
            job_run.check_disk()
            return None
        document.companions, reporter.extras = reporter.extras, []
        if last and job_run.shared_stop.reason is None:
            # The job's last run: recorded with the job's finish, in one commit. A crash
            # before it leaves the run to do again, as a crash before complete_run would.
            done = jobs.Completion(run.id, str(document.path), reporter.take_start(), document)
            job_run.runs_left.completions.append(done)
        else:
            claim = job_run.claim()
            try:
                with reporter.carrying_start() as started:
                    jobs.complete_run(claim, run, str(document.path), started, document)
            finally:
                document.discard()  # not placed with the record: the job is lost
        log.info("job %s: %s completed", job.task_id, run.processor)
    return None


def fail(
    job_run: JobRun,
    run: ProcessorRun,
    processor: Processor | None,
    checkpoint: dict[str, Any] | None,
    error: str,
    transient: bool,
    started: jobs.Started | None = None,
) -> None:
    """Record a failed run, and write its document (with the result so far) so the
    results folder tells a failed processor from one that has not run."""
    outputs.remove_work(job_run.out_dir, run.processor)
    document = stage_failed(
        job_run.job, run, processor, checkpoint, error, job_run.out_dir, job_run.check_disk
    )
    claim = job_run.claim()
    try:
        jobs.fail_run(claim, run, error, transient=transient, document=document, started=started)
    finally:
        if document is not None:
            document.discard()  # not placed with the record: the job is lost


def _wait_for_disk(
    job_run: JobRun, run: ProcessorRun, reporter: RunReporter, error: OSError
) -> Stop:
    """A write met a full disk (space or inodes): not the run's fault, so no retry is
    spent. Its work folders go (they may be what filled it), the run goes back to
    pending with its checkpoint, the job's other parts stop, and the job goes back in
    line (JobRun._end) while the gate holds starts back until the disk has room."""
    job = job_run.job
    log.error("job %s: %s stopped, the disk is full: %s", job.task_id, run.processor, error)
    outputs.remove_work(job_run.out_dir, run.processor)
    with reporter.carrying_start() as started:
        jobs.release_run(job_run.claim(), run, started)
    job_run.shared_stop.disk_full = job_run.shared_stop.disk_full or message(error)
    job_run.check_disk()
    return job_run.shared_stop.stop(StopReason.DISK_FULL)


def stage_failed(
    job: Job,
    run: ProcessorRun,
    processor: Processor | None,
    checkpoint: dict[str, Any] | None,
    error: str,
    out_dir: Path,
    check_disk: Callable[[], None],
) -> outputs.Staged | None:
    """The failed document, to place; None when it could not be written."""
    try:
        partial = (checkpoint or {}).get("partial")
        try:
            return stage_output(
                job, run, processor, outputs.FAILED, partial, error, checkpoint, out_dir
            )
        except store.NotJSON:  # a checkpoint saved before they were refused: without it
            return stage_output(job, run, processor, outputs.FAILED, None, error, None, out_dir)
    except OSError as exc:  # the failure is recorded in the database all the same
        log.warning("job %s: %s's failed document not written: %s", job.task_id, run.processor, exc)
        check_disk()
        return None


def stage_output(
    job: Job,
    run: ProcessorRun,
    processor: Processor | None,
    status: str,
    result: Any,
    error: str | None,
    checkpoint: dict[str, Any] | None,
    out_dir: Path,
) -> outputs.Staged:
    """The run's document, written out, to be placed with the run's record."""
    return outputs.stage_result(
        out_dir,
        job,
        run.processor,
        status,
        result,
        error=error,
        checkpoint=checkpoint,
        # A run that failed before it began has no processor: what it was last run with.
        backend=processor.backend if processor else run.backend,
        model=processor.model if processor else run.model,
        version=processor.version if processor else None,
    )


def message(exc: BaseException) -> str:
    """``str(exc)``, whatever that does: an exception whose ``__str__`` raises still ends
    its run with a reason, and what UTF-8 cannot carry (a lone surrogate, a file name's
    undecodable bytes) is escaped, so that the reason can be stored and written."""
    try:
        text = str(exc)
    except Exception:
        text = "(its message cannot be read)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {message(exc)}"


def disk_full(outcome: Any) -> OSError | None:
    """The full disk (ENOSPC, EDQUOT) ``outcome`` ended with, directly or as the cause of
    the error a processor raised; None for any other outcome."""
    seen = 0
    while isinstance(outcome, BaseException) and seen < 8:
        if isinstance(outcome, OSError) and outcome.errno in _DISK_FULL:
            return outcome
        outcome, seen = outcome.__cause__ or outcome.__context__, seen + 1
    return None


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
