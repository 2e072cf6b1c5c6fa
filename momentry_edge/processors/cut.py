"""Scene cuts with PySceneDetect's ContentDetector over frames decoded by PyAV."""

# A frame processor: it shares the job's decode pass (see frames.py) and takes
# every frame, downscaled (cuts do not need full resolution). Every ~2 s of video
# the pass saves a checkpoint holding the cuts so far and the detector's filter
# state, so a resumed run continues exactly where the stopped one was and returns
# the same result an uninterrupted run would.

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from momentry_edge import media
from momentry_edge.outputs import THUMBNAILS
from momentry_edge.processors.base import PermanentError
from momentry_edge.processors.frames import FramePlan, FrameProcessor, video_geometry
from momentry_edge.processors.keyframes import Keyframes, work_folder

if TYPE_CHECKING:
    from scenedetect.detectors import ContentDetector

# scenedetect 0.6.7 keeps its min_scene_len bookkeeping (the last frame above the
# threshold, a pending merge of rapid cuts) in the detector's FlashFilter. A
# resumed run restores it; a fresh filter would treat the resume point as the
# start of the video and could add or drop cuts. Plain ints/bools: JSON-able.
RECENT = 256  # frames back a cut found may name (the detector names the frame it is fed)
_FILTER_FIELDS = ("_last_above", "_merge_enabled", "_merge_triggered", "_merge_start")


class CutProcessor(FrameProcessor):
    name = "cut"
    version = "1"
    backend = "pyscenedetect"
    model = "content-detector"

    def plan(self, info: media.MediaInfo, checkpoint: dict[str, Any] | None) -> FramePlan:
        settings = self._settings()
        width, height, self._fps = video_geometry(info)
        self._run_settings = settings
        # Here: scenedetect brings OpenCV, which an idle service need not hold.
        from scenedetect.detectors import ContentDetector

        self._detector = ContentDetector(
            threshold=settings["threshold"], min_scene_len=settings["min_scene_len"]
        )
        resume = _usable_checkpoint(checkpoint, settings)
        if resume and resume["cuts_frames"] and not self._thumbnails_kept():
            resume = None  # its scenes' thumbnails went with the work folder: start over
        self._cuts: list[int] = list(resume["cuts_frames"]) if resume else []
        # Each cut's own time (variable frame rate: not index / fps); older checkpoints
        # have none.
        self._times: dict[int, float] = {}
        if resume and len(resume.get("cuts_times", ())) == len(self._cuts):
            self._times = dict(zip(self._cuts, resume["cuts_times"], strict=True))
        self._recent: dict[int, float] = {}  # the time of frames a cut may still name
        self._done = resume["frame"] if resume else 0  # frames [0, done) are processed
        self._pending_filter = resume["filter"] if resume else None
        self._keyframes = self._thumbnails(fresh=resume is None)
        self._finished: dict[str, Any] | None = None
        # Start from the frame before `done`: the detector scores each frame against
        # the previous one, so that frame only primes the comparison.
        return FramePlan(
            resume=self._done,
            start=max(0, self._done - 1),
            size=_scaled_size(width, height, settings["downscale"]),
            fmt="bgr24",
        )

    def feed(self, index: int, seconds: float, image: np.ndarray) -> None:
        if index < self._done:
            self._detector.process_frame(index, image)
            return
        if self._pending_filter is not None:
            _restore_filter(self._detector, self._pending_filter)
            self._pending_filter = None
        found = self._detector.process_frame(index, image)
        self._recent[index] = seconds
        if len(self._recent) > 2 * RECENT:
            self._recent = {i: t for i, t in self._recent.items() if i > index - RECENT}
        self._add(found)
        self._done = index + 1
        if self._keyframes is not None:
            for at in sorted(found):
                self._keyframes.cut(at)
            self._keyframes.offer(index, image)

    def _add(self, found: list[int]) -> None:
        self._cuts += found
        for at in found:
            if at in self._recent:
                self._times[at] = self._recent[at]

    def checkpoint(self, done: int) -> dict[str, Any]:
        state = _checkpoint(
            self._done, self._cuts, self._times, self._detector, self._run_settings, self._fps
        )
        if self._finished is not None:
            state["partial"] = self._finished  # with its thumbnails
        return state

    def finish(self, done: int) -> dict[str, Any]:
        if self._done == 0:
            raise PermanentError("truncated or corrupt: could not decode any video frame")
        found = self._detector.post_process(self._done - 1)
        self._add(found)
        result = self._finished = _result(self._cuts, self._times, self._done, self._fps)
        if self._keyframes is not None:
            for at in sorted(found):
                self._keyframes.cut(at)
            self._keyframes.close(self._done)
            paths = self._keyframes.publish([scene["start_frame"] for scene in result["scenes"]])
            for scene, path in zip(result["scenes"], paths, strict=True):
                scene["thumbnail"] = path
        return result

    def settings_problem(self) -> str | None:
        try:
            self._settings()
            self._thumbnail_settings()
        except PermanentError as exc:
            return str(exc)
        return None

    def _thumbnail_settings(self) -> tuple[bool, int]:
        enabled = self.settings.get("thumbnails", True)
        max_side = self.settings.get("thumbnail_max_side", 320)
        if not isinstance(enabled, bool):
            raise PermanentError("bad cut settings: thumbnails must be true or false")
        if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 0:
            raise PermanentError("bad cut settings: thumbnail_max_side must be a whole number >= 0")
        return enabled, max_side

    def _thumbnails_kept(self) -> bool:
        """Whether the thumbnails of a checkpoint's scenes are still there to resume with
        (a run that ended without its result removed its work folder)."""
        enabled, _ = self._thumbnail_settings()
        if not enabled or self.output_dir is None:
            return True
        return work_folder(self.output_dir).is_dir() or (self.output_dir / THUMBNAILS).is_dir()

    def _thumbnails(self, fresh: bool) -> Keyframes | None:
        """Scene thumbnails for this run, or None when they are off (or nowhere to go)."""
        enabled, max_side = self._thumbnail_settings()
        if not enabled or self.output_dir is None:
            return None
        keyframes = Keyframes(self.output_dir, max_side, fresh=fresh)
        keyframes.open_scene(max(self._cuts, default=0))
        return keyframes

    def _settings(self) -> dict[str, Any]:
        try:
            threshold = float(self.settings.get("threshold", 27.0))
            min_scene_len = int(self.settings.get("min_scene_len", 15))
            downscale = int(self.settings.get("downscale", 320) or 0)  # 0/None: full size
        except (TypeError, ValueError) as e:
            raise PermanentError(f"bad cut settings: {e}") from None
        if threshold <= 0 or min_scene_len < 0 or downscale < 0:
            raise PermanentError(
                "bad cut settings: threshold must be > 0, min_scene_len and downscale >= 0"
            )
        return {"threshold": threshold, "min_scene_len": min_scene_len, "downscale": downscale}


