"""Running jobs that stopped reporting progress (``queue.stall_seconds``): each said once,
in the log and as ``job.stalled`` (an alert), by one node of those sharing the queue."""

from __future__ import annotations

import logging

from .. import clock, cluster
from ..clock import iso
from ..events import bus
from ..store import Job, JobStatus, MediaFile
from . import views

log = logging.getLogger(__name__)


class StallWatch:
    """Looks at the running jobs; only the live node first by id reports (as NodeWatch)."""

    def __init__(self, node_id: str, within: float, stall_after: float) -> None:
        self.node_id = node_id
        self.within = within
        self.stall_after = stall_after
        self._reported: set[tuple[str, float]] = set()  # (task_id, last progress)

    def check(self, now: float | None = None) -> list[str]:
        """The task ids of the jobs found stalled now, each once per silence."""
        now = clock.now() if now is None else now
        live = cluster.live_nodes(self.within, now)
        if not live or live[0].node_id != self.node_id:
            return []
        running = list(
            Job.select(Job, MediaFile).join(MediaFile).where(Job.status == JobStatus.PROCESSING)
        )
        progressed = views.last_progress(running)
        stalled = []
        for job in running:
            at = progressed[job.id]
            if now - at <= self.stall_after or (job.task_id, at) in self._reported:
                continue
            self._reported.add((job.task_id, at))
            stalled.append(job.task_id)
            log.warning(
                "job %s (%s) on node %s has reported no progress for %d s: stalled",
                job.task_id,
                job.file.name,
                job.node,
                now - at,
                extra={"task_id": job.task_id},
            )
            bus.publish("job.stalled", task_id=job.task_id, node=job.node, progress_at=iso(at))
        return stalled
