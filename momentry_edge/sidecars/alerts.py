"""Operator alerts: a short plain-text POST to ``[alerts] url`` when something needs a person."""

# Sent for: a job that ends failed or partial (it is then on the dead list), the disk
# guard starting to hold jobs back, a scheduled backup skipped (no room, no pg_dump),
# a node of a shared queue whose heartbeat stopped, and waiting jobs no live node can
# run. The body is plain text with ntfy's optional ``Title``, ``Priority`` and ``Tags``
# headers, so an ntfy topic URL works as is. The bus listener only queues; one thread
# posts, retrying with doubling delays, so no job ever waits on it.

from __future__ import annotations

import heapq
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import jobs, outbound, redact, store
from ..events import Event
from ..store import JobStatus
from .background import Background

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

BACKLOG = 100  # alerts waiting at most; beyond that the oldest news is dropped
MAX_TEXT = 1000  # characters of a message: a notification, not a report


@dataclass(order=True)
class Alert:
    due: float
    seq: int
    title: str = field(compare=False)
    message: str = field(compare=False)
    priority: str = field(compare=False, default="default")
    tags: str = field(compare=False, default="")
    task_id: str | None = field(compare=False, default=None)  # message filled in from the job
    attempt: int = field(compare=False, default=0)


class AlertSender(Background):
    def __init__(
        self,
        url: str,
        node: str,
        *,
        attempts: int = 6,
        first_delay: float = 1.0,
        timeout: float = 10.0,
    ) -> None:
        super().__init__("alerts")
        self._url = url
        self._node = node
        self._attempts = attempts
        self._first_delay = first_delay
        self._timeout = timeout
        self._heap: list[Alert] = []
        self._seq = itertools.count()

    def on_event(self, event: Event) -> None:
        """Bus listener: turn the events an operator should hear about into alerts."""
        kind = event["type"]
        if kind == "job.finished" and event.get("status") in (JobStatus.FAILED, JobStatus.PARTIAL):
            status = event["status"]
            self._queue(
                f"job {status}",
                f"job {event['task_id']} ended {status}",
                priority="high",
                tags="warning",
                task_id=event["task_id"],
            )
        elif kind == "queue.blocked":
            self._queue("jobs held back", event["reason"], priority="high", tags="floppy_disk")
        elif kind == "backup.skipped":
            self._queue("backup skipped", event["reason"], priority="high", tags="floppy_disk")
        elif kind == "job.stalled":
            self._queue(
                "job stalled",
                f"job {event['task_id']} on node {event['node']} has reported no progress since "
                f"{event['progress_at']}",
                priority="high",
                tags="warning",
                task_id=event["task_id"],
            )
        elif kind == "queue.stranded":
            self._queue(
                "jobs no node can run",
                f"{event['count']} waiting job(s) of {', '.join(event['processors'])}: "
                f"{event['reason']}",
                priority="high",
                tags="warning",
            )
        elif kind == "node.lost":
            self._queue(
                "node lost",
                f"node {event['node']} on {event['host']} stopped its heartbeat "
                f"(last seen {event['last_seen']}); its jobs are taken over once their leases end",
                priority="urgent",
                tags="rotating_light",
            )

    def _queue(self, title: str, message: str, **extra: Any) -> None:
        alert = Alert(
            0.0, next(self._seq), f"momentry-edge {self._node}: {title}", message, **extra
        )
        with self._cond:
            heapq.heappush(self._heap, alert)
            if len(self._heap) > BACKLOG:
                self._heap.remove(min(self._heap, key=lambda a: a.seq))
                heapq.heapify(self._heap)
            self._cond.notify()

    def _loop(self) -> None:
        with outbound.client(self._timeout) as client:
            while True:
                with self._cond:
                    while not self._stopping.is_set() and (
                        not self._heap or self._heap[0].due > time.time()
                    ):
                        wait = self._heap[0].due - time.time() if self._heap else None
                        self._cond.wait(wait)
                    if self._stopping.is_set():
                        return
                    alert = heapq.heappop(self._heap)
                try:
                    self._send(client, alert)
                except Exception:  # a bug: this alert is lost, the later ones still go out
                    log.exception("alert %r not sent", alert.title)

    def _send(self, client: httpx.Client, alert: Alert) -> None:
        if alert.task_id is not None and alert.attempt == 0:
            alert.message = _job_message(alert.task_id, alert.message)
        alert.attempt += 1
        headers = {"Title": alert.title, "Priority": alert.priority}
        if alert.tags:
            headers["Tags"] = alert.tags
        try:
            status = outbound.post(
                client,
                self._url,
                self._timeout,
                content=alert.message.encode(),
                headers={k: _header(v) for k, v in headers.items()}
                | {"Content-Type": "text/plain; charset=utf-8"},
            )
            if 200 <= status < 300:
                return
            problem = f"HTTP {status}"
        except Exception as exc:  # whatever it is (even a URL httpx cannot use), a failed try
            problem = redact.scrub(f"{type(exc).__name__}: {exc}", self._url)[:500]
        if alert.attempt >= self._attempts:
            log.error(
                "alert %r gave up after %d attempts (%s)", alert.title, alert.attempt, problem
            )
            return
        delay = self._first_delay * 2 ** (alert.attempt - 1)
        log.warning("alert %r failed (%s); retrying in %.0f s", alert.title, problem, delay)
        alert.due = time.time() + delay
        with self._cond:
            heapq.heappush(self._heap, alert)


def _job_message(task_id: str, fallback: str) -> str:
    """The file and the errors of a job, read on the alert thread (never the worker's)."""
    try:
        job = jobs.find_job(task_id)
        error = job.error_message or "no error recorded"
        return f"{fallback}: {job.file.name} ({job.file.file_uuid}): {error}"[:MAX_TEXT]
    except Exception:  # the job removed since, or the database away: the short text will do
        return fallback
    finally:
        store.release_connection()


def _header(value: str) -> str:
    # HTTP header values are Latin-1; file names and reasons may not be.
    return value.encode("latin-1", "replace").decode("latin-1")
