"""/metrics: Prometheus text built from the tables at scrape time (it observes, never writes)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import peewee as pw

from .. import store
from ..events import bus
from ..store import FileState, Job, JobStatus, MediaFile, RunStatus

if TYPE_CHECKING:  # prometheus_client loads at the first scrape, not at every start
    from prometheus_client.core import HistogramMetricFamily, Metric

DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)


class _Collector:
    def __init__(self, effective_limit: Callable[[], int]) -> None:
        self.effective_limit = effective_limit

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        by_status = GaugeMetricFamily("momentry_jobs", "Jobs by status.", labels=["status"])
        counts = dict(store.rows(Job.select(Job.status, pw.fn.COUNT(Job.id)).group_by(Job.status)))
        for status in (*store.ACTIVE_STATES, *store.FINAL_STATES):
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status
        yield GaugeMetricFamily(
            "momentry_queue_depth", "Jobs waiting in line.", value=counts.get(JobStatus.PENDING, 0)
        )
        yield GaugeMetricFamily(
            "momentry_active_jobs", "Jobs running.", value=counts.get(JobStatus.PROCESSING, 0)
        )
        yield GaugeMetricFamily(
            "momentry_effective_concurrency",
            "Jobs allowed to run at once now.",
            value=self.effective_limit(),
        )
        files = GaugeMetricFamily("momentry_files", "Registered files by state.", labels=["state"])
        file_counts = dict(
            store.rows(
                MediaFile.select(MediaFile.state, pw.fn.COUNT(MediaFile.id)).group_by(
                    MediaFile.state
                )
            )
        )
        for state in FileState:
            files.add_metric([state], file_counts.get(state, 0))
        yield files
        # Each open stream holds a server thread (and a browser connection): worth watching.
        yield GaugeMetricFamily(
            "momentry_event_streams",
            "Event streams (GET /api/v1/events) open now.",
            value=bus.subscriber_count,
        )
        yield self._durations()

    def _durations(self) -> HistogramMetricFamily:
        from prometheus_client.core import HistogramMetricFamily

        histogram = HistogramMetricFamily(
            "momentry_processor_duration_seconds",
            "Time each completed processor run took.",
            labels=["processor"],
        )
        # Counted by the database, a row per processor and bucket: read into Python, every
        # completed run of the history was a row in memory at each scrape (180,000 runs:
        # 0.4 s and tens of MB a scrape, more with every job).
        rows = store.execute(
            f"SELECT processor, {_BUCKET} AS bucket, COUNT(*), SUM(took)"
            " FROM (SELECT processor, CASE WHEN completed_at - started_at > 0"
            " THEN completed_at - started_at ELSE 0 END AS took"
            " FROM processor_run WHERE status = ? AND started_at IS NOT NULL) AS completed"
            " GROUP BY processor, bucket",
            RunStatus.COMPLETED,
        ).fetchall()
        per_processor: dict[str, list[int]] = {}
        sums: dict[str, float] = {}
        for name, bucket, count, seconds in rows:
            per_processor.setdefault(name, [0] * (len(DURATION_BUCKETS) + 1))[bucket] += count
            sums[name] = sums.get(name, 0.0) + (seconds or 0.0)
        for name, counts in sorted(per_processor.items()):
            cumulative = list(itertools.accumulate(counts))
            buckets = [(str(b), n) for b, n in zip(DURATION_BUCKETS, cumulative, strict=False)]
            buckets.append(("+Inf", cumulative[-1]))
            histogram.add_metric([name], buckets, sums[name])
        return histogram


# The index of the first bucket a run's seconds (``took``) fit in; len(DURATION_BUCKETS): none.
_BUCKET = (
    "CASE "
    + " ".join(f"WHEN took <= {bound} THEN {i}" for i, bound in enumerate(DURATION_BUCKETS))
    + f" ELSE {len(DURATION_BUCKETS)} END"
)


def render_metrics(effective_limit: Callable[[], int]) -> tuple[bytes, str]:
    """The scrape; ``effective_limit`` gives the jobs this node may run at once now."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from prometheus_client.core import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(effective_limit))
    return generate_latest(registry), CONTENT_TYPE_LATEST
