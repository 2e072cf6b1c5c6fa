"""Frame processors and the shared decode pass."""

# Processors that look at pictures (cut, yolo, ocr, face, pose) are
# ``FrameProcessor``s: ``plan`` restores a checkpoint and says which frames the
# processor wants (from where, every how many, at what size), ``feed`` hands it
# one frame, ``checkpoint`` and ``finish`` give its state and its result.
#
# ``run_shared`` decodes a video once and feeds every member; a frame is
# converted once per (size, pixel format) that some member wants at that index.
# Each member keeps its own progress, checkpoint and outcome, so one failing does
# not stop the others. A processor run on its own goes through the same pass
# with one member, so it gives the same result alone or shared. Given more than
# one thread, the pass decodes on one and feeds the members on the others: the
# models (onnxruntime, MediaPipe, OpenCV) let go of the GIL for most of their work.
# A processor that looks at each frame on its own (``independent_frames``) is
# not bound to one thread: its frames are shared out among the threads, each
# looking with an instance of its own (a spare), and the findings are taken back
# in frame order.
#
# Footage repeats (an interview holds one shot for minutes, a caption stays for
# seconds): a ``SampledProcessor`` compares each sampled frame with the last one it
# analysed (``Glance``: the means of squares 1/40 of the picture across, where sensor
# noise averages out) and carries that frame's answer forward when no square changed,
# analysing anyway once ``recheck_seconds`` of video have passed.
# ``skip_unchanged = false`` analyses every sampled frame.

from __future__ import annotations

import base64
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np

from momentry_edge import media

from .backends import Backend, choose, this_platform
from .base import PermanentError, Processor, ProcessorError, Readiness, RunContext

log = logging.getLogger(__name__)


Outcome = dict[str, Any] | BaseException


# What ``take`` is given for a frame that was not analysed: the last analysed frame's
# answer stands for it.
CARRIED: Any = object()