def _scaled_size(width: int, height: int, downscale: int) -> tuple[int, int] | None:
    """Decode size with ``downscale`` as the width, keeping the aspect; never upscale."""
    if not downscale or width <= downscale:
        return None
    return downscale, max(2, round(height * downscale / width))


def _usable_checkpoint(
    checkpoint: dict[str, Any] | None, settings: dict[str, Any]
) -> dict[str, Any] | None:
    """The checkpoint if it can be resumed from, else None (start over).

    One saved with other settings (the config changed between attempts) would mix
    two detectors' cuts, so it is ignored.
    """
    if not checkpoint or checkpoint.get("settings") != settings:
        return None
    if not all(key in checkpoint for key in ("frame", "cuts_frames", "filter")):
        return None
    return checkpoint


def _checkpoint(
    done: int,
    cuts: list[int],
    times: dict[int, float],
    detector: ContentDetector,
    settings: dict[str, Any],
    fps: float,
) -> dict[str, Any]:
    flash_filter = detector._flash_filter
    return {
        "frame": done,
        "timestamp": round(done / fps, 3),
        "cuts_frames": list(cuts),
        "cuts_times": [times.get(c, c / fps) for c in cuts],
        "filter": {field: getattr(flash_filter, field) for field in _FILTER_FIELDS},
        "settings": settings,
        "partial": _result(cuts, times, done, fps),
    }


def _restore_filter(detector: ContentDetector, state: dict[str, Any]) -> None:
    for field in _FILTER_FIELDS:
        setattr(detector._flash_filter, field, state[field])


def _result(
    cuts: list[int], times: dict[int, float], frame_count: int, fps: float
) -> dict[str, Any]:
    """The API.md ``cut`` result for frames [0, frame_count); ``end_frame`` is inclusive.
    Times are the cut frames' own (``times``, else index / fps)."""
    starts = [0, *sorted(c for c in set(cuts) if 0 < c < frame_count)]
    ends = [*starts[1:], frame_count]
    at = {0: 0.0, frame_count: frame_count / fps, **{c: times.get(c, c / fps) for c in starts}}
    scenes = [
        {
            "index": i,
            "start": round(at[start], 3),
            "end": round(at[end], 3),
            "start_frame": start,
            "end_frame": end - 1,
        }
        for i, (start, end) in enumerate(zip(starts, ends, strict=True))
    ]
    return {
        "scenes": scenes,
        "cuts": [round(at[c], 3) for c in starts[1:]],
        "fps": fps,
        "frame_count": frame_count,
    }
