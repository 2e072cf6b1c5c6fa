"""How long work takes on this machine: each processor's measured seconds per second of
media, from the jobs finished last. A job's progress is weighted by it, and the queue's
estimated starts and a running job's time remaining are drawn from it."""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import peewee as pw

from .. import store
from ..store import JobStatus

HISTORY = 100  # finished jobs measured
REFRESH = 60.0  # seconds a measurement is kept (a job finished here drops it at once)


@dataclass(frozen=True)
class Rates:
    """``per_second``: processor -> seconds of work per second of media (measured);
    ``average_job``: seconds per finished job, for media of no known duration."""

    per_second: dict[str, float] = field(default_factory=dict)
    average_job: float | None = None

    def rate(self, processor: str) -> float | None:
        """A processor not measured yet counts as the median of those measured."""
        if processor in self.per_second:
            return self.per_second[processor]
        return statistics.median(self.per_second.values()) if self.per_second else None

    def job_seconds(self, processors: Sequence[str], duration: float | None) -> float | None:
        """Expected seconds of a whole job; the average job without a duration or rates."""
        if duration and self.per_second:
            return sum(self.rate(p) or 0.0 for p in processors) * duration
        return self.average_job

    def weights(self, processors: Iterable[str]) -> dict[str, float]:
        """Each processor's share of a job's work (equal shares before any is measured)."""
        return {p: (self.rate(p) or 1.0) if self.per_second else 1.0 for p in processors}

    def remaining(
        self, done: dict[str, float], duration: float | None, elapsed: float, progress: int
    ) -> float | None:
        """Seconds left of a running job, ``done``: each processor's fraction done."""
        if duration and self.per_second:
            return sum((self.rate(p) or 0.0) * duration * (1 - f) for p, f in done.items())
        if progress:
            return elapsed * (100 - progress) / progress
        if self.average_job is not None:
            return max(self.average_job - elapsed, 0.0)
        return None


def weighted_percent(parts: Sequence[tuple[str, float]], rates: Rates) -> int:
    """Whole-job percent of (processor, fraction done) per run, each by its expected work."""
    if not parts:
        return 0
    weights = rates.weights(p for p, _ in parts)
    total = sum(weights[p] for p, _ in parts)
    return int(100 * sum(weights[p] * f for p, f in parts) / total) if total else 0


_lock = threading.Lock()
_cached: tuple[float, float | None, Rates] | None = None  # when, the newest end then, rates


def current(latest: bool = False) -> Rates:
    """This machine's rates, measured again at most every REFRESH seconds; with ``latest``
    also once a job has ended since, here or on another node sharing the queue (the newest
    end, read from its index, is the check: what the views ask; a progress report does
    without). Not from inside a read snapshot (store.read_snapshot): one older than a job's
    end would be kept."""
    global _cached
    newest = store.Job.select(pw.fn.MAX(store.Job.completed_at)).scalar() if latest else None
    with _lock:
        if (
            _cached is None
            or time.monotonic() - _cached[0] > REFRESH
            or (latest and newest != _cached[1])
        ):
            if not latest:  # not read: the next view's check measures again
                newest = _cached[1] if _cached is not None else None
            _cached = (time.monotonic(), newest, measure())
        return _cached[2]


def forget() -> None:
    """A job finished: the next caller measures again."""
    global _cached
    with _lock:
        _cached = None


def measure() -> Rates:
    """Each finished job's time is shared among its processors in proportion to their runs
    (runs that overlap, as a shared frame pass's do, then add up to the job's time), and
    each processor's rate is the median over the jobs of its share per second of media."""
    # Newest first along job_completed_at (see views.average_job_seconds).
    hint = "" if store.is_postgres(store.Job._meta.database) else " INDEXED BY job_completed_at"
    jobs = store.execute(
        f"SELECT job.id, job.completed_at - job.started_at, media_file.duration FROM job{hint}"
        " JOIN media_file ON media_file.id = job.file_id WHERE job.status IN (?, ?, ?)"
        " AND job.started_at IS NOT NULL ORDER BY job.completed_at DESC LIMIT ?",
        JobStatus.COMPLETED,
        JobStatus.PARTIAL,
        JobStatus.FAILED,
        HISTORY,
    ).fetchall()
    took = [row[1] for row in jobs if row[1] is not None and row[1] >= 0]
    average = sum(took) / len(took) if took else None
    timed = {row[0]: (row[1], row[2]) for row in jobs if row[1] and row[2]}
    spans: dict[int, dict[str, float]] = defaultdict(dict)
    if timed:
        marks = ",".join("?" * len(timed))
        for job_id, processor, span in store.execute(
            "SELECT job_id, processor, completed_at - started_at FROM processor_run"
            f" WHERE job_id IN ({marks}) AND status = ? AND started_at IS NOT NULL",
            *timed,
            store.RunStatus.COMPLETED,
        ).fetchall():
            if span is not None and span >= 0:
                spans[job_id][processor] = span
    ratios: dict[str, list[float]] = defaultdict(list)
    for job_id, runs in spans.items():
        wall, duration = timed[job_id]
        total = sum(runs.values())
        for processor, span in runs.items():
            share = wall * span / total if total else wall / len(runs)
            ratios[processor].append(share / duration)
    return Rates({p: statistics.median(r) for p, r in ratios.items()}, average)
