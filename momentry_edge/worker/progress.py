"""A run's progress: the report callback a processor gets, and the start of a run
written with its next write (or on its own once START_DELAY has passed)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import clock, jobs, outputs, store
from ..processors.base import PermanentError, Stop, StopReason
from ..store import ProcessorRun

if TYPE_CHECKING:
    from .job_run import JobRun

log = logging.getLogger(__name__)

REPORT_INTERVAL = 0.5  # seconds between progress writes that carry no checkpoint
# A run's start is written with the run's next write (its first report, or how it ended);
# one that has not written for this long is marked running on its own (StartWriter).
START_DELAY = 0.2


class RunReporter:
    """The report callback a processor gets: saves progress, relays stop requests."""

    def __init__(self, job_run: JobRun, run: ProcessorRun) -> None:
        self.job_run = job_run  # the job's run, which its parts share
        self.job = job_run.job
        self.run = run
        self.start: PendingStart | None = None  # once the run has begun (JobRun._begin)
        self.checkpoint: dict[str, Any] | None = run.last_checkpoint
        self.extras: list[outputs.Staged] = []  # files the run wrote beside its document
        self._last_write = 0.0
        self._quiet_until = 0.0  # after a failed write, no writes until then
        self._unsaved = False  # a checkpoint given during that pause is still to be saved
        self._reported = False  # the run's first report tells the workers (under_way)
        self.abandoned = False  # given up (JobRun._await): its settled run is not touched

    @property
    def last_write(self) -> float:
        return self._last_write

    def report(self, current: int, total: int, checkpoint: dict[str, Any] | None = None) -> None:
        if self.abandoned:
            raise Stop(self.job_run.shared_stop.reason or StopReason.TIMEOUT)
        if not self._reported:
            self._reported = True
            self.job_run.under_way()
        if checkpoint is not None:
            try:
                store.to_json(checkpoint)
            except store.NotJSON as exc:
                # The processor's own error, and the same on every try: its run fails.
                raise PermanentError(f"its checkpoint cannot be saved: {exc}") from None
            self.checkpoint = checkpoint
            self._unsaved = True
        now = time.monotonic()
        # Another part of the job stopped: save where this one is and stop with it.
        stopping = self.job_run.stopping.is_set() or self.job_run.shared_stop.reason is not None
        due = self._unsaved or stopping or now - self._last_write >= REPORT_INTERVAL
        # A run whose lease may have run out goes no further before the database says the
        # job is still this worker's (_write).
        if (due and now >= self._quiet_until) or self.job_run.lease_ran_out():
            if self._write(current, total):
                raise self.job_run.shared_stop.stop(StopReason.CANCELLED)
            if problem := self.job_run.guard.problem():
                raise PermanentError(problem)  # stop now rather than at the end of the run
        if self.job_run.shared_stop.reason is not None:
            raise Stop(self.job_run.shared_stop.reason)
        if self.job_run.stopping.is_set():
            raise self.job_run.shared_stop.stop(StopReason.SHUTDOWN)
        if now > self.job_run.deadline:
            raise self.job_run.shared_stop.stop(StopReason.TIMEOUT)

    def _write(self, current: int, total: int) -> bool:
        """Save progress and renew the lease; returns whether a cancel was asked.

        While the database is out the run goes on (its lease kept by the heartbeat) and
        the next report past a pause saves the latest checkpoint; but once the lease
        may have run out, another node may have taken the job over: the run waits here
        until the database answers, then goes on if the job is still its own."""
        lease = self.job_run.lease_seconds
        holding = False
        while True:
            self._last_write = time.monotonic()
            try:
                with self.carrying_start() as started:
                    cancel = jobs.report(
                        self.job.id,
                        self.run.id,
                        self.job_run.owner,
                        current=current,
                        total=total,
                        checkpoint=self.checkpoint if self._unsaved else None,
                        lease_seconds=lease,
                        started_at=self.job.started_at,
                        run_started=started,
                    )
            except jobs.LeaseLost:
                raise self.job_run.shared_stop.stop(StopReason.LEASE) from None
            except store.OUTAGE_ERRORS as exc:
                store.after_outage()
                pause = lease / 3
                if not self.job_run.lease_ran_out():
                    full = store.disk_full(exc)
                    if full:  # said by the gate, once a minute; nothing starts meanwhile
                        self.job_run.host.note_database_full(exc)
                    log.log(
                        logging.DEBUG if full else logging.WARNING,
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
                if self.job_run.stopping.wait(pause):
                    raise self.job_run.shared_stop.stop(StopReason.SHUTDOWN) from None
                if self.job_run.shared_stop.reason is not None:
                    raise Stop(self.job_run.shared_stop.reason) from None
                continue
            self.job_run.renewed(self._last_write)
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


class PendingStart:
    """A run's start (time, backend, model) until it is written: by the run's next write
    (``take``), or on its own by the StartWriter once START_DELAY has passed without one, so a
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


class StartWriter:
    """A thread that writes the starts (PendingStart) of runs that went START_DELAY without a
    write of their own, oldest first, and tells ``late`` their jobs; started with the
    first start it is given."""

    def __init__(self, late: Callable[[int], None]) -> None:
        self._late = late
        self._ready = threading.Condition()
        self._starts: deque[PendingStart] = deque()  # in order of due time: one delay for all
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, start: PendingStart) -> None:
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
                store.release_connection()
