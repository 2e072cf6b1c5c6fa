"""The worker threads and their wake-ups, on Huey's public interfaces (a storage class, its
consumer, task scheduling, dequeue and execute), none of its private attributes. Huey's
queue only carries "drain" wake-ups; which job runs is decided by jobs.claim."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from huey import Huey
from huey.storage import MemoryStorage

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 30.0  # seconds the threads get to end their jobs at a stop


class BlockingMemoryStorage(MemoryStorage):
    """Huey's in-memory queue, but ``dequeue`` waits for a message instead of returning None.

    Huey's workers do not poll-and-sleep on a blocking storage, so a wake-up reaches an
    idle worker in about a millisecond, and an idle worker never wakes until ``close``
    lets them all go at shutdown.
    """

    blocking = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ready = threading.Condition(self._lock)
        self._closed = False
        self._waiting = 0  # workers blocked in dequeue
        # Called, outside the lock, when a message finds no idle worker to take it.
        self.unserved: Callable[[], None] | None = None

    def enqueue(self, data: bytes, priority: float | None = None) -> None:
        with self._ready:
            super().enqueue(data, priority)
            self._ready.notify()
            unserved = self._waiting < len(self._queue)
        if unserved and self.unserved is not None:
            self.unserved()

    def dequeue(self) -> bytes | None:
        with self._ready:
            data = super().dequeue()
            while data is None and not self._closed:
                self._waiting += 1
                try:
                    self._ready.wait()
                finally:
                    self._waiting -= 1
                data = super().dequeue()
            return data

    def close(self) -> None:
        """From now on ``dequeue`` returns at once, so the workers see the stop."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class WorkerThreads:
    """Threads that run ``drain`` at each wake-up: Huey's consumer runs the first (and the
    scheduler that delivers delayed wake-ups); more start as wake-ups find every thread
    busy (``add``), up to ``most``, so that an idle service holds no threads it never
    uses. Those take wake-ups from the same queue, through Huey's dequeue and execute."""

    def __init__(self, drain: Callable[[], None], most: int) -> None:
        self.huey = Huey("momentry-edge", storage_class=BlockingMemoryStorage, results=False)
        self.storage: BlockingMemoryStorage = self.huey.storage
        self._task = self.huey.task(name="drain")(drain)
        self._most = most
        self.consumer = self.huey.create_consumer(
            workers=1,
            periodic=False,
            check_worker_health=False,  # the service's main loop calls check_health
            shutdown_timeout=SHUTDOWN_TIMEOUT,
        )
        self._lock = threading.Lock()
        self._extra: list[threading.Thread] = []

    def start(self) -> None:
        """Start the consumer. It sets handlers for SIGINT, SIGTERM and SIGHUP, but the
        service owns the signals: the handlers it had are put back."""
        held = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.consumer.start()
        for signum, handler in held.items():  # None: one not set from Python, the default
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def stop(self) -> None:
        """Let every thread end its job and go (see BlockingMemoryStorage.close)."""
        self.storage.close()
        self.consumer.stop(graceful=True)
        with self._lock:
            extra = list(self._extra)
        for thread in extra:
            thread.join(SHUTDOWN_TIMEOUT)

    def wake(self, delay: float | None = None) -> None:
        """One drain now, or after ``delay`` seconds (Huey's scheduler delivers it)."""
        if delay is None:
            self._task()
        else:
            self._task.schedule(delay=delay)

    def waiting(self) -> int:
        """Wake-ups not taken by a thread yet."""
        return self.storage.queue_size()

    def count(self) -> int:
        with self._lock:
            return 1 + len(self._extra)

    def add(self) -> bool:
        """Start one more thread, unless there are ``most`` already; whether one started."""
        with self._lock:
            number = 1 + len(self._extra)
            if number >= self._most:
                return False
            thread = threading.Thread(target=self._take, name=f"Worker-{number + 1}", daemon=True)
            self._extra.append(thread)
        thread.start()
        return True

    def check_health(self) -> None:
        """Restart the consumer's thread if it died (the service's main loop calls it)."""
        self.consumer.check_worker_health()

    def _take(self) -> None:
        """Huey's worker loop: a wake-up scheduled for later is put back in the schedule
        by ``execute``; one due runs the drain."""
        while (task := self.huey.dequeue()) is not None:
            try:
                self.huey.execute(task)
            except Exception:  # as Huey's own worker does: logged, and the thread goes on
                log.exception("a wake-up failed")
