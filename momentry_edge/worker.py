"""Huey consumer wiring and the loop that claims and runs jobs.

Huey supplies the worker threads, graceful shutdown and the scheduler that
wakes workers when a retry falls due. Its queue only carries "drain" wake-ups;
which job runs next, and whether any may start, is decided by jobs.claim from
the job table, so a lost wake-up (kill -9) loses no work: the next start-up,
or the next periodic kick, drains the table again.

A job's independent parts (the speech branch, the frame pass, each other
processor) run side by side on up to ``queue.job_threads`` threads, the job's
worker thread among them; a ``Stop`` in one part stops the others at their next
report, and the job is settled once, after all parts have ended. Each part's
processors run on a thread of their own (runners) that the part's thread watches,
so that a model stuck in a call can be given up and the job settled without it.

The workers wake themselves: on the bus events after which a job may have become
claimable (``on_event``) and at their own scheduled times (a retry or a start time
falling due). Besides, the service's housekeeping loop calls ``poll`` every
``queue.poll_interval``, and another node's notice reaches ``kick`` through
cluster.Notifier.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from huey import Huey
from huey.consumer import Consumer
from huey.storage import MemoryStorage

from . import clock, cluster, db, ingest, jobs, logs, models, outputs, runners
from .config import Config
from .db import Job, JobStatus, ProcessorRun, QueueState
from .events import Event, bus
from .gate import Gate
from .processors import Registry, asr, frames
from .processors.base import (
    PermanentError,
    Processor,
    ProcessorError,
    RunContext,
    Stop,
    StopReason,
)
from .processors.frames import FrameProcessor
from .provision import Provisioner

log = logging.getLogger(__name__)

REPORT_INTERVAL = 0.5  # seconds between progress writes that carry no checkpoint
# A run's start is written with the run's next write (its first report, or how it ended);
# one that has not written for this long is marked running on its own (_Starter).
START_DELAY = 0.2
# A job's processors run on threads of their own (runners) while its part thread watches
# them: a run told to stop (past its task_timeout, cancelled, the service stopping) that
# has not returned this many seconds later is given up, its thread left to it.
ABANDON_GRACE = 10.0
WATCH_TICK = 0.5  # seconds between the part thread's looks at a run it waits for
STOP_POLL = 2.0  # seconds a run may say nothing before the database is asked for a cancel
_CPUS = os.cpu_count() or 1
# Local events after which a job may be claimable here: those that may free work for
# other nodes too, and those that concern this node alone.
SAME_CONTENT_POLL = 2.0  # seconds between looks of a job waiting for a copy's results
WAKE_EVENTS = cluster.WAKE_EVENTS | {"job.extended", "job.held", "job.retry_due", "queue.unblocked"}


class BlockingMemoryStorage(MemoryStorage):
    """Huey's in-memory queue, but ``dequeue`` waits for a message instead of returning None.

    Huey's workers do not poll-and-sleep on a blocking storage, so a wake-up
    reaches an idle worker in about a millisecond, and an idle worker never wakes
    until ``close`` lets them all go at shutdown.
    """

    blocking = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ready = threading.Condition(self._lock)
        self._closed = False
        self._waiting = 0  # workers blocked in dequeue
        # Called, outside the lock, when a message finds no idle worker to take it.
        self.unserved: Callable[[], None] | None = None

    def enqueue(self, data: bytes, priority: float | None = None) -> None:
        with self._ready:
            super().enqueue(data, priority)
            self._ready.notify()
            unserved = self._waiting < len(self._queue)
        if unserved and self.unserved is not None:
            self.unserved()

    def dequeue(self) -> bytes | None:
        with self._ready:
            data = super().dequeue()
            while data is None and not self._closed:
                self._waiting += 1
                try:
                    self._ready.wait()
                finally:
                    self._waiting -= 1
                data = super().dequeue()
            return data

    def close(self) -> None:
        """From now on ``dequeue`` returns at once, so the workers see Huey's stop flag."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class InProcessConsumer(Consumer):
    """A consumer that leaves signal handling to the service's main thread."""

    def _set_signal_handlers(self) -> None:
        pass


