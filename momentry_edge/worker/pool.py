"""Processor instances kept between runs, each lent to one thread at a time, and let go
once no job has used them for ``models.idle_release_seconds``."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from .. import heap, weights
from ..processors import Registry
from ..processors.base import Processor
from .settle import message

log = logging.getLogger(__name__)


class ProcessorPool:
    """Processor instances, each lent to one thread at a time and kept for the next run:
    a part of a job on a new thread reuses models an earlier run loaded. Once no loan has
    been open for ``release_after`` seconds (0: never), the idle ones are let go and the
    memory they held is given back to the system."""

    def __init__(self, registry: Registry, release_after: float = 0.0) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._idle: dict[str, list[Processor]] = {}
        self.release_after = release_after
        self._lent = 0  # loans open now
        self._used = time.monotonic()  # when the last loan ended
        # Every instance this pool loaded that still exists (idle, lent, or kept alive by
        # something else): what GET /api/v1/processors says is loaded.
        self._loaded: dict[str, weakref.WeakSet[Processor]] = {}
        # processor -> why its last load failed, and its model's mark (weights.load_mark)
        # then: said by GET /api/v1/processors until it loads or its model is replaced.
        self.failed_loads: dict[str, tuple[str, tuple[int, int] | None]] = {}

    def take_idle(self, name: str) -> Processor | None:
        """An idle instance, loaded already, if there is one (nothing here can hang)."""
        with self._lock:
            idle = self._idle.get(name)
            return idle.pop() if idle else None

    def create(self, name: str) -> tuple[Processor, bool]:
        """A new instance, and whether it was loaded: only when it is ready, else it is
        there to say why not."""
        processor = self._registry.create(name)
        if not processor.readiness().ready:
            return processor, False
        try:
            processor.load()
        except BaseException as exc:
            self.failed_loads[name] = (message(exc), weights.load_mark(processor))
            raise
        self.failed_loads.pop(name, None)
        with self._lock:
            self._loaded.setdefault(name, weakref.WeakSet()).add(processor)
        return processor, True

    def explain(self, described: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``described`` (``GET /api/v1/processors``), a processor whose model did not load
        in the last job that needed it not ready, with why (until its model is replaced);
        and how many instances of each hold a loaded model now."""
        loaded = self.loaded()
        for name, entry in described.items():
            entry["loaded"] = loaded.get(name, 0)
        for name, (error, mark) in list(self.failed_loads.items()):
            failed = described.get(name)
            if failed is None or not failed["ready"]:
                continue
            if weights.load_mark(self._registry.create(name)) != mark:
                continue  # put in place anew since: the next job tries it
            failed.update(ready=False, reason=f"its model did not load: {error}")
        return described

    def loaded(self) -> dict[str, int]:
        """Processor name -> instances with a model loaded that still exist."""
        with self._lock:
            return {name: len(made) for name, made in self._loaded.items() if len(made)}

    def give(self, name: str, processor: Processor) -> None:
        with self._lock:
            self._idle.setdefault(name, []).append(processor)

    @contextlib.contextmanager
    def lending(self) -> Iterator[Loan]:
        """A loan for one use; what it took is given back at the end, unless it was lost."""
        with self._lock:
            self._lent += 1
        loan = Loan(self)
        try:
            yield loan
        finally:
            if not loan.lost:
                for name, processor in loan.taken:
                    self.give(name, processor)
            loan.taken.clear()
            with self._lock:
                self._lent -= 1
                self._used = time.monotonic()

    def peek(self, name: str) -> Processor:
        """An instance to look at (its class, its settings), not to run."""
        with self._lock:
            idle = self._idle.get(name)
            if idle:
                return idle[-1]
        return self._registry.create(name)

    def release_idle(self, now: float | None = None) -> int:
        """Let the idle instances go if no loan has been open for ``release_after``
        seconds; how many were let go. The next run loads its models again."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self.release_after or self._lent or now - self._used < self.release_after:
                return 0
            idle, self._idle = self._idle, {}
        count = _unload(idle)
        idle.clear()
        if count:
            gc.collect()  # models in reference cycles (onnxruntime's, mediapipe's graphs)
            heap.give_back()
            log.info("%d idle processor instance(s) let go; loaded again when needed", count)
        return count


def _unload(idle: dict[str, list[Processor]]) -> int:
    """Unload every instance of ``idle``; how many there were."""
    count = 0
    for instances in idle.values():
        for processor in instances:
            count += 1
            try:
                processor.unload()
            except Exception as exc:  # a plugin's own: the instance goes all the same
                log.warning("%s: unloading its model failed: %s", processor.name, exc)
    return count


class Loan:
    """Processors taken for one batch; ``lost`` when a thread that was given up may still
    be using them."""

    def __init__(self, loaded: ProcessorPool) -> None:
        self._loaded = loaded
        self.taken: list[tuple[str, Processor]] = []  # loaded instances, given back after
        self.lost = False

    def take_idle(self, name: str) -> Processor | None:
        processor = self._loaded.take_idle(name)
        if processor is not None:
            self.taken.append((name, processor))
        return processor

    def take(self, name: str) -> Processor:
        """An idle instance, else a new one, loaded if ready. One that was not ready is
        not kept: the model may be in place by the next run, which must load it first."""
        processor = self.take_idle(name)
        if processor is None:
            processor, loaded = self._loaded.create(name)
            if loaded:
                self.taken.append((name, processor))
        return processor
