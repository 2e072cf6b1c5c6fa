"""Body pose with MediaPipe Pose (BlazePose full), whose models ship in the package."""

# Only model_complexity=1 is usable offline: mediapipe 0.10.21 bundles
# pose_landmark_full and downloads the lite/heavy variants at run time, which a
# job must never do. Each sampled frame is looked at on its own
# (static_image_mode), so results do not depend on which frames came before:
# a resumed or shared run gives the same keypoints. BlazePose finds at most one
# person per frame (the most prominent).

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .. import native_stderr
from .backends import Backend
from .base import PermanentError
from .face import import_mediapipe
from .frames import SampledProcessor, settings_number

BACKENDS = (Backend("mediapipe", ("mediapipe",)),)
MODEL = "mediapipe-pose-full"

# BlazePose's 33 landmarks, in the order of each person's "keypoints".
KEYPOINTS = [
    "nose",
    "left_eye_inner",
    "left_eye",
    "left_eye_outer",
    "right_eye_inner",
    "right_eye",
    "right_eye_outer",
    "left_ear",
    "right_ear",
    "mouth_left",
    "mouth_right",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_pinky",
    "right_pinky",
    "left_index",
    "right_index",
    "left_thumb",
    "right_thumb",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
    "left_heel",
    "right_heel",
    "left_foot_index",
    "right_foot_index",
]


class PoseProcessor(SampledProcessor):
    name = "pose"
    version = "1"
    item_key = "people"
    backends = BACKENDS
    default_fps = 2.0
    # Unchanged frames carry the last analysed frame's answer, as for the others, though
    # BlazePose's own answers on a still shot are not steady: its box spans the landmarks
    # seen at visibility >= 0.5, which flips from frame to frame (benchmarks/README.md).
    # A spare holds another graph and its working memory (~100 MiB): one instance.
    spares = False

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.model = MODEL
        self._pose: Any = None

    def own_settings(self) -> dict[str, Any]:
        score = settings_number(self.settings, "min_confidence", 0.5, self.name)
        if not 0 < score < 1:
            raise PermanentError("bad pose settings: 0 < min_confidence < 1")
        return {"min_confidence": score}

    def load(self) -> None:
        import numpy as np

        self.require_backend()
        mp = import_mediapipe()
        # MediaPipe's own lines (its graphs starting, their first runs) go to our log, not
        # stderr: until the first person is found, some are still to come.
        with native_stderr.held():
            self._pose = mp.solutions.pose.Pose(
                static_image_mode=True,
                model_complexity=1,  # the only bundled landmark model (see above)
                enable_segmentation=False,
                min_detection_confidence=self.own_settings()["min_confidence"],
            )
            self._pose.process(np.zeros((64, 64, 3), np.uint8))
        self._first_found = False
        super().load()

    def unload(self) -> None:
        if self._pose is not None:
            self._pose.close()  # its graph and threads, now rather than at collection
        self._pose = None
        super().unload()

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        height, width = image.shape[:2]
        if self._first_found:
            landmarks = self._pose.process(image).pose_landmarks
        else:
            with native_stderr.held():
                landmarks = self._pose.process(image).pose_landmarks
            self._first_found = landmarks is not None
        if landmarks is None:
            return []
        points = [(lm.x * width, lm.y * height, float(lm.visibility)) for lm in landmarks.landmark]
        # The box spans the landmarks the model sees (visibility >= 0.5), else all of them.
        seen = [p for p in points if p[2] >= 0.5] or points
        xs, ys = [p[0] for p in seen], [p[1] for p in seen]
        box = self.to_source([min(xs), min(ys), max(xs), max(ys)])
        keypoints = [[*self.point_to_source(x, y), round(v, 3)] for x, y, v in points]
        confidence = round(sum(k[2] for k in keypoints) / len(keypoints), 3)
        return [{"box": box, "confidence": confidence, "keypoints": keypoints}]

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        return {"keypoint_names": list(KEYPOINTS)}
