"""Processors that give the queue tests and benchmarks a workload of a known shape.

They are loaded through the service's ``plugins`` setting, exactly as a studio's
own processor would be, and run through the same worker and report path as the
built-in ones.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from momentry_edge.processors.base import Processor, ProcessorError, RunContext


class Noop(Processor):
    """Does nothing: measures the queue's own cost per job."""

    name = "noop"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        return {}


class Steps(Processor):
    """``steps`` steps of ``step_seconds`` each, a checkpoint after every step.

    Every executed step is appended (and fsynced) to ``steps.log`` beside the
    output, so a test can tell which steps ran and how often.
    """

    name = "steps"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        total = int(self.settings.get("steps", 10))
        pause = float(self.settings.get("step_seconds", 0.1))
        start = (ctx.checkpoint or {}).get("frame", 0)
        ctx.output_dir.mkdir(parents=True, exist_ok=True)
        log_path = ctx.output_dir / "steps.log"
        for step in range(start, total):
            time.sleep(pause)
            with log_path.open("a") as log:
                log.write(f"{step}\n")
                log.flush()
                os.fsync(log.fileno())
            done = step + 1
            ctx.report(
                done, total, {"frame": done, "timestamp": done * pause, "partial": {"done": done}}
            )
        return {"steps": total, "resumed_from": start}


class Flaky(Processor):
    """Fails with a transient error while the file named by ``fail_while_exists`` exists."""

    name = "flaky"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        marker = Path(self.settings["fail_while_exists"])
        if marker.exists():
            raise ProcessorError(f"upstream storage unavailable (attempt {ctx.attempt})")
        return {"attempt": ctx.attempt}


class Crash(Processor):
    """Takes the whole service process down, as a segfaulting model would."""

    name = "crash"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        ctx.report(1, 2, {"frame": 1, "timestamp": 0.5, "partial": {"seen": 1}})
        os.kill(os.getpid(), signal.SIGKILL)
        return {}
