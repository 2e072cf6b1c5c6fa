"""Dispatch: the workers wake (bus events, their own schedule, the housekeeping poll, other
nodes' notices), claim the next job from the table (jobs.claim) and run it (job_run.JobRun),
up to the concurrency gate's limit; the jobs in hand keep their leases renewed."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Collection
from typing import Any

from .. import clock, cluster, heap, jobs, logs, outputs, store
from ..config import Config
from ..events import Event, bus
from ..processors import Registry
from ..provision import Provisioner
from ..store import Job, JobStatus, QueueState
from . import pool, runners, settle
from .gate import Gate
from .hands import JobsInHand
from .job_run import JobRun, job_threads
from .progress import StartWriter
from .wakeups import WorkerThreads

log = logging.getLogger(__name__)
# How often a job held while the queue database's disk is full tries to go back in line.
DATABASE_FULL_POLL = 1.0
# jobs.requeue without store.retried's three quick tries, each logged: the poll above
# tries again, and the gate says why once a minute.
_requeue_once = getattr(jobs.requeue, "__wrapped__", jobs.requeue)

# Local events after which a job may be claimable here: those that may free work for
# other nodes too, and those that concern this node alone.
WAKE_EVENTS = cluster.WAKE_EVENTS | {"job.extended", "job.held", "job.retry_due", "queue.unblocked"}


class Workers:
    """The process's worker threads and the jobs they hold."""

    # One piece (~340 lines): claiming a job, renewing its lease and giving it back all
    # read and change the same jobs in hand (JobsInHand) and thread budget.

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
        # Drained (before a reboot): the jobs running finish, no new one starts here.
        self.drained = False
        self.started = False
        self.provision = provision
        self.can_run: set[str] = set()
        self.coming: set[str] = set()
        self.update_processors()
        heap.limit_arenas()
        self.pool = pool.ProcessorPool(registry, config.models.idle_release_seconds)
        self.runners = runners.Runners("model")
        self.hands = JobsInHand()
        self._claimed_state: QueueState | None = None  # as the latest claim read it
        self.starter = StartWriter(self.under_way)
        # One worker thread to begin with; more start as drains need them (_add_thread),
        # up to queue.worker_threads, so that an idle service holds no threads it never uses.
        self.threads = WorkerThreads(self._drain, most=config.queue.worker_threads)
        self.threads.storage.unserved = self._add_thread

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
        return self.pool.explain(described)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.threads.start()
        self.started = True
        bus.listen(self.on_event)
        self.kick()

    def stop(self) -> None:
        """Running processors stop at their next report and go back to the line."""
        self.stopping.set()
        self.threads.stop()
        self.starter.stop()

    def kick(self, delay: float | None = None) -> None:
        """Wake idle workers (after ``delay`` seconds) to look for claimable jobs."""
        if delay is not None:
            # At most a day: poll looks every poll interval anyway, and a start time
            # centuries ahead would overflow Huey's datetime.
            self.threads.wake(delay=min(max(delay, 0), 86400))
        elif self.threads.waiting() < self.config.queue.worker_threads:
            self.threads.wake()  # with every thread busy, the storage asks _add_thread
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
        self.threads.check_health()

    def release_models(self) -> int:
        """Let the processors' models go once no job has run for models.idle_release_seconds;
        how many instances went."""
        return self.pool.release_idle()

    def _add_thread(self) -> None:
        """A drain found every worker thread busy: start one more, up to
        queue.worker_threads, while the limit lets one more job run here by the state the
        latest claim read (none after a change of it, see on_event: then one more anyway,
        and the claim keeps to the limit). No database here: this runs in whichever thread
        woke the workers, perhaps inside its transaction."""
        if not self.started or self.stopping.is_set():
            return
        state = self._claimed_state
        if state is not None and self.hands.drainers() >= self.effective_limit(state):
            return
        self.threads.add()

    def under_way(self, job_id: int) -> None:
        """The job in hand is more than a moment's work: its first progress report, or
        START_DELAY without one. Only now may another job start beside it (see _drain),
        if the limit lets one more run here."""
        if not self.hands.mark_under_way(job_id):
            return
        state = self._claimed_state  # no database here: a processor's thread reports
        if not self.stopping.is_set() and (state is None or self._room(state)):
            self.kick()

    def in_hand(self) -> set[int]:
        """Ids of the jobs this process's worker threads are running now."""
        return self.hands.ids()

    def renew_leases(self) -> None:
        """The heartbeat: renew the leases of the jobs in hand."""
        held = self.in_hand()
        at = time.monotonic()
        jobs.heartbeat(self.owner, self.config.queue.lease_seconds, held)
        for job_id in held:
            self.renewed(job_id, at)

    def renewed(self, job_id: int, at: float) -> None:
        self.hands.renewed(job_id, at)

    def lease_ran_out(self, job_id: int) -> bool:
        """Whether the job's lease may have run out, so that another node may have taken
        the job: not renewed for lease_seconds. Never on SQLite: the queue is on this
        machine, and while this process cannot write it no other can take the job."""
        if not store.is_postgres(Job._meta.database):
            return False
        renewed = self.hands.renewed_at(job_id)
        return renewed is not None and time.monotonic() - renewed >= self.config.queue.lease_seconds

    def effective_limit(self, state: QueueState | None = None) -> int:
        """How many jobs may run here now, by the queue's state (read now if not given)."""
        if self.drained or not self.config.queue.worker_enabled:
            return 0  # drained, or a node that runs no jobs
        state = state or jobs.queue_state(self.node)
        return self.gate.effective_limit(
            state.max_concurrent, state.dynamic_concurrency, state.paused, self.hands.threads()
        )

    # -- running jobs ------------------------------------------------------------------------

    def _drain(self) -> None:
        """A wake-up: drain the line, unless another drain is at it (JobsInHand.enter_drain)."""
        if not self.hands.enter_drain():
            return
        counted_out = False
        try:
            counted_out = self._drain_line()
        finally:
            if not counted_out:
                self.hands.leave_drain()

    def crowded(self, own: int) -> bool:
        return self.hands.crowded(own)

    def _drain_line(self) -> bool:
        """Claim and run jobs until none is left to claim here; True when it stepped back
        for another drain (JobsInHand.step_back), counted out already."""
        job: Job | None = None
        while not self.stopping.is_set():
            if job is None:
                self.hands.claiming()
                try:
                    job = self._claim()
                except Exception as exc:
                    # The database away (locked, full, connection lost): look again shortly
                    # rather than let the error end this drain.
                    retry = self.config.queue.poll_interval
                    if store.disk_full(exc):  # said by the gate, which holds starts back
                        self.note_database_full(exc)
                    else:
                        log.exception("claiming the next job failed; trying again in %g s", retry)
                    store.release_connection()
                    self.kick(delay=retry)
                    return False
                if job is None:
                    if self.hands.woken_while_claiming():
                        continue  # a job queued as this claim read may have been missed
                    store.release_connection()
                    return False
            job = self.run_job(job)  # the next one, when its finish claimed one
            if job is None and self.hands.step_back():
                store.release_connection()
                return True
        if job is not None:  # claimed as the service began to stop: back to its place
            try:
                jobs.requeue(job, self.owner)
            except Exception as exc:  # its lease runs out and the reaper recovers it
                log.warning("job %s not given back at shutdown: %s", job.task_id, exc)
        return False

    def _claim(self) -> Job | None:
        request = self.claim_request()
        return jobs.claim(
            request.owner,
            request.node,
            request.limit,
            request.lease_seconds,
            can_run=request.can_run,
            cluster_can_run=request.cluster_can_run,
        )

    def claim_request(self) -> jobs.ClaimRequest:
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
        return self.hands.drainers() < self.effective_limit(state)

    def run_job(self, job: Job) -> Job | None:
        """Run ``job``; returns the next job when its finish claimed one (JobRun.run)."""
        following: list[Job] = []
        context = logs.current_task.set(job.task_id)
        self.hands.take(job.id, self.budget())  # its whole budget until it knows (JobRun)
        try:
            JobRun(self, job).run(following)
        except jobs.LeaseLost:
            # Another worker may run it now: nothing of this run was written into the job.
            log.warning("job %s: lease lost, another worker has it", job.task_id)
        except BaseException as exc:  # a library's sys.exit or a stray KeyboardInterrupt too
            if store.disk_full(exc):
                self._wait_for_room(job, exc)
            else:
                self._give_back(job, exc)
        finally:
            self.hands.release(job.id)
            logs.current_task.reset(context)
            store.release_connection()
        return following[0] if following else None

    def _wait_for_room(self, job: Job, exc: BaseException) -> None:
        """Recording the run failed because the queue database's disk is full: no fault of
        the job's, so no crash or retry is counted. Hold it (in hand, so the reaper leaves
        it) and nothing else starts, until a write gets through: then it is back in line at
        its old place, and runs again from its last checkpoint."""
        self.note_database_full(exc)
        log.warning(
            "job %s held: its run cannot be recorded until the database has room", job.task_id
        )
        while not self.stopping.is_set():
            try:
                _requeue_once(job, self.owner)
            except Exception as again:
                store.release_connection()
                if not store.disk_full(again):
                    self._give_back(job, again)
                    return
                self.note_database_full(again)
                self.stopping.wait(DATABASE_FULL_POLL)
                continue
            self.gate.database_writable()
            log.warning("job %s back in line: the queue database can be written again", job.task_id)
            return
        # Stopping: its lease runs out, and the next start takes it back.

    def note_database_full(self, exc: BaseException) -> None:
        """Hold starts back, and say why, while the queue database's disk is full."""
        database = store.sqlite_file(self.config.service.database_url, self.config.data_dir)
        self.gate.database_full(exc, database.parent if database is not None else None)

    def _give_back(self, job: Job, exc: BaseException) -> str:
        """After an error outside the processors (recording a run failed even after the
        retries): release the job rather than leave it held by no one."""
        error = settle.describe(exc)
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

    def document_failures(self, task_ids: Collection[str]) -> None:
        """Write the failed documents of these jobs' runs that have none: a run parked
        after a crash loop (jobs.give_back, jobs.reap) had no worker left to write it."""
        for run in jobs.undocumented_failures(task_ids):
            job = run.job
            out_dir = outputs.results_dir(self.config.data_dir, job.file.file_uuid)
            document = settle.stage_failed(
                job, run, None, run.last_checkpoint, run.error or "", out_dir, self._check_disk
            )
            if document is not None:
                try:
                    jobs.documented(run, document)
                finally:
                    document.discard()

    def budget(self) -> int:
        """The threads one job may use (``queue.job_threads``)."""
        return job_threads(self.config.queue.job_threads)

    def hold_threads(self, job_id: int, threads: int) -> None:
        """The threads a job in hand uses, once it knows (counted for its budget until then)."""
        self.hands.hold_threads(job_id, threads)

    def _check_disk(self) -> None:
        """A write failed: if the disk is full, stop admitting jobs now, not at the next sample."""
        with contextlib.suppress(OSError):
            self.gate.check_disk(*outputs.written_folders(self.config.data_dir))
