"""Frame processors and the shared decode pass.

Processors that look at pictures (cut, yolo, ocr, face, pose) are
``FrameProcessor``s: ``plan`` restores a checkpoint and says which frames the
processor wants (from where, every how many, at what size), ``feed`` hands it
one frame, ``checkpoint`` and ``finish`` give its state and its result.

``run_shared`` decodes a video once and feeds every member; a frame is
converted once per (size, pixel format) that some member wants at that index.
Each member keeps its own progress, checkpoint and outcome, so one failing does
not stop the others. A processor run on its own goes through the same pass
with one member, so it gives the same result alone or shared.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from av.video.frame import VideoFrame
from av.video.reformatter import VideoReformatter

from momentry_edge import media

from .backends import Backend, choose, this_platform
from .base import PermanentError, Processor, ProcessorError, Readiness, RunContext, Stop

log = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 2.0  # of video between checkpoints: a resume redoes at most this much
REPORT_SECONDS = 1.0  # of wall time: progress (and a chance to stop) at least this often
# Partial results grow with the video, and so does the cost of saving them. A save
# that took longer than CHEAP_SAVE seconds delays the next one by SAVE_SPACING
# times as long, so saving never costs more than ~1/SAVE_SPACING of the run.
CHEAP_SAVE = 0.01
SAVE_SPACING = 20

Outcome = dict[str, Any] | BaseException


@dataclass(frozen=True)
class FramePlan:
    """Which frames a processor wants in this run."""

    resume: int  # frames [0, resume) were done by an earlier attempt
    step: int = 1  # frames whose index is a multiple of step
    size: tuple[int, int] | None = None  # (width, height); None: the source size
    fmt: str = "rgb24"
    start: int | None = None  # feed from here if before ``resume`` (cut primes on one frame)

    @property
    def first(self) -> int:
        return self.resume if self.start is None else min(self.start, self.resume)


class FrameProcessor(Processor):
    """A processor fed decoded frames; several share one decode (see ``run_shared``)."""

    # Where this run may write files beside its result (``run_shared`` sets it before ``plan``).
    output_dir: Path | None = None

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        """Start a run: reset state, restore ``checkpoint`` if usable, say what to feed."""
        raise NotImplementedError

    def feed(self, index: int, seconds: float, image: np.ndarray) -> None:
        raise NotImplementedError

    def checkpoint(self, done: int) -> dict[str, Any]:
        """State after frames [0, done): JSON-able, with ``frame``, ``timestamp``, ``partial``."""
        raise NotImplementedError

    def finish(self, done: int) -> dict[str, Any]:
        """The result once frames [0, done) were decoded (``done`` is the video's length)."""
        raise NotImplementedError

    def run(self, ctx: RunContext) -> dict[str, Any]:
        outcome = run_shared(ctx.media_path, [(self, ctx)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def probe(path: Path) -> media.MediaInfo:
    try:
        return media.probe(path)
    except media.MediaNotFoundError as e:
        # Uploads on network storage can briefly vanish: worth a retry.
        raise ProcessorError(e.reason, transient=True) from None
    except media.MediaError as e:
        raise PermanentError(e.reason) from None


class _Member:
    def __init__(self, slot: int, processor: FrameProcessor, ctx: RunContext) -> None:
        self.slot = slot
        self.processor = processor
        self.ctx = ctx
        self.plan: FramePlan | None = None
        self.saved = -1  # frame count of the last checkpoint saved
        self.next_save = 0.0  # monotonic time before which no checkpoint is saved


def run_shared(
    media_path: Path, members: Sequence[tuple[FrameProcessor, RunContext]], threads: int = 1
) -> list[Outcome]:
    """Decode ``media_path`` once and feed every member; each member's result or error.

    ``threads``: at most this many threads feed members (the worker's share of the
    job's thread budget for this pass).

    A ``Stop`` from any member's report (cancel, shutdown, timeout: all job-wide)
    ends the pass after every member has saved its checkpoint; each unfinished
    member's outcome is then that ``Stop``.
    """
    outcomes: list[Outcome | None] = [None] * len(members)
    active = [_Member(i, p, c) for i, (p, c) in enumerate(members)]
    try:
        info = probe(media_path)
    except ProcessorError as exc:
        return [exc] * len(members)
    for m in list(active):
        try:
            m.processor.output_dir = m.ctx.output_dir
            m.plan = m.processor.plan(info, m.ctx.checkpoint)
        except Exception as exc:
            outcomes[m.slot] = exc
            active.remove(m)
    if not active:
        return outcomes  # type: ignore[return-value]

    every = max(1, round(CHECKPOINT_SECONDS * info.fps))
    first = min(m.plan.first for m in active)  # type: ignore[union-attr]
    next_report = (first // every + 1) * every
    last_report = time.monotonic()
    scaler = VideoReformatter()
    done = 0
    try:
        for index, seconds, frame in media.iter_decoded(media_path, start_frame=first):
            _feed_all(active, outcomes, index, seconds, frame, scaler)
            done = index + 1
            now = time.monotonic()
            if done >= next_report or now - last_report >= REPORT_SECONDS:
                next_report = (done // every + 1) * every
                last_report = now
                stop = _report_all(active, outcomes, done, max(info.frame_count, done))
                if stop is not None:
                    return _stopped(outcomes, active, stop)
            if not active:
                return outcomes  # type: ignore[return-value]
    except media.MediaNotFoundError as e:
        return _fail_all(outcomes, active, ProcessorError(e.reason, transient=True))
    except media.MediaError as e:
        return _fail_all(outcomes, active, PermanentError(e.reason))

    if done == 0:
        error = PermanentError("truncated or corrupt: could not decode any video frame")
        return _fail_all(outcomes, active, error)
    for m in list(active):
        try:
            outcomes[m.slot] = m.processor.finish(done)
        except Exception as exc:
            outcomes[m.slot] = exc
            active.remove(m)
    # The last checkpoint holds the whole result (what finish added included: cut's
    # post-processing and thumbnails): a crash before the output file is written
    # resumes at the end instead of starting over. A stop asked for now does not
    # throw the finished results away; the job notices it next.
    _report_all(active, outcomes, done, done, final=True)
    return outcomes  # type: ignore[return-value]


def _feed_all(
    active: list[_Member],
    outcomes: list[Outcome | None],
    index: int,
    seconds: float,
    frame: VideoFrame,
    scaler: VideoReformatter,
) -> None:
    """Give one decoded frame to every member that wants it, converted once per
    (size, pixel format); a member whose ``feed`` raises leaves the pass."""
    images: dict[tuple[Any, str], np.ndarray] = {}
    for m in list(active):
        plan = m.plan
        assert plan is not None
        if index < plan.first or (index >= plan.resume and index % plan.step):
            continue
        key = (plan.size, plan.fmt)
        if key not in images:
            width, height = plan.size or (None, None)
            images[key] = scaler.reformat(frame, width, height, plan.fmt, threads=1).to_ndarray()
        try:
            m.processor.feed(index, seconds, images[key])
        except Exception as exc:
            outcomes[m.slot] = exc
            active.remove(m)


def _report_all(
    members: list[_Member],
    outcomes: list[Outcome | None],
    done: int,
    total: int,
    final: bool = False,
) -> Stop | None:
    """Report progress (with a checkpoint where due) for every member; the first Stop."""
    first_stop = None
    for m in list(members):
        if not final and m.plan is not None and done <= m.plan.resume:
            continue  # still before its resume point: nothing new to save
        now = time.monotonic()
        checkpoint = None
        try:
            if final or now >= m.next_save:
                checkpoint = m.processor.checkpoint(done)
            m.ctx.report(done, total, checkpoint)
        except Stop as stop:
            # Job-wide: the others still save their state, then the pass ends.
            first_stop = first_stop or stop
        except Exception as exc:
            outcomes[m.slot] = exc
            members.remove(m)
            continue
        if checkpoint is not None:
            m.saved = done
            spent = time.monotonic() - now
            m.next_save = now + SAVE_SPACING * spent if spent > CHEAP_SAVE else 0.0
    return first_stop


def _stopped(outcomes: list[Outcome | None], active: list[_Member], stop: Stop) -> list[Outcome]:
    for m in active:
        outcomes[m.slot] = stop
    return outcomes  # type: ignore[return-value]


def _fail_all(
    outcomes: list[Outcome | None], active: list[_Member], error: ProcessorError
) -> list[Outcome]:
    for m in active:
        outcomes[m.slot] = error
    return outcomes  # type: ignore[return-value]


def fit_size(width: int, height: int, max_side: int) -> tuple[int, int] | None:
    """Decode size with the longer side at most ``max_side`` (even numbers, aspect kept);
    None when the source already fits (never upscale) or ``max_side`` is 0."""
    if not max_side or max(width, height) <= max_side:
        return None
    scale = max_side / max(width, height)
    return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


class SampledProcessor(FrameProcessor):
    """A frame processor that looks at ``sample_fps`` frames a second, each on its own.

    Subclasses set ``item_key`` (what a frame lists: "detections", "faces"...),
    implement ``load`` and ``detect`` (items for one image, boxes in that image's
    pixels; ``self.to_source`` maps them to source pixels) and may add summary
    fields in ``summarize``. Frames with nothing found are not listed.
    """

    item_key: ClassVar[str]
    backends: ClassVar[Sequence[Backend]]
    default_fps: ClassVar[float] = 1.0
    default_max_side: ClassVar[int] = 640
    fmt: ClassVar[str] = "rgb24"

    _loaded = False

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(settings)
        # Chosen by the machine and the [processors.<name>] backend setting.
        backend = str(self.settings.get("backend", "auto"))
        self.choice = choose(self.backends, backend, platform=this_platform())
        self.backend = self.choice.name

    def readiness(self) -> Readiness:
        if self.choice.backend is None:
            return Readiness(False, f"no {self.name} backend: {self.choice.reason}")
        return Readiness(True)

    def require_backend(self) -> None:
        if self.choice.backend is None:
            raise PermanentError(f"no {self.name} backend: {self.choice.reason}")

    def load(self) -> None:
        self._loaded = True

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        raise NotImplementedError

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def own_settings(self) -> dict[str, Any]:
        """Validated processor-specific settings (part of the checkpoint key)."""
        return {}

    def run_settings(self) -> dict[str, Any]:
        try:
            fps = float(self.settings.get("sample_fps", self.default_fps))
            max_side = int(self.settings.get("max_side", self.default_max_side) or 0)
        except (TypeError, ValueError) as e:
            raise PermanentError(f"bad {self.name} settings: {e}") from None
        if not fps > 0 or max_side < 0:
            raise PermanentError(f"bad {self.name} settings: sample_fps > 0, max_side >= 0")
        return {
            "sample_fps": fps,
            "max_side": max_side,
            "backend": self.backend,
            "model": self.model,
            **self.own_settings(),
        }

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        self._run = self.run_settings()
        if not self._loaded:
            self.load()
        self._fps = info.fps
        self._step = max(1, round(info.fps / self._run["sample_fps"]))
        size = fit_size(info.width, info.height, self._run["max_side"])
        width, height = size or (info.width, info.height)
        self._scale = (info.width / width, info.height / height)
        self._bounds = (info.width, info.height)
        self._frames: list[dict[str, Any]] = []
        self._sampled = 0
        resume = 0
        if checkpoint and checkpoint.get("settings") == self._run and "partial" in checkpoint:
            self._frames = list(checkpoint["partial"]["frames"])
            self._sampled = int(checkpoint["sampled"])
            resume = int(checkpoint["frame"])
        return FramePlan(resume=resume, step=self._step, size=size, fmt=self.fmt)

    def feed(self, index: int, seconds: float, image: np.ndarray) -> None:
        self._sampled += 1
        items = self.detect(image)
        if items:
            self._frames.append(
                {"frame": index, "timestamp": round(seconds, 3), self.item_key: items}
            )

    def checkpoint(self, done: int) -> dict[str, Any]:
        return {
            "frame": done,
            "timestamp": round(done / self._fps, 3),
            "sampled": self._sampled,
            "settings": self._run,
            "partial": self._result(),
        }

    def finish(self, done: int) -> dict[str, Any]:
        return self._result()

    def _result(self) -> dict[str, Any]:
        return {
            "frames": list(self._frames),
            **self.summarize(self._frames),
            "sample_fps": round(self._fps / self._step, 3),
            "frames_sampled": self._sampled,
        }

    def to_source(self, box: Sequence[float]) -> list[float]:
        """An [x1, y1, x2, y2] box in the fed image's pixels -> source-frame pixels, clipped."""
        sx, sy = self._scale
        width, height = self._bounds
        x1, y1, x2, y2 = (float(v) for v in box)
        return [
            round(min(max(x1 * sx, 0.0), width), 1),
            round(min(max(y1 * sy, 0.0), height), 1),
            round(min(max(x2 * sx, 0.0), width), 1),
            round(min(max(y2 * sy, 0.0), height), 1),
        ]

    def point_to_source(self, x: float, y: float) -> tuple[float, float]:
        sx, sy = self._scale
        return round(float(x) * sx, 1), round(float(y) * sy, 1)


def settings_number(settings: Mapping[str, Any], key: str, default: float, name: str) -> float:
    try:
        value = float(settings.get(key, default))
    except (TypeError, ValueError):
        raise PermanentError(f"bad {name} settings: {key} must be a number") from None
    if not math.isfinite(value):
        raise PermanentError(f"bad {name} settings: {key} must be finite")
    return value
