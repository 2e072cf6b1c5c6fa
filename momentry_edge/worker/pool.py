"""Processor instances kept between runs, each lent to one thread at a time."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .. import weights
from ..processors import Registry
from ..processors.base import Processor
from .settle import message


class ProcessorPool:
    """Processor instances, each lent to one thread at a time and kept for the next run:
    a part of a job on a new thread reuses models an earlier run loaded."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._lock = threading.Lock()
        self._idle: dict[str, list[Processor]] = {}
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
        return processor, True

    def explain(self, described: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``described`` (``GET /api/v1/processors``), a processor whose model did not load
        in the last job that needed it not ready, with why (until its model is replaced)."""
        for name, (error, mark) in list(self.failed_loads.items()):
            entry = described.get(name)
            if entry is None or not entry["ready"]:
                continue
            if weights.load_mark(self._registry.create(name)) != mark:
                continue  # put in place anew since: the next job tries it
            entry.update(ready=False, reason=f"its model did not load: {error}")
        return described

    def give(self, name: str, processor: Processor) -> None:
        with self._lock:
            self._idle.setdefault(name, []).append(processor)

    @contextlib.contextmanager
    def lending(self) -> Iterator[Loan]:
        """A loan for one use; what it took is given back at the end, unless it was lost."""
        loan = Loan(self)
        try:
            yield loan
        finally:
            if not loan.lost:
                for name, processor in loan.taken:
                    self.give(name, processor)

    def peek(self, name: str) -> Processor:
        """An instance to look at (its class, its settings), not to run."""
        with self._lock:
            idle = self._idle.get(name)
            if idle:
                return idle[-1]
        return self._registry.create(name)


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
