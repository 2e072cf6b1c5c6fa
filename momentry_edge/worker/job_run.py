"""One claimed job's run, top to bottom: the file checked, the processors grouped by the
work they share, the groups run side by side, each run settled, the job's end recorded.
A job's parts share one JobRun; a ``Stop`` in one stops the others at their next report."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import clock, jobs, outputs, store
from ..ingest import guard as file_guard
from ..processors import sharing
from ..processors.base import Processor, ProcessorError, RunContext, Stop, StopReason
from ..store import Job, JobStatus, ProcessorRun
from . import settle
from .progress import PendingStart, RunReporter

if TYPE_CHECKING:
    from .dispatch import Workers

log = logging.getLogger(__name__)

# A job's processors run on threads of their own (runners) while its part thread watches
# them: a run told to stop (past its task_timeout, cancelled, the service stopping) that
# has not returned this many seconds later is given up, its thread left to it.
ABANDON_GRACE = 10.0
WATCH_TICK = 0.5  # seconds between the part thread's looks at a run it waits for
STOP_POLL = 2.0  # seconds a run may say nothing before the database is asked for a cancel
SAME_CONTENT_POLL = 2.0  # seconds between looks of a job waiting for a copy's results
# Seconds a job that met a full disk waits before it may start again: the gate holds it
# longer while the disk stays below queue.min_free_disk_mb or queue.min_free_inodes.
DISK_FULL_WAIT = 30.0
_CPUS = os.cpu_count() or 1


class JobRun:
    """One run of one claimed job, on the worker thread that claimed it (and, for its
    parts, on helper threads beside it). ``host`` is the process's Workers: its owner id,
    settings, the processor pool and the jobs it holds."""

    # One piece (~370 lines): one job's run reads top to bottom here.

    def __init__(self, host: Workers, job: Job) -> None:
        self.host = host
        self.job = job
        self.config = host.config
        self.owner = host.owner
        self.stopping = host.stopping  # the service is stopping
        self.lease_seconds = host.config.queue.lease_seconds
        self.out_dir = outputs.results_dir(self.config.data_dir, job.file.file_uuid)
        self.media_path = Path(job.file.path)
        self.deadline = time.monotonic() + (job.task_timeout or self.config.queue.task_timeout)
        self.shared_stop = SharedStop()
        self.runs_left = RunsLeft([])
        self.frame_threads = 1  # the threads the frame pass gets (sharing.frame_pass_threads)
        self.guard: file_guard.FileGuard

    # -- what the job's parts and its reporters ask -----------------------------------------

    def claim(self) -> jobs.Claim:
        return jobs.Claim.of(self.job, self.owner)

    def under_way(self) -> None:
        self.host.under_way(self.job.id)

    def lease_ran_out(self) -> bool:
        return self.host.lease_ran_out(self.job.id)

    def renewed(self, at: float) -> None:
        self.host.renewed(self.job.id, at)

    def check_disk(self) -> None:
        """A write failed: if the disk is full, stop admitting jobs now, not at the next sample."""
        with contextlib.suppress(OSError):
            self.host.gate.check_disk(*outputs.written_folders(self.config.data_dir))

    # -- the run ----------------------------------------------------------------------------

    def run(self, following: list[Job]) -> str:
        """Run the job; returns its status. A worker that goes on draining claims the next
        job in the commit that finishes this one, and puts it in ``following``."""
        job = self.job
        log.info("job %s started: %s", job.task_id, ", ".join(job.processors))
        # Read all rows first: an open SQLite cursor would pin an old snapshot and make
        # the writes below fail with "database is locked".
        runs = jobs.pending_runs(job.id)
        self.guard = file_guard.FileGuard(job.file)  # deleted or replaced while we work
        quiet = self.config.ingest.settle_seconds
        try:
            if self.guard.replaced:  # since it was registered: perhaps still being written to
                file_guard.check_arriving(job.file, quiet, "it changed after it was registered")
            elif self.guard.problem() is None and (
                reason := file_guard.unusable(job.file, quiet=quiet)
            ):
                return self._reject(runs, reason)
        except file_guard.StillArriving as arriving:
            return self._wait_for_writer(arriving)
        if other := jobs.same_content_under_way(job, [run.processor for run in runs]):
            return self._wait_for_same_content(other)
        batches, parts = self._plan(runs)
        # Made here with the results' mode and group: a processor that makes it itself
        # (a plugin's mkdir) would give it the process's private umask.
        outputs.make_dir(self.out_dir)
        self.runs_left = RunsLeft(runs)
        error = side_by_side([functools.partial(self._run_part, b) for b in batches], parts)
        try:
            status = self._end(following, error)
        finally:  # documents not placed with their record (the job lost) are not left behind
            for done in self.runs_left.completions:
                if done.document is not None:
                    done.document.discard()
        log.info("job %s %s", job.task_id, status)
        if status == JobStatus.RETRYING:
            due = Job.get_by_id(job.id).next_attempt_at  # set with the retrying status
            self.host.kick(delay=(due or clock.now()) - clock.now())
        # Replaced while this job ran, or since its last look (before its finish): the new
        # content, if registered meanwhile, joined this job and is queued now.
        if self.guard.replaced or self.guard.problem() is not None:
            file_guard.requeue_replaced(job, job.file)
        return status

    def _plan(self, runs: list[ProcessorRun]) -> tuple[list[list[ProcessorRun]], int]:
        """The job's runs grouped by the work they share (sharing.groups), and how many
        groups run at once; notes the threads the job holds now (until now, its budget)."""
        names = [run.processor for run in runs]
        batches = [[runs[i] for i in group] for group in sharing.groups(names, self._peek)]
        budget = self.host.budget()
        parts = max(1, min(budget, len(batches)))
        for batch in batches:
            threads = sharing.frame_pass_threads([r.processor for r in batch], self._peek, budget)
            if threads is not None:
                self.frame_threads = threads
                break
        self.host.hold_threads(self.job.id, max(parts, self.frame_threads))
        return batches, parts

    def _peek(self, name: str) -> Processor | None:
        """An instance of a processor to look at, not to run; None if broken."""
        try:
            return self.host.pool.peek(name)
        except Exception:
            return None  # a broken plugin fails in _begin, with its error recorded

    def _end(self, following: list[Job], error: BaseException | None) -> str:
        """Record how the job's run ended, if the job is still this worker's (else raise
        LeaseLost); returns its status."""
        job, reason, done = self.job, self.shared_stop.reason, self.runs_left.completions
        if reason == StopReason.LEASE or isinstance(error, jobs.LeaseLost):
            raise jobs.LeaseLost(job.task_id)
        if error is not None or reason is not None:
            for completion in done:  # recorded on their own, as the job is not finished
                jobs.complete_run(
                    self.claim(),
                    completion.run_id,
                    completion.output_path,
                    completion.started,
                    completion.document,
                )
        if error is not None:
            raise error  # outside the processors: the job is given back (Workers.run_job)
        if reason == StopReason.SHUTDOWN:
            status = jobs.requeue(job, self.owner)
            log.info("job %s at shutdown: %s", job.task_id, status)
            return status
        if reason == StopReason.DISK_FULL:
            why = f"waiting for disk space: {self.shared_stop.disk_full}"
            status = jobs.requeue(job, self.owner, clock.now() + DISK_FULL_WAIT, why)
            log.warning("job %s back in line: %s", job.task_id, why)
            self.host.kick(delay=DISK_FULL_WAIT)
            return status
        if self.stopping.is_set() or self.host.crowded(job.id):
            # Two drains of jobs that end at once (the second woken as one ran on a while,
            # or both at once by a burst): this one steps back.
            return jobs.finish(job, self.owner, self.host.policy, completed=done)
        status, claimed = jobs.finish_and_claim(
            job, self.owner, self.host.policy, self.host.claim_request(), done
        )
        following.extend([claimed] if claimed else [])
        return status

    def _wait_for_writer(self, arriving: file_guard.StillArriving) -> str:
        """Back in line until its file has been quiet for settle_seconds: what more is
        written meanwhile joins this job (jobs.submit), and a file still broken then is
        rejected."""
        job = self.job
        status = jobs.requeue(job, self.owner, not_before=arriving.until)
        log.info(
            "job %s: %s was written to moments ago (%s): waiting until it is quiet",
            job.task_id,
            job.file.rel_path,
            arriving.reason,
        )
        self.host.kick(delay=arriving.until - clock.now())
        return status

    def _wait_for_same_content(self, other: Job) -> str:
        """Back in line while ``other`` processes a copy of this file: its results are
        linked once it is done (a look every few seconds, which costs two commits)."""
        job = self.job
        why = f"waiting for job {other.task_id}, which is processing the same content"
        status = jobs.requeue(job, self.owner, not_before=clock.now() + SAME_CONTENT_POLL, why=why)
        if job.error_message != why:  # said once, not at every look
            log.info("job %s: %s", job.task_id, why)
        self.host.kick(delay=SAME_CONTENT_POLL)
        return status

    def _reject(self, runs: list[ProcessorRun], reason: str) -> str:
        """The file is rejected, e.g. by the probe it was queued without (guard.unusable):
        the job fails with the reason, no processor runs and no result is written. Not
        retried: a file rejected for a cause that may pass is looked at again by ingest,
        which queues it anew once it reads."""
        error = f"file rejected: {reason}"
        claim = self.claim()
        for run in runs:
            jobs.fail_run(claim, run, error, transient=False)
        status = jobs.finish(self.job, self.owner, self.host.policy)
        log.warning("job %s %s: %s", self.job.task_id, status, error)
        return status

    # -- one part: a processor, or a group that shares its work -----------------------------

    def _run_part(self, batch: list[ProcessorRun]) -> None:
        """One part of the job, beside the others."""
        if self.shared_stop.reason is not None:
            return  # the job is stopping: these runs stay to do
        try:
            if problem := self.guard.problem():
                for run in batch:
                    self.runs_left.settled(run)
                    settle.fail(self, run, None, run.last_checkpoint, problem, False)
                return
            with contextlib.suppress(Stop):  # shared_stop has the reason; _end acts on it
                self._run_batch(batch)
        except jobs.LeaseLost:
            self.shared_stop.stop(StopReason.LEASE)  # the other parts stop at their next report

    def _run_batch(self, runs: list[ProcessorRun]) -> None:
        """Run one processor, or several sharing their work (one decode, one transcription).
        Each run keeps its own status, progress, checkpoint, error and output file; one
        failing does not fail the others. A ``Stop`` is raised after every run is recorded."""
        job = self.job
        with self.host.pool.lending() as loan:
            take = loan.take
            started = []
            for run in runs:
                reporter = RunReporter(self, run)
                try:
                    processor = loan.take_idle(run.processor) or self._load(
                        run.processor, take, reporter
                    )
                    begun = self._begin(run, processor, reporter)
                except BaseException as exc:  # a plugin's own, whatever it raises
                    if reporter.start is None:
                        # It failed before it began (its processor would not load, or is
                        # not ready): an attempt all the same, or it would retry for ever.
                        reporter.start = PendingStart(self.claim(), run.id, run.backend, run.model)
                    settle.settle(self, run, None, reporter, exc)
                    continue
                if begun is not None:
                    started.append((run, processor, begun, reporter))
                else:
                    self.runs_left.settled(run)  # skipped
            members = [(processor, ctx) for _, processor, ctx, _ in started]
            names = [run.processor for run, *_ in started]

            def outcomes_of_members() -> list[Any]:
                try:
                    return sharing.run_together(
                        self.media_path,
                        members,
                        self.frame_threads,
                        spare=lambda slot: take(names[slot]),
                    )
                finally:
                    store.release_connection()

            reporters = [reporter for *_, reporter in started]
            outcomes = self._await(names, outcomes_of_members, reporters)
            if outcomes is None:  # given up: its processors are not lent again
                loan.lost = True
                outcomes = [Stop(self.shared_stop.reason or StopReason.TIMEOUT)] * len(started)
            stop = None
            for (run, processor, _, reporter), outcome in zip(started, outcomes, strict=True):
                try:
                    settled = settle.settle(self, run, processor, reporter, outcome)
                    stop = settled or stop
                except (jobs.LeaseLost, *store.OUTAGE_ERRORS):
                    # The job lost (nothing more of it is written), or the database away past
                    # every retry (the whole job is given back).
                    raise
                except Exception as exc:  # e.g. its output cannot be written: others settle
                    log.error("job %s: %s not recorded", job.task_id, run.processor, exc_info=exc)
                    jobs.fail_run(
                        self.claim(),
                        run,
                        settle.describe(exc),
                        transient=True,
                        started=reporter.take_start(),
                    )
                finally:  # the run's extra files, unless they went with its document
                    for extra in reporter.extras:
                        extra.discard()
            if stop is not None:
                raise stop

    def _load(
        self, name: str, take: Callable[[str], Processor], reporter: RunReporter
    ) -> Processor:
        """A new instance of processor ``name``, loaded on a runner: a model's load can hang
        as its run can."""
        loaded = self._await([name], lambda: [take(name)], [reporter])
        if loaded is None:
            raise Stop(self.shared_stop.reason or StopReason.TIMEOUT)
        return loaded[0]

    def _await(
        self, names: list[str], body: Callable[[], list[Any]], reporters: list[RunReporter]
    ) -> list[Any] | None:
        """``body``'s outcomes, run on a runner thread; None when it was given up: told to
        stop (see ``_stop_reason``) and still not returned ABANDON_GRACE later."""
        if not reporters:
            return []
        call = self.host.runners.start(body)
        looked = time.monotonic()
        give_up_at = None
        while not call.done.wait(WATCH_TICK):
            now = time.monotonic()
            if give_up_at is None:
                silent = now - max(looked, *(r.last_write for r in reporters)) >= STOP_POLL
                if silent:
                    looked = now
                if reason := self._stop_reason(now, silent):
                    self.shared_stop.stop(reason)  # a run that reports stops at its next report
                    give_up_at = now + ABANDON_GRACE
            elif now >= give_up_at:
                for reporter in reporters:
                    reporter.abandoned = True  # a late report writes nothing, and stops it
                log.error(
                    "job %s: %s did not return %g s after it was told to stop (%s); its"
                    " thread is left to it, and the job goes on without it",
                    self.job.task_id,
                    ", ".join(names),
                    ABANDON_GRACE,
                    self.shared_stop.reason,
                )
                return None
        return call.result()

    def _stop_reason(self, now: float, ask: bool) -> StopReason | None:
        """Why a running batch should stop, if it should; ``ask``: the database too (a
        cancel, the job taken over), which a run that reports hears at its report."""
        if self.shared_stop.reason is not None:
            return self.shared_stop.reason
        if self.stopping.is_set():
            return StopReason.SHUTDOWN
        if now > self.deadline:
            return StopReason.TIMEOUT
        if not ask:
            return None
        try:
            asked = jobs.stop_asked(self.job.id, self.owner, self.job.started_at)
        except store.OUTAGE_ERRORS:
            store.after_outage()
            return None  # asked again later; the heartbeat keeps the lease meanwhile
        return {"cancel": StopReason.CANCELLED, "lost": StopReason.LEASE}.get(asked or "")

    def _begin(
        self, run: ProcessorRun, processor: Processor, reporter: RunReporter
    ) -> RunContext | None:
        """Mark the run started and give its context; None when it is skipped."""
        job = self.job
        if not job.options.get("force") and (
            duplicate := outputs.duplicate_output(
                job.file, run.processor, processor.model, processor.version, self.out_dir
            )
        ):
            # This content was processed already.
            jobs.skip_run(self.claim(), run, *duplicate)
            log.info("job %s: %s skipped: %s", job.task_id, run.processor, duplicate[0])
            return None
        if reason := processor.not_applicable(self.media_path):
            jobs.skip_run(self.claim(), run, reason)
            log.info("job %s: %s skipped: %s", job.task_id, run.processor, reason)
            return None
        state = processor.readiness()
        if not state.ready and self.host.provision is not None:
            state = self.host.provision.readiness(run.processor, state)  # e.g. why a pull failed
        if not state.ready:
            raise ProcessorError(state.reason or "not ready", transient=False)
        start = PendingStart(self.claim(), run.id, processor.backend, processor.model)
        if job.crash_count:
            # It has taken the process down before: marked running at once, so that a crash
            # loop names the run it happens in (jobs._recover).
            start.write()
            self.under_way()
        else:
            self.host.starter.add(start)
        reporter.start = start
        if run.last_checkpoint:
            log.info("job %s: %s resumes from its checkpoint", job.task_id, run.processor)
        return RunContext(
            media_path=self.media_path,
            output_dir=self.out_dir,
            checkpoint=run.last_checkpoint,
            attempt=run.attempts + 1,
            _report=reporter.report,
            _extras=reporter.extras,
        )


def job_threads(configured: int) -> int:
    """The threads one job may use (``queue.job_threads``, 0: one per CPU)."""
    return configured or _CPUS


def side_by_side(branches: list[Callable[[], None]], threads: int) -> BaseException | None:
    """Run ``branches`` in order on ``threads`` threads, this one among them (one: one
    after another, as a job always ran); the first error, after which none starts."""
    todo = deque(branches)
    errors: list[BaseException] = []

    def work() -> None:
        while not errors:
            try:
                branch = todo.popleft()
            except IndexError:
                return
            try:
                branch()
            except BaseException as exc:  # SystemExit and the like would end a helper silently
                errors.append(exc)

    def helper() -> None:
        try:
            work()
        finally:
            store.close_connection()  # this thread ends: its connection with it

    name = threading.current_thread().name
    helpers = [
        threading.Thread(
            target=contextvars.copy_context().run,  # the job's log context goes along
            args=(helper,),
            name=f"{name}-part{i}",
            daemon=True,
        )
        for i in range(1, threads)
    ]
    for thread in helpers:
        thread.start()
    work()
    for thread in helpers:
        thread.join()
    return errors[0] if errors else None


class SharedStop:
    """Why a job stops, once one of its parts was told to: the other parts stop for the
    same reason at their next report, so the job is settled for one reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: StopReason | None = None
        self.disk_full: str | None = None  # what the write that met a full disk said

    def stop(self, reason: StopReason) -> Stop:
        """A ``Stop`` to raise: for the job's first reason (``reason`` if none yet)."""
        with self._lock:
            self.reason = self.reason or reason
            return Stop(self.reason)


class RunsLeft:
    """The runs of a claimed job still to settle, and the completions left for the job's
    finish to record in its own commit (the last run's)."""

    def __init__(self, runs: list[ProcessorRun]) -> None:
        self._lock = threading.Lock()
        self._left = {run.id for run in runs}
        self.completions: list[jobs.Completion] = []

    def settled(self, run: ProcessorRun) -> bool:
        """Note ``run`` settled; whether it was the last."""
        with self._lock:
            self._left.discard(run.id)
            return not self._left
