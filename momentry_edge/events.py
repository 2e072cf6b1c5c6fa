"""In-process publish/subscribe of job and queue changes.

jobs/ publishes after each state change commits; the SSE endpoint, the
metrics and the worker wake-up subscribe. Subscribers only observe: a slow or
gone subscriber drops events, it never blocks a publisher.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Event = dict[str, Any]

# Every event type, one line each: what happened (docs/api.md lists them for /api/v1/events).
EVENTS: dict[str, str] = {
    "job.queued": "a job was queued (or re-queued by a request): task_id, file_uuid, not_before",
    "job.extended": "a waiting job took on more processors from a request it now serves too",
    "job.held": "a waiting job's not_before was pushed on: its file's writer closed it again",
    "job.started": "a worker claimed the job and began it",
    "job.progress": "a run reported progress: task_id, progress, current, total",
    "job.retrying": "the job ended with runs to retry later: status, next_attempt_at",
    "job.retry_due": "a retrying job's time came: it is back in line",
    "job.finished": "the job ended (completed, partial, failed, cancelled): status, callback",
    "job.cancelling": "a cancel was asked of a running job: its worker stops it at a report",
    "job.requeued": "the job went back in line (shutdown, its file still arriving, given back)",
    "job.recovered": "a job a lost worker held is back in line (reap, a crash, a lease run out)",
    "job.documented": "a parked job's failed run got its document afterwards: processor",
    "job.priority": "the job's priority changed: priority",
    "job.prioritized": "the job was moved to the head of the line",
    "job.stalled": "a running job reported no progress for queue.stall_seconds: node, progress_at",
    "job.dismissed": "a failed, partial or cancelled job's record was removed (Dismiss)",
    "job.forgotten": "the job's file was forgotten: the job's record and results are gone",
    "job.callback_owed": "a request gave an ended job a new callback_url: its summary is owed",
    "queue.paused": "the queue was paused: no job starts",
    "queue.resumed": "the queue was resumed",
    "queue.concurrency": "the concurrency settings changed: max_concurrent, dynamic_concurrency",
    "queue.cleared": "the waiting jobs were cancelled: cleared",
    "queue.blocked": "a full disk holds jobs back",
    "queue.stranded": "waiting jobs that no live node can run: count, processors, reason",
    "queue.unblocked": "the disk has room again: jobs start",
    "file.registered": "a file was recorded or its record changed: file_uuid, state, outcome",
    "file.missing": "recorded files were found gone from disk: count",
    "models.pull": "a model pull at start moved on: model, state, done, total",
    "node.lost": "another node stopped its heartbeat: node, host, last_seen",
    "backup.skipped": "a scheduled backup was not taken: reason",
    "service.stopping": "the service is stopping (the last event of a stream)",
}

log = logging.getLogger(__name__)


class EventBus:
    def __init__(self, backlog: int = 1000) -> None:
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[Event]] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._backlog = backlog
        self._local = threading.local()

    def publish(self, event_type: str, **data: Any) -> None:
        if event_type not in EVENTS:
            raise ValueError(f"event type {event_type!r} is not in events.EVENTS")
        event = {"type": event_type, "at": time.time(), **data}
        held = getattr(self._local, "held", None)
        if held is not None:
            held.append(event)
            return
        self._deliver(event)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold this thread's events until the block ends, then publish them; drop them if
        it raises. Around a transaction that makes many changes (a batch of files), so
        no one hears of a job before it is committed."""
        if getattr(self._local, "held", None) is not None:
            yield  # already held further out: published when that block ends
            return
        held: list[Event] = []
        self._local.held = held
        try:
            yield
        finally:
            self._local.held = None
        for event in held:
            self._deliver(event)

    def _deliver(self, event: Event) -> None:
        with self._lock:
            queues, listeners = list(self._queues), list(self._listeners)
        for q in queues:
            # A stalled reader loses events rather than slowing the queue down.
            with contextlib.suppress(queue.Full):
                q.put_nowait(event)
        for listener in listeners:
            # The change an event tells of is committed: a listener's failure must not turn
            # its request into an error, nor keep the event from the listeners after it.
            try:
                listener(event)
            except Exception:
                log.exception("event %s: a listener failed", event["type"])

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._queues)

    def listen(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` synchronously for every event (must be quick and not raise)."""
        with self._lock:
            self._listeners.append(callback)

    @contextmanager
    def subscribe(self) -> Iterator[queue.Queue[Event]]:
        q: queue.Queue[Event] = queue.Queue(self._backlog)
        with self._lock:
            self._queues.append(q)
        try:
            yield q
        finally:
            with self._lock:
                self._queues.remove(q)


# The process-wide bus; one service runs per process.
bus = EventBus()