class Workers:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        gate: Gate,
        node: str,
        owner: str,
        provision: Provisioner | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.gate = gate
        self.node = node
        self.owner = owner  # this process's lease owner id
        self.policy = jobs.RetryPolicy(
            retry_delay=config.queue.retry_delay,
            max_crashes=config.queue.max_crashes,
            lease_seconds=config.queue.lease_seconds,
        )
        self.stopping = threading.Event()
        self.started = False
        self.provision = provision
        self.can_run: set[str] = set()
        self.coming: set[str] = set()
        self.update_processors()
        self._loaded = _Loaded(registry)
        self._runners = runners.Runners("model")
        # The jobs worker threads are running now (the only leases the heartbeat renews),
        # each with the threads it runs on.
        self._in_hand: dict[int, int] = {}
        # When each job's lease was last renewed (monotonic; the write's start, so no later
        # than the database's): past lease_seconds, another node may have taken the job.
        self._renewed: dict[int, float] = {}
        self._hand_lock = threading.Lock()
        # Jobs in hand that have shown they are more than a moment's work (under_way).
        self._under_way: set[int] = set()
        # Worker threads in _drain: each claims again when its job ends, so only while
        # fewer than the limit are draining does a free place need another thread woken.
        self._drainers = 0
        self._woken_meanwhile = False  # a wake-up left to the drains under way (_drain)
        self._claimed_state: QueueState | None = None  # as the latest claim read it
        self._starter = _Starter(self.under_way)
        self.huey = Huey("momentry-edge", storage_class=BlockingMemoryStorage, results=False)
        self._drain_task = self.huey.task(name="drain")(self._drain)
        # One worker thread to begin with; more start as drains need them (_add_thread),
        # up to queue.worker_threads, so that an idle service holds no threads it never uses.
        self.consumer = InProcessConsumer(
            self.huey,
            workers=1,
            periodic=False,
            check_worker_health=False,  # the service's main loop calls it
            shutdown_timeout=30,
        )
        self._pool_lock = threading.Lock()  # the consumer's list of worker threads
        self.huey.storage.unserved = self._add_thread

    def update_processors(self) -> None:
        """What this node can run; a job needing more waits for a node that can. Processors
        whose model is being pulled are coming: their jobs wait here for them."""
        ready = {n for n in self.registry.names if self.registry.create(n).readiness().ready}
        self.coming = (self.provision.coming() if self.provision else set()) - ready
        self.can_run = ready
        if self.started:
            self.kick()  # jobs that waited for a model may run now, or fail with its reason

    def explain(self, described: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``GET /api/v1/processors``, saying which processors' models did not load."""
        return self._loaded.explain(described)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.consumer.start()
        self.started = True
        bus.listen(self.on_event)
        self.kick()

    def stop(self) -> None:
        """Running processors stop at their next report and go back to the line."""
        self.stopping.set()
        self.huey.storage.close()
        self.consumer.stop(graceful=True)
        self._starter.stop()

    def kick(self, delay: float | None = None) -> None:
        """Wake idle workers (after ``delay`` seconds) to look for claimable jobs."""
        if delay is not None:
            # At most a day: poll looks every poll interval anyway, and a start time
            # centuries ahead would overflow Huey's datetime.
            self._drain_task.schedule(delay=min(max(delay, 0), 86400))
        elif self.huey.pending_count() < self.config.queue.worker_threads:
            self._drain_task()  # with every thread busy, the storage asks _add_thread
        else:  # drains wait already, e.g. for a limit raised meanwhile: a thread for them
            self._add_thread()

    def on_event(self, event: Event) -> None:
        """Bus listener: a change after which a job may be claimable here."""
        if event["type"] in WAKE_EVENTS:
            if event["type"].startswith("queue."):
                self._claimed_state = None  # changed (a limit, a resume): read it afresh
            self.kick()
            if event.get("not_before"):
                self.kick(delay=event["not_before"] - clock.now())  # its start time

    def poll(self) -> None:
        """Look again (every poll interval): a job another process queued on a shared
        SQLite file, a start time or a retry the scheduler lost with a restart."""
        if self.started and not self.stopping.is_set():
            self.kick()

    def check_health(self) -> None:
        with self._pool_lock:
            self.consumer.check_worker_health()

    def _add_thread(self) -> None:
        """A drain found every worker thread busy: start one more, up to
        queue.worker_threads, while the limit lets one more job run here by the state the
        latest claim read (none after a change of it, see on_event: then one more anyway,
        and the claim keeps to the limit). No database here: this runs in whichever thread
        woke the workers, perhaps inside its transaction."""
        if not self.started or self.stopping.is_set():
            return
        state = self._claimed_state
        with self._hand_lock:
            draining = self._drainers
        if state is not None and draining >= self.effective_limit(state):
            return
        with self._pool_lock:
            threads = len(self.consumer.worker_threads)
            if threads >= self.config.queue.worker_threads:
                return
            worker = self.consumer._create_worker()
            thread = self.consumer._create_process(worker, f"Worker-{threads + 1}")
            self.consumer.worker_threads.append((worker, thread))
            thread.start()

    def under_way(self, job_id: int) -> None:
        """The job in hand is more than a moment's work: its first progress report, or
        START_DELAY without one. Only now may another job start beside it (see _drain),
        if the limit lets one more run here."""
        with self._hand_lock:
            if job_id not in self._in_hand or job_id in self._under_way:
                return
            self._under_way.add(job_id)
        state = self._claimed_state  # no database here: a processor's thread reports
        if not self.stopping.is_set() and (state is None or self._room(state)):
            self.kick()

    def in_hand(self) -> set[int]:
        """Ids of the jobs this process's worker threads are running now."""
        with self._hand_lock:
            return set(self._in_hand)

    def renew_leases(self) -> None:
        """The heartbeat: renew the leases of the jobs in hand."""
        held = self.in_hand()
        at = time.monotonic()
        jobs.heartbeat(self.owner, self.config.queue.lease_seconds, held)
        for job_id in held:
            self.renewed(job_id, at)

    def renewed(self, job_id: int, at: float) -> None:
        with self._hand_lock:
            if job_id in self._in_hand:
                self._renewed[job_id] = max(at, self._renewed.get(job_id, at))

    def lease_ran_out(self, job_id: int) -> bool:
        """Whether the job's lease may have run out, so that another node may have taken
        the job: not renewed for lease_seconds. Never on SQLite: the queue is on this
        machine, and while this process cannot write it no other can take the job."""
        if not db.is_postgres(Job._meta.database):
            return False
        with self._hand_lock:
            renewed = self._renewed.get(job_id)
        return renewed is not None and time.monotonic() - renewed >= self.config.queue.lease_seconds

    def effective_limit(self, state: QueueState | None = None) -> int:
        """How many jobs may run here now, by the queue's state (read now if not given)."""
        state = state or jobs.queue_state(self.node)
        with self._hand_lock:
            threads = list(self._in_hand.values())
        return self.gate.effective_limit(
            state.max_concurrent, state.dynamic_concurrency, state.paused, threads
        )

    # -- running jobs ------------------------------------------------------------------------

    def _drain(self) -> None:
        with self._hand_lock:
            # Beside a drain that is claiming, or running a job that may be over at once,
            # a second would only trade the GIL with it: jobs that short drain as fast one
            # at a time, on a third less CPU. That drain claims again when its job ends
            # (again if its claim found nothing while this wake-up came); if the job runs
            # on, under_way wakes another.
            if self._drainers > len(self._under_way):
                self._woken_meanwhile = True
                return
            self._drainers += 1
        counted_out = False
        try:
            counted_out = self._drain_line()
        finally:
            if not counted_out:
                with self._hand_lock:
                    self._drainers -= 1

    def _crowded(self, own: int) -> bool:
        """Whether another drain is claiming, or running a job not yet under way (``own``,
        this drain's job, left out)."""
        with self._hand_lock:
            return self._drainers - 1 > len(self._under_way - {own})

    def _drain_line(self) -> bool:
        """Claim and run jobs until none is left to claim here; True when it stepped back
        for another drain (_leave_to_others), counted out already."""
        job: Job | None = None
        while not self.stopping.is_set():
            if job is None:
                with self._hand_lock:
                    self._woken_meanwhile = False
                try:
                    job = self._claim()
                except Exception:
                    # The database away (locked, full, connection lost): look again shortly
                    # rather than let the error end this drain.
                    retry = self.config.queue.poll_interval
                    log.exception("claiming the next job failed; trying again in %g s", retry)
                    db.release_connection()
                    self.kick(delay=retry)
                    return False
                if job is None:
                    with self._hand_lock:
                        if self._woken_meanwhile:
                            continue  # a job queued as this claim read may have been missed
                    db.release_connection()
                    return False
            job = self.run_job(job)  # the next one, when its finish claimed one
            if job is None and self._leave_to_others():
                db.release_connection()
                return True
        if job is not None:  # claimed as the service began to stop: back to its place
            try:
                jobs.requeue(job, self.owner)
            except Exception as exc:  # its lease runs out and the reaper recovers it
                log.warning("job %s not given back at shutdown: %s", job.task_id, exc)
        return False

    def _leave_to_others(self) -> bool:
        """Step back if another drain is claiming or running a job not yet under way: it
        goes on with the line (see _drain). Counted out under the same lock, so that of
        two drains that end together one goes on."""
        with self._hand_lock:
            if self._drainers - 1 > len(self._under_way):
                self._drainers -= 1
                return True
            return False

    def _claim(self) -> Job | None:
        request = self._claim_request()
        return jobs.claim(
            request.owner,
            request.node,
            request.limit,
            request.lease_seconds,
            can_run=request.can_run,
            cluster_can_run=request.cluster_can_run,
        )

    def _claim_request(self) -> jobs.ClaimRequest:
        lease = self.config.queue.lease_seconds
        # A coming processor counts as runnable elsewhere: its jobs are skipped, not failed.
        others = (cluster.cluster_processors(within=lease) - self.can_run) | self.coming
        return jobs.ClaimRequest(
            self.owner,
            self.node,
            self._limit_at_claim,  # by the state the claim reads in its transaction
            lease,
            # Only when another node can run something this one cannot must it look
            # past the head of the line.
            can_run=self.can_run if others else None,
            cluster_can_run=self.can_run | others,
        )

    def _limit_at_claim(self, state: QueueState) -> int:
        """The claim's limit, by the queue's state as the claim reads it (noted for
        run_job, which decides by it whether to wake another thread)."""
        self._claimed_state = state
        return self.effective_limit(state)

    def _room(self, state: QueueState) -> bool:
        """Whether another job may start here beside those of the draining threads."""
        with self._hand_lock:
            draining = self._drainers
        return draining < self.effective_limit(state)

    def run_job(self, job: Job) -> Job | None:
        """Run ``job``; returns the next job when its finish claimed one (_run_job)."""
        following: list[Job] = []
        context = logs.current_task.set(job.task_id)
        with self._hand_lock:
            # Counted for its whole budget until it knows what it uses (_run_job).
            self._in_hand[job.id] = self._budget()
            self._renewed[job.id] = time.monotonic()  # claimed just now
        try:
            self._run_job(job, following)
        except jobs.LeaseLost:
            # Another worker may run it now: nothing of this run was written into the job.
            log.warning("job %s: lease lost, another worker has it", job.task_id)
        except BaseException as exc:  # a library's sys.exit or a stray KeyboardInterrupt too
            self._give_back(job, exc)
        finally:
            with self._hand_lock:
                self._in_hand.pop(job.id, None)
                self._renewed.pop(job.id, None)
                self._under_way.discard(job.id)
            logs.current_task.reset(context)
            db.release_connection()
        return following[0] if following else None

    def _give_back(self, job: Job, exc: BaseException) -> str:
        """After an error outside the processors (recording a run failed even after the
        retries): release the job rather than leave it held by no one."""
        error = _describe(exc)
        log.error("job %s: the worker failed: %s", job.task_id, error, exc_info=exc)
        try:
            status = jobs.give_back(job, self.owner, self.policy, error)
        except Exception as again:
            # No longer in hand, so its lease is no longer renewed: the reaper recovers
            # it once the lease has run out and the database answers again.
            log.error(
                "job %s could not be given back (%s); it is recovered when its lease runs out",
                job.task_id,
                again,
            )
            return JobStatus.PROCESSING
        log.warning("job %s given back after the worker failed: %s", job.task_id, status)
        if status in (JobStatus.FAILED, JobStatus.PARTIAL):  # parked: no _fail wrote them
            try:
                self.document_failures([job.task_id])
            except Exception as again:  # the database away again: the record stands
                log.warning("job %s: failed documents not written: %s", job.task_id, again)
        return status  # back in line: job.recovered wakes a worker for it

    def _run_job(self, job: Job, following: list[Job]) -> str:
        """Run ``job``; a worker that goes on draining claims the next one in the commit
        that finishes this one, and puts it in ``following``."""
        log.info("job %s started: %s", job.task_id, ", ".join(job.processors))
        out_dir = outputs.results_dir(self.config.data_dir, job.file.file_uuid)
        deadline = time.monotonic() + (job.task_timeout or self.config.queue.task_timeout)
        # Read all rows first: an open SQLite cursor would pin an old snapshot and make
        # the writes below fail with "database is locked".
        runs = jobs.pending_runs(job.id)
        guard = ingest.FileGuard(job.file)  # the file deleted or replaced while we work
        quiet = self.config.ingest.settle_seconds
        try:
            if guard.replaced:  # since it was registered: perhaps still being written to
                ingest.check_arriving(job.file, quiet, "it changed after it was registered")
            elif guard.problem() is None and (reason := ingest.unusable(job.file, quiet=quiet)):
                return self._reject(job, runs, reason)
        except ingest.StillArriving as arriving:
            return self._wait_for_writer(job, arriving)
        if other := jobs.same_content_under_way(job, [run.processor for run in runs]):
            return self._wait_for_same_content(job, other)
        batches = self._batches(runs)
        parts, frame_threads, threads = self._threads(batches)
        with self._hand_lock:
            self._in_hand[job.id] = threads
        halt = _Halt()
        ledger = _Ledger(runs)
        part = functools.partial(
            self._run_part,
            job,
            Path(job.file.path),
            out_dir,
            deadline,
            guard,
            halt,
            ledger,
            frame_threads,
        )
        error = _side_by_side([functools.partial(part, batch) for batch in batches], parts)
        try:
            status = self._end_job(job, following, halt, ledger, error)
        finally:  # documents not placed with their record (the job lost) are not left behind
            for done in ledger.completions:
                if done.document is not None:
                    done.document.discard()
        log.info("job %s %s", job.task_id, status)
        if status == JobStatus.RETRYING:
            self.kick(delay=Job.get_by_id(job.id).next_attempt_at - clock.now())
        # Replaced while this job ran, or since its last look (before its finish): the new
        # content, if registered meanwhile, joined this job and is queued now.
        if guard.replaced or guard.problem() is not None:
            ingest.requeue_replaced(job, job.file)
        return status

    def _end_job(
        self,
        job: Job,
        following: list[Job],
        halt: _Halt,
        ledger: _Ledger,
        error: BaseException | None,
    ) -> str:
        """Record how the job's run ended, if the job is still this worker's (else raise
        LeaseLost); returns its status."""
        if halt.reason == StopReason.LEASE or isinstance(error, jobs.LeaseLost):
            raise jobs.LeaseLost(job.task_id)
        claim = jobs.Claim.of(job, self.owner)
        if error is not None or halt.reason is not None:
            for done in ledger.completions:  # recorded on their own, as the job is not finished
                jobs.complete_run(claim, done.run_id, done.output_path, done.started, done.document)
        if error is not None:
            raise error  # outside the processors: the job is given back (run_job)
        if halt.reason == StopReason.SHUTDOWN:
            status = jobs.requeue(job, self.owner)
            log.info("job %s at shutdown: %s", job.task_id, status)
            return status
        if self.stopping.is_set() or self._crowded(job.id):
            # Two drains of jobs that end at once (the second woken as one ran on a while,
            # or both at once by a burst): this one steps back.
            status = jobs.finish(job, self.owner, self.policy, completed=ledger.completions)
        else:
            status, claimed = jobs.finish_and_claim(
                job, self.owner, self.policy, self._claim_request(), ledger.completions
            )
            following.extend([claimed] if claimed else [])
        return status

    def _wait_for_writer(self, job: Job, arriving: ingest.StillArriving) -> str:
        """Back in line until its file has been quiet for settle_seconds: what more is
        written meanwhile joins this job (jobs.submit), and a file still broken then is
        rejected."""
        status = jobs.requeue(job, self.owner, not_before=arriving.until)
        log.info(
            "job %s: %s was written to moments ago (%s): waiting until it is quiet",
            job.task_id,
            job.file.rel_path,
            arriving.reason,
        )
        self.kick(delay=arriving.until - clock.now())
        return status

    def _wait_for_same_content(self, job: Job, other: Job) -> str:
        """Back in line while ``other`` processes a copy of this file: its results are
        linked once it is done (a look every few seconds, which costs two commits)."""
        why = f"waiting for job {other.task_id}, which is processing the same content"
        status = jobs.requeue(job, self.owner, not_before=clock.now() + SAME_CONTENT_POLL, why=why)
        if job.error_message != why:  # said once, not at every look
            log.info("job %s: %s", job.task_id, why)
        self.kick(delay=SAME_CONTENT_POLL)
        return status

    def _reject(self, job: Job, runs: list[ProcessorRun], reason: str) -> str:
        """The file is rejected, e.g. by the probe it was queued without (ingest.unusable):
        the job fails with the reason, no processor runs and no result is written. Not
        retried: a file rejected for a cause that may pass is looked at again by ingest,
        which queues it anew once it reads."""
        error = f"file rejected: {reason}"
        claim = jobs.Claim.of(job, self.owner)
        for run in runs:
            jobs.fail_run(claim, run, error, transient=False)
        status = jobs.finish(job, self.owner, self.policy)
        log.warning("job %s %s: %s", job.task_id, status, error)
        return status

    def _run_part(
        self,
        job: Job,
        media_path: Path,
        out_dir: Path,
        deadline: float,
        guard: ingest.FileGuard,
        halt: _Halt,
        ledger: _Ledger,
        frame_threads: int,
        batch: list[ProcessorRun],
    ) -> None:
        """One part of a job, beside the others."""
        if halt.reason is not None:
            return  # the job is stopping: these runs stay to do
        try:
            if problem := guard.problem():
                for run in batch:
                    ledger.settled(run)
                    self._fail(job, run, None, run.last_checkpoint, problem, False, out_dir)
                return
            with contextlib.suppress(Stop):  # halt has the reason; _run_job acts on it
                self._run_batch(
                    job, batch, media_path, out_dir, deadline, guard, halt, ledger, frame_threads
                )
        except jobs.LeaseLost:
            halt.stop(StopReason.LEASE)  # the other parts stop at their next report

    def _budget(self) -> int:
        """The threads one job may use (``queue.job_threads``)."""
        return self.config.queue.job_threads or _CPUS

    def _threads(self, batches: list[list[ProcessorRun]]) -> tuple[int, int, int]:
        """How many parts of a job run at once; the threads the frame pass gets (what the
        job's whole budget); the threads the job holds."""
        budget = self._budget()
        parts = max(1, min(budget, len(batches)))
        frame_runs = next((b for b in batches if self._is_frame(b[0].processor)), None)
        if frame_runs is None:
            return parts, 1, parts
        # The frame pass is the long part (the speech beside it ends early): it gets the
        # whole budget for its members (frames.run_shared adds its decode thread), even
        # for one member whose frames are independent (its frames are shared out).
        split = any(
            getattr(self._peek(r.processor), "independent_frames", False) for r in frame_runs
        )
        frame_threads = budget if split else max(1, min(budget, len(frame_runs)))
        return parts, frame_threads, max(parts, frame_threads)

    def _batches(self, runs: list[ProcessorRun]) -> list[list[ProcessorRun]]:
        """Runs in order, one per batch, except for work that is shared, in one batch at
        its first run's place: the frame processors share a single decode pass
        (frames.run_shared), asr and asrx with the same settings one transcription
        (asr.run_shared)."""
        frame_runs = [r for r in runs if self._is_frame(r.processor)]
        speech_runs = [r for r in runs if r.processor in ("asr", "asrx")]
        if len(speech_runs) != 2 or not asr.can_share(*map(self._peek, ["asr", "asrx"])):
            speech_runs = []
        batches = []
        for run in runs:
            group = next((g for g in (frame_runs, speech_runs) if run in g), None)
            if group is None:
                batches.append([run])
            elif run is group[0]:
                batches.append(group)
        return batches

    def _is_frame(self, name: str) -> bool:
        return isinstance(self._peek(name), FrameProcessor)

    def _peek(self, name: str) -> Processor | None:
        """An instance of a processor to look at, not to run; None if broken."""
        try:
            return self._loaded.peek(name)
        except Exception:
            return None  # a broken plugin fails in _begin, with its error recorded

    def _run_batch(
        self,
        job: Job,
        runs: list[ProcessorRun],
        media_path: Path,
        out_dir: Path,
        deadline: float,
        guard: ingest.FileGuard,
        halt: _Halt,
        ledger: _Ledger,
        frame_threads: int,
    ) -> None:
        """Run one processor, or several sharing their work (one decode, one transcription).
        Each run keeps its own status, progress, checkpoint, error and output file; one
        failing does not fail the others. A ``Stop`` is raised after every run is recorded."""
        with self._loaded.lending() as loan:
            take = loan.take
            started = []
            for run in runs:
                tracker = _Reporter(self, job, run, deadline, guard, halt, ledger)
                try:
                    processor = loan.take_idle(run.processor) or self._load(
                        job, run.processor, take, tracker, deadline, halt
                    )
                    begun = self._begin(job, run, processor, media_path, out_dir, tracker)
                except BaseException as exc:  # a plugin's own, whatever it raises
                    if tracker.start is None:
                        # It failed before it began (its processor would not load, or is
                        # not ready): an attempt all the same, or it would retry for ever.
                        claim = jobs.Claim.of(job, self.owner)
                        tracker.start = _Start(claim, run.id, run.backend, run.model)
                    self._settle(job, run, None, tracker, exc, out_dir, guard)
                    continue
                if begun is not None:
                    started.append((run, processor, begun, tracker))
                else:
                    ledger.settled(run)  # skipped
            members = [(processor, ctx) for _, processor, ctx, _ in started]
            names = [run.processor for run, *_ in started]

            def outcomes_of_members() -> list[Any]:
                try:
                    if members and isinstance(members[0][0], FrameProcessor):
                        return frames.run_shared(
                            media_path,
                            members,  # type: ignore[arg-type]
                            threads=frame_threads,
                            spare=lambda slot: take(names[slot]),  # type: ignore[arg-type,return-value]
                        )
                    if len(members) > 1:
                        return asr.run_shared(media_path, members)  # type: ignore[arg-type]
                    return [_outcome(processor, ctx) for processor, ctx in members]
                finally:
                    db.release_connection()

            trackers = [tracker for *_, tracker in started]
            outcomes = self._await(job, names, outcomes_of_members, trackers, deadline, halt)
            if outcomes is None:  # given up: its processors are not lent again
                loan.lost = True
                outcomes = [Stop(halt.reason or StopReason.TIMEOUT)] * len(started)
            stop = None
            for (run, processor, _, tracker), outcome in zip(started, outcomes, strict=True):
                try:
                    settled = self._settle(job, run, processor, tracker, outcome, out_dir, guard)
                    stop = settled or stop
                except (jobs.LeaseLost, *db.OUTAGE_ERRORS):
                    # The job lost (nothing more of it is written), or the database away past
                    # every retry (the whole job is given back).
                    raise
                except Exception as exc:  # e.g. its output cannot be written: others settle
                    log.error("job %s: %s not recorded", job.task_id, run.processor, exc_info=exc)
                    error = _describe(exc)
                    jobs.fail_run(
                        jobs.Claim.of(job, self.owner),
                        run,
                        error,
                        transient=True,
                        started=tracker.take_start(),
                    )
                finally:  # the run's extra files, unless they went with its document
                    for extra in tracker.extras:
                        extra.discard()
            if stop is not None:
                raise stop

    def _load(
        self,
        job: Job,
        name: str,
        take: Callable[[str], Processor],
        tracker: _Reporter,
        deadline: float,
        halt: _Halt,
    ) -> Processor:
        """A new instance of processor ``name``, loaded on a runner: a model's load can hang
        as its run can."""
        loaded = self._await(job, [name], lambda: [take(name)], [tracker], deadline, halt)
        if loaded is None:
            raise Stop(halt.reason or StopReason.TIMEOUT)
        return loaded[0]

    def _await(
        self,
        job: Job,
        names: list[str],
        body: Callable[[], list[Any]],
        trackers: list[_Reporter],
        deadline: float,
        halt: _Halt,
    ) -> list[Any] | None:
        """``body``'s outcomes, run on a runner thread; None when it was given up: told to
        stop (see ``_stop_reason``) and still not returned ABANDON_GRACE later."""
        if not trackers:
            return []
        call = self._runners.start(body)
        looked = time.monotonic()
        give_up_at = None
        while not call.done.wait(WATCH_TICK):
            now = time.monotonic()
            if give_up_at is None:
                silent = now - max(looked, *(t.last_write for t in trackers)) >= STOP_POLL
                if silent:
                    looked = now
                if reason := self._stop_reason(job, deadline, halt, now, silent):
                    halt.stop(reason)  # a run that reports stops at its next report
                    give_up_at = now + ABANDON_GRACE
            elif now >= give_up_at:
                for tracker in trackers:
                    tracker.abandoned = True  # a late report writes nothing, and stops it
                log.error(
                    "job %s: %s did not return %g s after it was told to stop (%s); its"
                    " thread is left to it, and the job goes on without it",
                    job.task_id,
                    ", ".join(names),
                    ABANDON_GRACE,
                    halt.reason,
                )
                return None
        return call.result()

    def _stop_reason(
        self, job: Job, deadline: float, halt: _Halt, now: float, ask: bool
    ) -> StopReason | None:
        """Why a running batch should stop, if it should; ``ask``: the database too (a
        cancel, the job taken over), which a run that reports hears at its report."""
        if halt.reason is not None:
            return halt.reason
        if self.stopping.is_set():
            return StopReason.SHUTDOWN
        if now > deadline:
            return StopReason.TIMEOUT
        if not ask:
            return None
        try:
            asked = jobs.stop_asked(job.id, self.owner, job.started_at)
        except db.OUTAGE_ERRORS:
            db.after_outage()
            return None  # asked again later; the heartbeat keeps the lease meanwhile
        return {"cancel": StopReason.CANCELLED, "lost": StopReason.LEASE}.get(asked or "")

    def _begin(
        self,
        job: Job,
        run: ProcessorRun,
        processor: Processor,
        media_path: Path,
        out_dir: Path,
        tracker: _Reporter,
    ) -> RunContext | None:
        """Mark the run started and give its context; None when it is skipped."""
        if not job.options.get("force") and (
            duplicate := outputs.duplicate_output(
                job.file, run.processor, processor.model, processor.version, out_dir
            )
        ):
            # This content was processed already.
            jobs.skip_run(jobs.Claim.of(job, self.owner), run, *duplicate)
            log.info("job %s: %s skipped: %s", job.task_id, run.processor, duplicate[0])
            return None
        state = processor.readiness()
        if not state.ready and self.provision is not None:
            state = self.provision.readiness(run.processor, state)  # e.g. why a pull failed
        if not state.ready:
            raise ProcessorError(state.reason or "not ready", transient=False)
        start = _Start(jobs.Claim.of(job, self.owner), run.id, processor.backend, processor.model)
        if job.crash_count:
            # It has taken the process down before: marked running at once, so that a crash
            # loop names the run it happens in (jobs._recover).
            start.write()
            self.under_way(job.id)
        else:
            self._starter.add(start)
        tracker.start = start
        if run.last_checkpoint:
            log.info("job %s: %s resumes from its checkpoint", job.task_id, run.processor)
        return RunContext(
            media_path=media_path,
            output_dir=out_dir,
            checkpoint=run.last_checkpoint,
            attempt=run.attempts + 1,
            _report=tracker.report,
            _extras=tracker.extras,
        )

    def _settle(
        self,
        job: Job,
        run: ProcessorRun,
        processor: Processor | None,
        tracker: _Reporter,
        outcome: Any,
        out_dir: Path,
        guard: ingest.FileGuard | None,
    ) -> Stop | None:
        """Record how a run ended: its result, or the exception it ended with."""
        last = tracker.ledger.settled(run)
        problem = guard.problem() if guard is not None else None

        def fail(error: str, transient: bool) -> None:
            with tracker.carrying_start() as started:
                self._fail(
                    job, run, processor, tracker.checkpoint, error, transient, out_dir, started
                )

        if problem and not isinstance(outcome, BaseException):
            outcome = PermanentError(problem)  # a result for content that is no longer there
        elif not isinstance(outcome, BaseException) and time.monotonic() > tracker.deadline:
            # Returned past its deadline without a report to stop it at: timed out all the
            # same, its result not kept; the job's other parts stop too.
            tracker.halt.stop(StopReason.TIMEOUT)
            outcome = Stop(StopReason.TIMEOUT)
        if isinstance(outcome, Stop):
            if outcome.reason == StopReason.TIMEOUT:
                limit, source = job.task_timeout, "the job's task_timeout"
                if limit is None:
                    limit, source = self.config.queue.task_timeout, "queue.task_timeout"
                error = f"timed out after {limit:g} s ({source})"
                fail(error, True)
                return outcome
            partial = None
            if outcome.reason == StopReason.CANCELLED and tracker.checkpoint and processor:
                try:
                    partial = self._stage_output(
                        job,
                        run,
                        processor,
                        outputs.PARTIAL,
                        tracker.checkpoint.get("partial"),
                        None,
                        tracker.checkpoint,
                        out_dir,
                    )
                except OSError as exc:  # the checkpoint in the database is kept all the same
                    log.warning("job %s: partial output not written: %s", job.task_id, exc)
                    self._check_disk()
            claim = jobs.Claim.of(job, self.owner)
            try:
                with tracker.carrying_start() as started:
                    jobs.release_run(claim, run, started, partial)
            finally:
                if partial is not None:
                    partial.discard()  # not placed with the record: the job is lost
            return outcome
        if isinstance(outcome, ProcessorError):
            # A read error because the file went away is reported as just that.
            error = problem or _message(outcome) or type(outcome).__name__
            log.warning("job %s: %s failed: %s", job.task_id, run.processor, error)
            transient = outcome.transient and not problem
            fail(error, transient)
        elif isinstance(outcome, BaseException):
            log.error("job %s: %s crashed", job.task_id, run.processor, exc_info=outcome)
            fail(_describe(outcome), True)
            if isinstance(outcome, OSError):
                self._check_disk()
        else:
            assert processor is not None
            try:
                document = self._stage_output(
                    job,
                    run,
                    processor,
                    outputs.COMPLETED,
                    outcome,
                    None,
                    tracker.checkpoint,
                    out_dir,
                )
            except db.NotJSON as exc:
                # Not kept as completed: no strict parser could read it. The model gives the
                # same on every try, so not retried.
                error = f"the result cannot be written: {_message(exc)}"
                log.error("job %s: %s %s", job.task_id, run.processor, error)
                fail(error, False)
                return None
            except OSError as exc:
                # A full or failing disk: the run fails for now and the job retries later;
                # a full disk holds back new starts meanwhile (queue.min_free_disk_mb).
                error = f"cannot write the result: {_message(exc)}"
                log.error("job %s: %s %s", job.task_id, run.processor, error)
                fail(error, True)
                self._check_disk()
                return None
            document.companions, tracker.extras = tracker.extras, []
            if last and tracker.halt.reason is None:
                # The job's last run: recorded with the job's finish, in one commit. A crash
                # before it leaves the run to do again, as a crash before complete_run would.
                done = jobs.Completion(run.id, str(document.path), tracker.take_start(), document)
                tracker.ledger.completions.append(done)
            else:
                claim = jobs.Claim.of(job, self.owner)
                try:
                    with tracker.carrying_start() as started:
                        jobs.complete_run(claim, run, str(document.path), started, document)
                finally:
                    document.discard()  # not placed with the record: the job is lost
            log.info("job %s: %s completed", job.task_id, run.processor)
        return None

    def _fail(
        self,
        job: Job,
        run: ProcessorRun,
        processor: Processor | None,
        checkpoint: dict[str, Any] | None,
        error: str,
        transient: bool,
        out_dir: Path,
        started: jobs.Started | None = None,
    ) -> None:
        """Record a failed run, and write its document (with the result so far) so the
        results folder tells a failed processor from one that has not run."""
        document = self._stage_failed(job, run, processor, checkpoint, error, out_dir)
        claim = jobs.Claim.of(job, self.owner)
        try:
            jobs.fail_run(
                claim, run, error, transient=transient, document=document, started=started
            )
        finally:
            if document is not None:
                document.discard()  # not placed with the record: the job is lost

    def document_failures(self, task_ids: Collection[str]) -> None:
        """Write the failed documents of these jobs' runs that have none: a run parked
        after a crash loop (jobs.give_back, jobs.reap) had no worker left to write it."""
        for run in jobs.undocumented_failures(task_ids):
            job = run.job
            out_dir = outputs.results_dir(self.config.data_dir, job.file.file_uuid)
            document = self._stage_failed(job, run, None, run.last_checkpoint, run.error, out_dir)
            if document is not None:
                try:
                    jobs.documented(run, str(document.place()))
                finally:
                    document.discard()

    def _stage_failed(
        self,
        job: Job,
        run: ProcessorRun,
        processor: Processor | None,
        checkpoint: dict[str, Any] | None,
        error: str,
        out_dir: Path,
    ) -> outputs.Staged | None:
        """The failed document, to place; None when it could not be written."""
        try:
            partial = (checkpoint or {}).get("partial")
            try:
                return self._stage_output(
                    job, run, processor, outputs.FAILED, partial, error, checkpoint, out_dir
                )
            except db.NotJSON:  # a checkpoint saved before they were refused: without it
                return self._stage_output(
                    job, run, processor, outputs.FAILED, None, error, None, out_dir
                )
        except OSError as exc:  # the failure is recorded in the database all the same
            log.warning(
                "job %s: %s's failed document not written: %s", job.task_id, run.processor, exc
            )
            self._check_disk()
            return None

    def _check_disk(self) -> None:
        """A write failed: if the disk is full, stop admitting jobs now, not at the next sample."""
        with contextlib.suppress(OSError):
            self.gate.check_disk(*outputs.written_folders(self.config.data_dir))

    def _stage_output(
        self,
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


def _side_by_side(branches: list[Callable[[], None]], threads: int) -> BaseException | None:
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
            db.close_connection()  # this thread ends: its connection with it

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


class _Halt:
    """Why a job stops, once one of its parts was told to: the other parts stop for the
    same reason at their next report, so the job is settled for one reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: StopReason | None = None

    def stop(self, reason: StopReason) -> Stop:
        """A ``Stop`` to raise: for the job's first reason (``reason`` if none yet)."""
        with self._lock:
            self.reason = self.reason or reason
            return Stop(self.reason)


class _Loaded:
    """Processor instances, each lent to one thread at a time and kept for the next run:
    a part of a job on a new thread reuses models an earlier run loaded."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._idle: dict[str, list[Processor]] = {}
        # processor -> why its last load failed, and its model's mark (models.load_mark)
        # then: said by GET /api/v1/processors until it loads or its model is replaced.
        self.failed_loads: dict[str, tuple[str, tuple[int, int] | None]] = {}

    def take_idle(self, name: str) -> Processor | None:
        """An idle instance, loaded already, if there is one (nothing here can hang)."""
        with self._lock:
            idle = self._idle.get(name)
            return idle.pop() if idle else None

    def create(self, name: str) -> tuple[Processor, bool]:
        """A new instance, and whether it was loaded: only when it is ready, else it is
        there to say why not."""
        processor = self._registry.create(name)
        if not processor.readiness().ready:
            return processor, False
        try:
            processor.load()
        except BaseException as exc:
            self.failed_loads[name] = (_message(exc), models.load_mark(processor))
            raise
        self.failed_loads.pop(name, None)
        return processor, True

    def explain(self, described: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``described`` (``GET /api/v1/processors``), a processor whose model did not load
        in the last job that needed it not ready, with why (until its model is replaced)."""
        for name, (error, mark) in list(self.failed_loads.items()):
            entry = described.get(name)
            if entry is None or not entry["ready"]:
                continue
            if models.load_mark(self._registry.create(name)) != mark:
                continue  # put in place anew since: the next job tries it
            entry.update(ready=False, reason=f"its model did not load: {error}")
        return described

    def give(self, name: str, processor: Processor) -> None:
        with self._lock:
            self._idle.setdefault(name, []).append(processor)

    @contextlib.contextmanager
    def lending(self) -> Iterator[_Loan]:
        """A loan for one use; what it took is given back at the end, unless it was lost."""
        loan = _Loan(self)
        try:
            yield loan
        finally:
            if not loan.lost:
                for name, processor in loan.taken:
                    self.give(name, processor)

    def peek(self, name: str) -> Processor:
        """An instance to look at (its class, its settings), not to run."""
        with self._lock:
            idle = self._idle.get(name)
            if idle:
                return idle[-1]
        return self._registry.create(name)


class _Loan:
    """Processors taken for one batch; ``lost`` when a thread that was given up may still
    be using them."""

    def __init__(self, loaded: _Loaded) -> None:
        self._loaded = loaded
        self.taken: list[tuple[str, Processor]] = []  # loaded instances, given back after
        self.lost = False

    def take_idle(self, name: str) -> Processor | None:
        processor = self._loaded.take_idle(name)
        if processor is not None:
            self.taken.append((name, processor))
        return processor

    def take(self, name: str) -> Processor:
        """An idle instance, else a new one, loaded if ready. One that was not ready is
        not kept: the model may be in place by the next run, which must load it first."""
        processor = self.take_idle(name)
        if processor is None:
            processor, loaded = self._loaded.create(name)
            if loaded:
                self.taken.append((name, processor))
        return processor


def _message(exc: BaseException) -> str:
    """``str(exc)``, whatever that does: an exception whose ``__str__`` raises still ends
    its run with a reason, and what UTF-8 cannot carry (a lone surrogate, a file name's
    undecodable bytes) is escaped, so that the reason can be stored and written."""
    try:
        text = str(exc)
    except Exception:
        text = "(its message cannot be read)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_message(exc)}"


def _outcome(processor: Processor, ctx: RunContext) -> Any:
    """``processor.run(ctx)``'s result, or the exception it raised."""
    try:
        return processor.run(ctx)
    # Whatever it raises (a library's sys.exit, a KeyboardInterrupt) ends the run, not the thread.
    except BaseException as exc:
        return exc


class _Reporter:
    """The report callback a processor gets: saves progress, relays stop requests."""

    def __init__(
        self,
        workers: Workers,
        job: Job,
        run: ProcessorRun,
        deadline: float,
        guard: ingest.FileGuard | None,
        halt: _Halt,
        ledger: _Ledger,
    ) -> None:
        self.workers = workers
        self.job = job
        self.run = run
        self.deadline = deadline
        self.guard = guard
        self.halt = halt  # shared by the job's parts
        self.ledger = ledger  # shared by the job's parts
        self.start: _Start | None = None  # once the run has begun (Workers._begin)
        self.checkpoint: dict[str, Any] | None = run.last_checkpoint
        self.extras: list[outputs.Staged] = []  # files the run wrote beside its document
        self._last_write = 0.0
        self._quiet_until = 0.0  # after a failed write, no writes until then
        self._unsaved = False  # a checkpoint given during that pause is still to be saved
        self._reported = False  # the run's first report tells the workers (under_way)
        self.abandoned = False  # given up (Workers._await): its settled run is not touched

    @property
    def last_write(self) -> float:
        return self._last_write

    def report(self, current: int, total: int, checkpoint: dict[str, Any] | None = None) -> None:
        if self.abandoned:
            raise Stop(self.halt.reason or StopReason.TIMEOUT)
        if not self._reported:
            self._reported = True
            self.workers.under_way(self.job.id)
        if checkpoint is not None:
            try:
                db.to_json(checkpoint)
            except db.NotJSON as exc:
                # The processor's own error, and the same on every try: its run fails.
                raise PermanentError(f"its checkpoint cannot be saved: {exc}") from None
            self.checkpoint = checkpoint
            self._unsaved = True
        now = time.monotonic()
        # Another part of the job stopped: save where this one is and stop with it.
        stopping = self.workers.stopping.is_set() or self.halt.reason is not None
        due = self._unsaved or stopping or now - self._last_write >= REPORT_INTERVAL
        # A run whose lease may have run out goes no further before the database says the
        # job is still this worker's (_write).
        if (due and now >= self._quiet_until) or self.workers.lease_ran_out(self.job.id):
            if self._write(current, total):
                raise self.halt.stop(StopReason.CANCELLED)
            if self.guard is not None and (problem := self.guard.problem()):
                raise PermanentError(problem)  # stop now rather than at the end of the run
        if self.halt.reason is not None:
            raise Stop(self.halt.reason)
        if self.workers.stopping.is_set():
            raise self.halt.stop(StopReason.SHUTDOWN)
        if now > self.deadline:
            raise self.halt.stop(StopReason.TIMEOUT)

    def _write(self, current: int, total: int) -> bool:
        """Save progress and renew the lease; returns whether a cancel was asked.

        While the database is out the run goes on (its lease kept by the heartbeat) and
        the next report past a pause saves the latest checkpoint; but once the lease
        may have run out, another node may have taken the job over: the run waits here
        until the database answers, then goes on if the job is still its own."""
        lease = self.workers.config.queue.lease_seconds
        holding = False
        while True:
            self._last_write = time.monotonic()
            try:
                with self.carrying_start() as started:
                    cancel = jobs.report(
                        self.job.id,
                        self.run.id,
                        self.workers.owner,
                        current=current,
                        total=total,
                        checkpoint=self.checkpoint if self._unsaved else None,
                        lease_seconds=lease,
                        started_at=self.job.started_at,
                        run_started=started,
                    )
            except jobs.LeaseLost:
                raise self.halt.stop(StopReason.LEASE) from None
            except db.OUTAGE_ERRORS as exc:
                db.after_outage()
                pause = lease / 3
                if not self.workers.lease_ran_out(self.job.id):
                    log.warning(
                        "job %s: progress not saved (%s); next try in %g s",
                        self.job.task_id,
                        exc,
                        pause,
                    )
                    self._quiet_until = time.monotonic() + pause
                    return False
                if not holding:
                    holding = True
                    log.warning(
                        "job %s: lease not renewed for %g s (%s); waiting for the database"
                        " before going on",
                        self.job.task_id,
                        lease,
                        exc,
                    )
                if self.workers.stopping.wait(pause):
                    raise self.halt.stop(StopReason.SHUTDOWN) from None
                if self.halt.reason is not None:
                    raise Stop(self.halt.reason) from None
                continue
            self.workers.renewed(self.job.id, self._last_write)
            self._unsaved = False
            if holding:
                log.info(
                    "job %s: the database answers again; the job is still ours", self.job.task_id
                )
            return cancel

    def take_start(self) -> jobs.Started | None:
        """The run's start for the caller's write to carry, if it is not written yet."""
        return self.start.take() if self.start is not None else None

    @contextlib.contextmanager
    def carrying_start(self) -> Iterator[jobs.Started | None]:
        """``take_start`` for one write, put back if that write fails (rolled back with
        it, or never sent), so that a later write carries it: however the run ends, its
        attempt is counted, and its retries end at max_retries."""
        started = self.take_start()
        try:
            yield started
        except BaseException:
            if self.start is not None and started is not None:
                self.start.put_back(started)
            raise


class _Start:
    """A run's start (time, backend, model) until it is written: by the run's next write
    (``take``), or on its own by the _Starter once START_DELAY has passed without one, so a
    run that does not report soon still shows as running. Whoever takes it writes it."""

    def __init__(
        self, claim: jobs.Claim, run_id: int, backend: str | None, model: str | None
    ) -> None:
        self.claim = claim
        self.run_id = run_id
        self.due = time.monotonic() + START_DELAY
        self._lock = threading.Lock()
        self._unwritten: jobs.Started | None = jobs.Started(clock.now(), backend, model)

    @property
    def written(self) -> bool:
        return self._unwritten is None

    def take(self) -> jobs.Started | None:
        # Waits for a write of its own under way, so the start is never written twice.
        with self._lock:
            started, self._unwritten = self._unwritten, None
            return started

    def put_back(self, started: jobs.Started) -> None:
        """The write that was to carry it failed."""
        with self._lock:
            self._unwritten = self._unwritten or started

    def write(self) -> None:
        """Write it on its own (start_run), unless taken meanwhile."""
        with self._lock:
            if self._unwritten is not None:
                started = self._unwritten
                jobs.start_run(
                    self.claim, self.run_id, started.backend, started.model, at=started.at
                )
                self._unwritten = None


class _Starter:
    """A thread that writes the starts (_Start) of runs that went START_DELAY without a
    write of their own, oldest first, and tells ``late`` their jobs; started with the
    first start it is given."""

    def __init__(self, late: Callable[[int], None]) -> None:
        self._late = late
        self._ready = threading.Condition()
        self._starts: deque[_Start] = deque()  # in order of due time: one delay for all
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, start: _Start) -> None:
        with self._ready:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="run-starter", daemon=True)
                self._thread.start()
            self._starts.append(start)
            if len(self._starts) == 1:
                self._ready.notify()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._ready:
                # Starts already written by their runs leave without waiting for their time.
                while self._starts and self._starts[0].written:
                    self._starts.popleft()
                if self._stopped:
                    return
                if not self._starts:
                    self._ready.wait()
                    continue
                wait = self._starts[0].due - time.monotonic()
                if wait > 0:
                    self._ready.wait(wait)
                    continue
                start = self._starts.popleft()
            self._late(start.claim.job_id)
            try:
                start.write()
            except jobs.LeaseLost:
                pass  # the run's worker finds that out at its next write
            except Exception as exc:  # the database away: the run's next write carries it
                log.warning("a run's start not written: %s", exc)
            finally:
                db.release_connection()


class _Ledger:
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