class Glance:
    """A picture as the means of squares of each channel, GRID across its longer side (at
    least CELL px each): two frames whose squares all lie within CHANGED levels (of 255)
    of each other are the same picture.

    Sensor noise and compression move a pixel by a few levels; a square's mean of
    hundreds of pixels by a tenth of that. A caption, a face turning, a hand raised moves
    some square by tens of levels: a 6 px dot of 100 levels moves a 32 px square by 3.5.
    The squares follow the picture's size, not a fixed number of pixels: x264 codes 16 px
    blocks, and at a keyframe a block's mean can move by more than CHANGED, so a frame
    fed at 1280 px with 16 px squares was analysed again at keyframes where the same
    frame fed at 640 px was not (face and ocr looked at 167 and 79 of the studio bench's
    240 and 120 sampled frames, yolo at 90).
    """

    CELL = 16
    GRID = 40
    CHANGED = 3.0

    def __init__(self, image: np.ndarray) -> None:
        import cv2  # here: a service without frame jobs need not hold OpenCV

        height, width = image.shape[:2]
        cell = max(self.CELL, max(width, height) // self.GRID)
        size = (max(1, width // cell), max(1, height // cell))
        # INTER_AREA averages each square (the edge strips folded in): 2.4 ms a 1280x720
        # frame on a busy machine, a fourteenth of numpy's mean over the same squares.
        self.means = cv2.resize(image, size, interpolation=cv2.INTER_AREA)

    def same(self, other: Glance) -> bool:
        import numpy as np

        if self.means.shape != other.means.shape:
            return False
        apart = np.abs(self.means.astype(np.int16) - other.means.astype(np.int16))
        return bool(apart.max() <= self.CHANGED)

    def dump(self) -> dict[str, Any]:
        """JSON-able (for a checkpoint: 10.8 kB of means at 1280x720, base64)."""
        import numpy as np

        data = base64.b64encode(np.ascontiguousarray(self.means, np.uint8).tobytes())
        return {"shape": list(self.means.shape), "means": data.decode("ascii")}

    @classmethod
    def load(cls, dumped: Mapping[str, Any]) -> Glance:
        import numpy as np

        glance = cls.__new__(cls)
        means = np.frombuffer(base64.b64decode(dumped["means"]), np.uint8)
        glance.means = means.reshape([int(n) for n in dumped["shape"]])
        return glance


@dataclass(frozen=True)
class FramePlan:
    """Which frames a processor wants in this run."""

    resume: int  # frames [0, resume) were done by an earlier attempt
    step: int = 1  # frames whose index is a multiple of step
    # Or, when > 0, this many frames a second of the video's own time: the first frame
    # at or after each multiple of 1/rate s (right on variable-frame-rate video too).
    rate: float = 0.0
    size: tuple[int, int] | None = None  # (width, height); None: the size as shown
    fmt: str = "rgb24"
    start: int | None = None  # feed from here if before ``resume`` (cut primes on one frame)

    @property
    def first(self) -> int:
        return self.resume if self.start is None else min(self.start, self.resume)


class FrameProcessor(Processor):
    """A processor fed decoded frames; several share one decode (see ``run_shared``)."""

    frame_pass: ClassVar[bool] = True

    # Where this run may write files beside its result (``run_shared`` sets it before ``plan``).
    output_dir: Path | None = None
    # True where what a frame gives depends on that frame alone: ``feed`` is then
    # ``take(analyse(...))``, and the parallel pass may ``analyse`` frames on other
    # instances of the processor (same settings, planned alike) on other threads,
    # handing each finding to this one's ``take`` in frame order.
    independent_frames: ClassVar[bool] = False
    # Whether the parallel pass may give it spares (each another model and its working
    # memory in the process): False keeps it to one instance, its frames on one thread.
    spares: ClassVar[bool] = True

    def not_applicable(self, media_path: Path) -> str | None:
        # A file that cannot be read is left to the run, which says why.
        if media.has_video(media_path) is False:
            return "not applicable: the file has no video track"
        return None

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        """Start a run: reset state, restore ``checkpoint`` if usable, say what to feed."""
        raise NotImplementedError

    def feed(self, index: int, seconds: float, image: np.ndarray) -> None:
        raise NotImplementedError

    def analyse(self, index: int, seconds: float, image: np.ndarray) -> Any:
        """What one frame gives (``independent_frames`` only): no state of the run changes."""
        raise NotImplementedError

    def take(self, index: int, seconds: float, found: Any) -> None:
        """Record what ``analyse`` gave for a frame, or CARRIED (``independent_frames``
        only; in order)."""
        raise NotImplementedError

    def unchanged(self, index: int, seconds: float, image: np.ndarray) -> bool:
        """Whether this frame need not be analysed (``independent_frames`` only): asked
        of the member itself, in frame order, before its frame goes to ``analyse``; True:
        ``take`` gets CARRIED for it instead."""
        return False

    def checkpoint(self, done: int) -> dict[str, Any]:
        """State after frames [0, done): JSON-able, with ``frame``, ``timestamp``, ``partial``."""
        raise NotImplementedError

    def finish(self, done: int) -> dict[str, Any]:
        """The result once frames [0, done) were decoded (``done`` is the video's length)."""
        raise NotImplementedError

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from .frame_pass import run_shared  # the engine builds on this contract: asked here

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


def video_geometry(info: media.MediaInfo) -> tuple[int, int, float]:
    """A video's (width, height, fps): a frame processor only runs on a file with a video
    track (``not_applicable`` says so of the others)."""
    assert info.width is not None and info.height is not None and info.fps is not None
    return info.width, info.height, info.fps


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

    independent_frames = True
    item_key: ClassVar[str]
    backends: ClassVar[Sequence[Backend]]
    default_fps: ClassVar[float] = 1.0
    default_max_side: ClassVar[int] = 640
    fmt: ClassVar[str] = "rgb24"
    # Seconds of video after which an unchanged picture is analysed again: a change too
    # small for the glance (or an answer the model would give differently) shows by then.
    default_recheck_seconds: ClassVar[float] = 10.0

    _loaded = False
    _frames: list[dict[str, Any]]

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

    def unload(self) -> None:
        self._loaded = False
        self._frames = []  # the last run's findings

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        raise NotImplementedError

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        return {}

    def own_settings(self) -> dict[str, Any]:
        """Validated processor-specific settings (part of the checkpoint key)."""
        return {}

    def settings_problem(self) -> str | None:
        try:
            self.run_settings()
        except PermanentError as exc:
            return str(exc)
        return None

    def run_settings(self) -> dict[str, Any]:
        try:
            fps = float(self.settings.get("sample_fps", self.default_fps))
            max_side = int(self.settings.get("max_side", self.default_max_side) or 0)
        except (TypeError, ValueError) as e:
            raise PermanentError(f"bad {self.name} settings: {e}") from None
        if not fps > 0 or max_side < 0:
            raise PermanentError(f"bad {self.name} settings: sample_fps > 0, max_side >= 0")
        skip = self.settings.get("skip_unchanged", True)
        recheck = settings_number(
            self.settings, "recheck_seconds", self.default_recheck_seconds, self.name
        )
        if not isinstance(skip, bool) or recheck < 0:
            raise PermanentError(
                f"bad {self.name} settings: skip_unchanged true or false, recheck_seconds >= 0"
            )
        return {
            "sample_fps": fps,
            "max_side": max_side,
            "skip_unchanged": skip,
            "recheck_seconds": recheck,
            "backend": self.backend,
            "model": self.model,
            **self.own_settings(),
        }

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        self._run = self.run_settings()
        if not self._loaded:
            self.load()
        source_width, source_height, self._fps = video_geometry(info)
        size = fit_size(source_width, source_height, self._run["max_side"])
        width, height = size or (source_width, source_height)
        self._scale = (source_width / width, source_height / height)
        self._bounds = (source_width, source_height)
        self._frames = []
        self._sampled = self._skipped = 0
        # The last analysed frame: its glance and time (what the next frames are compared
        # with), and its answer (what an unchanged frame is given).
        self._seen: tuple[Glance, float] | None = None
        self._answer: list[dict[str, Any]] = []
        # The same as of the frames taken (the decode may be ahead: a checkpoint holds
        # this), and the glances of frames analysed but not taken yet.
        self._taken: tuple[Glance, float] | None = None
        self._glances: dict[int, Glance] = {}
        resume = 0
        if checkpoint and checkpoint.get("settings") == self._run and "partial" in checkpoint:
            self._frames = list(checkpoint["partial"]["frames"])
            self._sampled = int(checkpoint["sampled"])
            self._skipped = int(checkpoint["partial"].get("frames_skipped", 0))
            resume = int(checkpoint["frame"])
            # A resumed run goes on comparing with the frame the first one analysed last,
            # so that it skips what the first would have skipped: the same document.
            if last := checkpoint.get("last_analysed"):
                self._seen = self._taken = (Glance.load(last["glance"]), last["seconds"])
                self._answer = last["answer"]
        return FramePlan(resume=resume, rate=self._run["sample_fps"], size=size, fmt=self.fmt)

    def feed(self, index: int, seconds: float, image: np.ndarray) -> None:
        if self.unchanged(index, seconds, image):
            self.take(index, seconds, CARRIED)
        else:
            self.take(index, seconds, self.analyse(index, seconds, image))

    def analyse(self, index: int, seconds: float, image: np.ndarray) -> list[dict[str, Any]]:
        return self.detect(image)

    def unchanged(self, index: int, seconds: float, image: np.ndarray) -> bool:
        if not self._run["skip_unchanged"]:
            return False
        glance = Glance(image)
        seen = self._seen
        recent = seen is not None and seconds - seen[1] < self._run["recheck_seconds"]
        if recent and glance.same(seen[0]):  # type: ignore[index]  # recent: seen is set
            return True
        self._seen = (glance, seconds)  # this frame is analysed: the next compare with it
        self._glances[index] = glance
        return False

    def take(self, index: int, seconds: float, items: list[dict[str, Any]]) -> None:
        self._sampled += 1
        if items is CARRIED:
            self._skipped += 1
            items = self._answer
        else:
            self._answer = items
            if (glance := self._glances.pop(index, None)) is not None:
                self._taken = (glance, seconds)
        if items:
            self._frames.append(
                {"frame": index, "timestamp": round(seconds, 3), self.item_key: items}
            )

    def checkpoint(self, done: int) -> dict[str, Any]:
        saved = {
            "frame": done,
            "timestamp": round(done / self._fps, 3),
            "sampled": self._sampled,
            "settings": self._run,
            "partial": self._result(),
        }
        if self._taken is not None:
            glance, seconds = self._taken
            saved["last_analysed"] = {
                "seconds": seconds,
                "glance": glance.dump(),
                "answer": self._answer,
            }
        return saved

    def finish(self, done: int) -> dict[str, Any]:
        return self._result()

    def _result(self) -> dict[str, Any]:
        return {
            "frames": list(self._frames),
            **self.summarize(self._frames),
            "sample_fps": self._run["sample_fps"],
            "frames_sampled": self._sampled,
            "frames_skipped": self._skipped,  # of those, the answer carried forward
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
