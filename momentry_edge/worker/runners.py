"""Daemon threads that make calls for other threads, so that a caller can stop waiting
for a call that never returns (a hung model) and carry on.

A thread is used again once its call has returned; one left with a call that never
returns stays with it (a daemon thread: it does not hold up the process's exit).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Call(Generic[T]):
    """One call on a runner's thread; ``done`` is set once it has returned or raised."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._context = contextvars.copy_context()  # the caller's, e.g. its log context
        self.done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    def result(self) -> T:
        """What the call returned; what it raised is raised here. Only once ``done``."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def _run(self) -> None:
        try:
            self._result = self._context.run(self._fn)
        except BaseException as exc:  # handed to the caller, whatever it is
            self._error = exc
        finally:
            self.done.set()


class Runners:
    """A pool of daemon threads, each making one call at a time."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Call]] = []
        self._made = 0

    def start(self, fn: Callable[[], T]) -> Call[T]:
        """Call ``fn`` on an idle thread (a new one if none is idle); wait on its ``done``."""
        call = Call(fn)
        with self._lock:
            calls = self._idle.pop() if self._idle else None
            self._made += calls is None
            number = self._made
        if calls is None:
            calls = queue.SimpleQueue()
            name = f"{self._name}-{number}"
            threading.Thread(target=self._serve, args=(calls,), name=name, daemon=True).start()
        calls.put(call)
        return call

    def _serve(self, calls: queue.SimpleQueue[Call]) -> None:
        while True:
            calls.get()._run()
            with self._lock:
                self._idle.append(calls)
