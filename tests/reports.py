"""The worker's side of ``RunContext.report``, for processor tests that run without a service."""

from __future__ import annotations

import json

from momentry_edge.processors.base import Stop, StopReason


class Reports:
    """Records every report and raises Stop when told: at frame ``stop_at``, or after
    ``stop_after_checkpoints`` checkpoints. Checkpoints go through JSON, as they do on
    their way to the database; ``save_when_stopping=False`` drops the one sent with the
    stopping report, as a kill would."""

    def __init__(
        self,
        stop_at: int | None = None,
        *,
        stop_after_checkpoints: int | None = None,
        save_when_stopping: bool = True,
    ) -> None:
        self.stop_at = stop_at
        self.stop_after_checkpoints = stop_after_checkpoints
        self.save_when_stopping = save_when_stopping
        self.calls: list[tuple[int, int]] = []
        self.checkpoints: list[dict] = []

    def __call__(self, current: int, total: int, checkpoint: dict | None) -> None:
        self.calls.append((current, total))
        stopping = self.stop_at is not None and current >= self.stop_at
        if checkpoint is not None and (self.save_when_stopping or not stopping):
            self.checkpoints.append(json.loads(json.dumps(checkpoint)))
        if self.stop_after_checkpoints is not None:
            stopping = stopping or len(self.checkpoints) >= self.stop_after_checkpoints
        if stopping:
            raise Stop(StopReason.CANCELLED)
