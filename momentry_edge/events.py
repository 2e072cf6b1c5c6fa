"""In-process publish/subscribe of job and queue changes.

jobs.py publishes after each state change commits; the SSE endpoint, the
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

log = logging.getLogger(__name__)


class EventBus:
    def __init__(self, backlog: int = 1000) -> None:
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[Event]] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._backlog = backlog
        self._local = threading.local()

    def publish(self, event_type: str, **data: Any) -> None:
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
        self._local.held = held = []
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
