"""In-process publish/subscribe of job and queue changes.

jobs.py publishes after each state change commits; the SSE endpoint, the
metrics and the worker wake-up subscribe. Subscribers only observe: a slow or
gone subscriber drops events, it never blocks a publisher.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Event = dict[str, Any]


class EventBus:
    def __init__(self, backlog: int = 1000) -> None:
        self._lock = threading.Lock()
        self._queues: list[queue.Queue[Event]] = []
        self._listeners: list[Callable[[Event], None]] = []
        self._backlog = backlog

    def publish(self, event_type: str, **data: Any) -> None:
        event = {"type": event_type, "at": time.time(), **data}
        with self._lock:
            queues, listeners = list(self._queues), list(self._listeners)
        for q in queues:
            # A stalled reader loses events rather than slowing the queue down.
            with contextlib.suppress(queue.Full):
                q.put_nowait(event)
        for listener in listeners:
            listener(event)

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
