"""The jobs in hand: those this process's worker threads run now, the threads each uses, its
lease's last renewal, which are under way, and how many drains run; under one lock."""

from __future__ import annotations

import threading
import time


class JobsInHand:
    """Bookkeeping only: no database, no waking (Workers decides on what this says)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The jobs worker threads are running now (the only leases the heartbeat renews),
        # each with the threads it runs on.
        self._threads: dict[int, int] = {}
        # When each job's lease was last renewed (monotonic; the write's start, so no later
        # than the database's): past lease_seconds, another node may have taken the job.
        self._renewed: dict[int, float] = {}
        # Jobs in hand that have shown they are more than a moment's work (under_way).
        self._under_way: set[int] = set()
        # Worker threads in a drain: each claims again when its job ends, so only while
        # fewer than the limit are draining does a free place need another thread woken.
        self._drainers = 0
        self._woken_meanwhile = False  # a wake-up left to the drains under way

    # -- the jobs ---------------------------------------------------------------------------

    def take(self, job_id: int, threads: int) -> None:
        """A job claimed just now, counted for ``threads`` until it knows what it uses."""
        with self._lock:
            self._threads[job_id] = threads
            self._renewed[job_id] = time.monotonic()

    def hold_threads(self, job_id: int, threads: int) -> None:
        with self._lock:
            self._threads[job_id] = threads

    def release(self, job_id: int) -> None:
        with self._lock:
            self._threads.pop(job_id, None)
            self._renewed.pop(job_id, None)
            self._under_way.discard(job_id)

    def ids(self) -> set[int]:
        with self._lock:
            return set(self._threads)

    def threads(self) -> list[int]:
        """The threads each job in hand runs on."""
        with self._lock:
            return list(self._threads.values())

    def renewed(self, job_id: int, at: float) -> None:
        with self._lock:
            if job_id in self._threads:
                self._renewed[job_id] = max(at, self._renewed.get(job_id, at))

    def renewed_at(self, job_id: int) -> float | None:
        with self._lock:
            return self._renewed.get(job_id)

    def mark_under_way(self, job_id: int) -> bool:
        """Note the job in hand under way; whether that is news."""
        with self._lock:
            if job_id not in self._threads or job_id in self._under_way:
                return False
            self._under_way.add(job_id)
            return True

    # -- the drains -------------------------------------------------------------------------

    def drainers(self) -> int:
        with self._lock:
            return self._drainers

    def enter_drain(self) -> bool:
        """Count a drain in, unless another is claiming or running a job not yet under way:
        beside it, a second would only trade the GIL with it (jobs that short drain as fast
        one at a time, on a third less CPU). That one claims again when its job ends (again
        if its claim found nothing while this wake-up came); if its job runs on, under_way
        wakes another."""
        with self._lock:
            if self._drainers > len(self._under_way):
                self._woken_meanwhile = True
                return False
            self._drainers += 1
            return True

    def leave_drain(self) -> None:
        with self._lock:
            self._drainers -= 1

    def step_back(self) -> bool:
        """Count this drain out if another is claiming or running a job not yet under way:
        it goes on with the line. Under the same lock, so that of two drains that end
        together one goes on."""
        with self._lock:
            if self._drainers - 1 > len(self._under_way):
                self._drainers -= 1
                return True
            return False

    def crowded(self, own: int) -> bool:
        """Whether another drain is claiming, or running a job not yet under way (``own``,
        this drain's job, left out)."""
        with self._lock:
            return self._drainers - 1 > len(self._under_way - {own})

    def claiming(self) -> None:
        """A claim starts: wake-ups from now on are its to see."""
        with self._lock:
            self._woken_meanwhile = False

    def woken_while_claiming(self) -> bool:
        """A wake-up came while the claim read: a job it missed may be there."""
        with self._lock:
            return self._woken_meanwhile
