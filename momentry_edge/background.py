"""The one thread each of alerts, callbacks and the Redis mirror runs beside the service.

A subclass writes ``_loop``: it waits on ``_cond`` (which its bus listener notifies)
and returns once ``_stopping`` is set; ``_stopping.wait(s)`` is a pause that only
``stop`` cuts short. ``stop`` wakes the loop and waits a bounded time for it: the
thread is a daemon, so a loop stuck in a slow request never holds up the exit.
"""

from __future__ import annotations

import threading


class Background:
    def __init__(self, name: str, join_timeout: float = 2.0) -> None:
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._join_timeout = join_timeout
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._cond:  # a loop between its check and its wait gets this notify
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=self._join_timeout)

    def _loop(self) -> None:
        raise NotImplementedError
