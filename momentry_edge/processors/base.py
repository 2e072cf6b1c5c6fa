"""What every processor implements, and the context it runs in."""

# A processor knows nothing of the queue: it is given a media file and a
# ``RunContext`` and returns its ``result`` dict. It reports progress through the
# context, which also saves its checkpoint, renews the job's lease and raises
# ``Stop`` when the job was cancelled, the service is shutting down or the job
# ran out of time. The worker writes the output file.

from __future__ import annotations

import enum
import errno
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..outputs import Staged, stage, write_atomic

PROCESSOR_NAMES = ("asr", "asrx", "cut", "yolo", "ocr", "face", "pose")


class StopReason(enum.StrEnum):
    """Why a run ends early: every reason ``Stop`` can carry."""

    CANCELLED = "cancelled"  # a user cancelled the job
    SHUTDOWN = "shutdown"  # the service is stopping; the job goes back in line
    TIMEOUT = "timeout"  # the run outlived its task_timeout
    LEASE = "lease"  # the job's lease was lost: another worker has it
    DISK_FULL = "disk_full"  # a write met a full disk; the job goes back in line


class Stop(Exception):  # a signal to end early, not an error
    """Raised by ``RunContext.report`` to end a run early; ``reason`` says why."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


class ProcessorError(Exception):
    """A processor failure. ``transient`` failures are retried with backoff."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class PermanentError(ProcessorError):
    """Retrying cannot help (unreadable media, missing model, bad settings)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str | None = None


@dataclass
class RunContext:
    media_path: Path
    output_dir: Path
    checkpoint: dict[str, Any] | None  # the last one saved by an earlier attempt, if any
    attempt: int  # 1 for the first run of this processor in this job
    _report: Callable[[int, int, dict[str, Any] | None], None] = field(repr=False)
    # Given by the worker: extra files wait there to be placed with the run's document,
    # under its lease; without it (a processor run on its own) they are written at once.
    _extras: list[Staged] | None = field(default=None, repr=False)

    def report(self, current: int, total: int, checkpoint: dict[str, Any] | None = None) -> None:
        """Record progress (and a checkpoint to resume from); raises ``Stop`` when told to stop.

        A checkpoint is a JSON-able dict, with no NaN or Infinity (in a job, one that is
        not raises PermanentError, which fails the run). ``frame`` and ``timestamp``
        keys, when present, are shown to users as ``last_checkpoint``; a ``partial`` key
        holds the result so far, written out if the run is cancelled.
        """
        self._report(current, total, checkpoint)

    def write_text(self, name: str, text: str) -> Path:
        """Write an extra output file (e.g. ``asr.srt``) atomically beside the JSON; in a
        job it is placed with the run's document, and not at all if the run does not
        complete there."""
        path = self.output_dir / name
        if self._extras is None:
            return write_atomic(path, text)
        if path.is_dir():  # fails the run now, not the placing with its record
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        self._extras.append(stage(path, text))
        return path


class Processor:
    """Base class: set ``name`` and ``version``; implement ``run``."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    # Fed decoded frames, in one decode pass with the job's other frame processors
    # (frames.FrameProcessor sets it; sharing.py asks it without loading numpy and PyAV).
    frame_pass: ClassVar[bool] = False
    backend: str = "builtin"
    model: str | None = None

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = dict(settings or {})

    def readiness(self) -> Readiness:
        return Readiness(True)

    def settings_problem(self) -> str | None:
        """What is wrong with this processor's settings, or None: checked at start, so a
        value no run can use stops the service rather than failing every job."""
        return None

    def load(self) -> None:
        """Load models; called once per worker before the first run."""

    def unload(self) -> None:
        """Let go of what ``load`` loaded: the instance is not run again (the worker's pool
        lets idle instances go, and a later run loads a new one)."""

    def not_applicable(self, media_path: Path) -> str | None:
        """Why this processor has nothing to do on the file (e.g. frames of an audio
        file), or None. The run is then skipped with that reason, not failed."""
        return None

    def run(self, ctx: RunContext) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        state = self.readiness()
        return {
            "backend": self.backend,
            "model": self.model,
            "version": self.version,
            "ready": state.ready,
            "reason": state.reason,
        }
