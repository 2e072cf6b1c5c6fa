"""The threads each of alerts, callbacks and the Redis mirror run beside the service."""

# A subclass writes ``_loop``: it waits on ``_cond`` (which its bus listener notifies)
# and returns once ``_stopping`` is set; ``_stopping.wait(s)`` is a pause that only
# ``stop`` cuts short. ``stop`` wakes the loops and waits a bounded time for them: the
# threads are daemons, so a loop stuck in a slow request never holds up the exit.

from __future__ import annotations

import threading
import time


class Background:
    def __init__(self, name: str, join_timeout: float = 2.0, threads: int = 1) -> None:
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._join_timeout = join_timeout
        self._threads = [
            threading.Thread(target=self._loop, name=name if i == 0 else f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:  # a loop between its check and its wait gets this notify
            self._cond.notify_all()
        deadline = time.monotonic() + self._join_timeout  # for all of them, not each
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))

    def _loop(self) -> None:
        raise NotImplementedError
