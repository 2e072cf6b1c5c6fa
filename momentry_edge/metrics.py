"""/metrics: Prometheus text built from the tables at scrape time (it observes, never writes)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import peewee as pw
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from . import db
from .db import FileState, Job, JobStatus, MediaFile, ProcessorRun, RunStatus

DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200)


class _Collector:
    def __init__(self, effective_limit: Callable[[], int]) -> None:
        self.effective_limit = effective_limit

    def collect(self) -> Iterator[Metric]:
        by_status = GaugeMetricFamily("momentry_jobs", "Jobs by status.", labels=["status"])
        counts = dict(Job.select(Job.status, pw.fn.COUNT(Job.id)).group_by(Job.status).tuples())
        for status in (*db.ACTIVE_STATES, *db.FINAL_STATES):
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
            MediaFile.select(MediaFile.state, pw.fn.COUNT(MediaFile.id))
            .group_by(MediaFile.state)
            .tuples()
        )
        for state in (FileState.PRESENT, FileState.MISSING, FileState.REJECTED):
            files.add_metric([state], file_counts.get(state, 0))
        yield files
        yield self._durations()

    def _durations(self) -> HistogramMetricFamily:
        histogram = HistogramMetricFamily(
            "momentry_processor_duration_seconds",
            "Time each completed processor run took.",
            labels=["processor"],
        )
        took = ProcessorRun.completed_at - ProcessorRun.started_at
        rows = (
            ProcessorRun.select(ProcessorRun.processor, took.alias("took"))
            .where(
                ProcessorRun.status == RunStatus.COMPLETED, ProcessorRun.started_at.is_null(False)
            )
            .tuples()
        )
        per_processor: dict[str, list[float]] = {}
        for name, seconds in rows:
            per_processor.setdefault(name, []).append(max(seconds or 0.0, 0.0))
        for name, values in sorted(per_processor.items()):
            buckets = [(str(b), sum(v <= b for v in values)) for b in DURATION_BUCKETS]
            buckets.append(("+Inf", len(values)))
            histogram.add_metric([name], buckets, sum(values))
        return histogram


def render_metrics(effective_limit: Callable[[], int]) -> tuple[bytes, str]:
    """The scrape; ``effective_limit`` gives the jobs this node may run at once now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(effective_limit))
    return generate_latest(registry), CONTENT_TYPE_LATEST
