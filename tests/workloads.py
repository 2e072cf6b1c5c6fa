"""Processors that give the queue tests and benchmarks a workload of a known shape.

They are loaded through the service's ``plugins`` setting, exactly as a studio's
own processor would be, and run through the same worker and report path as the
built-in ones.
"""

from __future__ import annotations

import builtins
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from momentry_edge import media
from momentry_edge.processors.base import Processor, ProcessorError, Readiness, RunContext
from momentry_edge.processors.frames import FramePlan, FrameProcessor


class Noop(Processor):
    """Does nothing: measures the queue's own cost per job."""

    name = "noop"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        return {}


class LongName(Noop):
    """A plugin whose name is longer than the queue's tables hold (32 characters)."""

    name = "a_processor_with_a_very_long_name"


class Steps(Processor):
    """``steps`` steps of ``step_seconds`` each, a checkpoint after every step.

    Every executed step is appended (and fsynced) to ``steps.log`` beside the
    output, so a test can tell which steps ran and how often, and with the moment it
    ended (the machine's monotonic clock, the same for every process) to ``steps.at``,
    so a test can tell whether two processes ran the job at once.
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
            with (ctx.output_dir / "steps.at").open("a") as log:
                log.write(f"{step} {time.monotonic()}\n")
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


class FlakyToo(Flaky):
    """A second processor failing as flaky does: one job, two processors, one error."""

    name = "flaky_too"


class Quiet(Processor):
    """Runs while the file named by ``hold_while_exists`` exists and never reports: a run
    that says nothing until it ends. With ``note``, it then writes ``quiet.txt`` beside
    its document (as asr its subtitles), naming its attempt."""

    name = "quiet"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        marker = Path(self.settings["hold_while_exists"])
        while marker.exists():
            time.sleep(0.02)
        if self.settings.get("note"):
            ctx.write_text("quiet.txt", f"attempt {ctx.attempt}\n")
        return {"attempt": ctx.attempt}


class Crash(Processor):
    """Takes the whole service process down, as a segfaulting model would."""

    name = "crash"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        ctx.report(1, 2, {"frame": 1, "timestamp": 0.5, "partial": {"seen": 1}})
        os.kill(os.getpid(), signal.SIGKILL)
        return {}


class Hold(FrameProcessor):
    """A member of the frame pass that holds the whole pass at frame ``at`` while the file
    named by ``hold_while_exists`` exists (the members' checkpoints before it are saved).

    Every frame it is fed goes (fsynced) to ``hold.log`` beside the output, so a test
    can tell where a resumed pass started.
    """

    name = "hold"

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        assert self.output_dir is not None
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._fps = info.fps
        self._done = int((checkpoint or {}).get("frame", 0))
        return FramePlan(resume=self._done)

    def feed(self, index: int, seconds: float, image: Any) -> None:
        marker = Path(self.settings["hold_while_exists"])
        while index == int(self.settings.get("at", 0)) and marker.exists():
            time.sleep(0.05)
        assert self.output_dir is not None
        with (self.output_dir / "hold.log").open("a") as log:
            log.write(f"{index}\n")
            log.flush()
            os.fsync(log.fileno())
        self._done = index + 1

    def checkpoint(self, done: int) -> dict[str, Any]:
        return {"frame": done, "timestamp": done / self._fps, "partial": {"frames": done}}

    def finish(self, done: int) -> dict[str, Any]:
        return {"frames": done}


class Boom(Processor):
    """Reports a step every ``step_seconds`` while the file named by ``hold_while_exists``
    exists, then raises: a processor that breaks in the middle of its run."""

    name = "boom"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        marker = Path(self.settings["hold_while_exists"])
        step = 0
        while step == 0 or marker.exists():
            time.sleep(float(self.settings.get("step_seconds", 0.1)))
            step += 1
            ctx.report(step, step + 1, {"frame": step})
        raise RuntimeError("boom: the model blew up")


class Raise(Processor):
    """Raises the built-in exception named by ``raises`` after one report, as a model that
    runs out of memory or recursion, or a library that calls sys.exit, would."""

    name = "raise"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        ctx.report(1, 2, {"frame": 1})
        kind = self.settings["raises"]
        raise (Unprintable if kind == "Unprintable" else getattr(builtins, kind))(
            "the model gave up"
        )


class Unprintable(Exception):
    """An exception whose message cannot be read: its ``__str__`` raises."""

    def __str__(self) -> str:
        raise ValueError("no message for you")


class RaiseInFeed(FrameProcessor):
    """A member of the frame pass that raises the built-in exception named by ``raises``
    when fed frame ``at``, as a frame model that gives up would."""

    name = "raise_in_feed"

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        self._done = int((checkpoint or {}).get("frame", 0))
        return FramePlan(resume=self._done)

    def feed(self, index: int, seconds: float, image: Any) -> None:
        if index == int(self.settings.get("at", 5)):
            raise getattr(builtins, self.settings["raises"])("the frame model gave up")
        self._done = index + 1

    def checkpoint(self, done: int) -> dict[str, Any]:
        return {"frame": done}

    def finish(self, done: int) -> dict[str, Any]:
        return {"frames": done}


class BadCheckpoint(Processor):
    """Reports a checkpoint no JSON can hold, as a processor with a bug would: a set, or
    with ``holds = "nan"`` a score gone NaN."""

    name = "bad_checkpoint"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        value = float("nan") if self.settings.get("holds") == "nan" else {1, 2}
        ctx.report(1, 3, {"frame": 1, "obj": value})
        return {"reported": True}


class UnwritableResult(Processor):
    """Returns a result no JSON document can hold, as a model with a bug would: NaN and
    Infinity (scores diverged; the default), with ``holds = "surrogate"`` a string with a
    lone surrogate (text decoded wrongly), with ``holds = "deep"`` lists nested 100,000 deep."""

    name = "unwritable_result"

    def run(self, ctx: RunContext) -> Any:
        holds = self.settings.get("holds", "nan")
        if holds == "surrogate":
            return {"text": "caf\udce9"}
        if holds == "deep":
            deep: list = []
            for _ in range(100_000):
                deep = [deep]
            return {"nested": deep}
        return {"x": float("nan"), "big": float("inf")}


class LoadFails(Processor):
    """Its model never loads: ``load`` raises, every time."""

    name = "load_fails"

    def load(self) -> None:
        raise RuntimeError("the model file is corrupt")

    def run(self, ctx: RunContext) -> dict[str, Any]:
        return {}


class ModelFile(Processor):
    """Ready once the file named by ``model_path`` exists; ``load`` reads it, and ``run``
    needs what ``load`` read, as a studio's own model would (``load`` before the first run)."""

    name = "model_file"
    _model: str | None = None

    def readiness(self) -> Readiness:
        path = Path(self.settings["model_path"])
        return Readiness(path.is_file(), f"{path} is not there yet")

    def load(self) -> None:
        self._model = Path(self.settings["model_path"]).read_text()

    def run(self, ctx: RunContext) -> dict[str, Any]:
        assert self._model is not None, "run before load"
        return {"model": self._model}


class Sleep(Processor):
    """Sleeps ``seconds`` without a report, as a model that takes one long call would."""

    name = "sleep"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        time.sleep(float(self.settings.get("seconds", 3)))
        return {"slept": True}


class Hang(Processor):
    """Never returns and never reports, as a model stuck in a call would."""

    name = "hang"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        threading.Event().wait()
        return {}


class HangOnLoad(Processor):
    """Its model's load never returns, as one read from a stalled volume would."""

    name = "hangload"

    def load(self) -> None:
        threading.Event().wait()

    def run(self, ctx: RunContext) -> dict[str, Any]:
        return {}
