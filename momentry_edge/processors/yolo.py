"""Object detection with a YOLO model (Ultralytics YOLOv8/YOLO11 detect head)."""

# Backends, fastest first:
# - ``coreml`` (Apple silicon): ultralytics running the model exported to Core ML
#   once via coremltools (the ``.mlpackage`` is kept beside the weights), falling
#   back to the PyTorch weights on the Apple GPU when the export fails.
# - ``onnxruntime`` (everywhere): the ONNX export, with letterbox, decode and NMS in
#   numpy; no torch. On a Mac it asks onnxruntime for its Core ML provider.
#
# Class labels come from the model's own metadata. Boxes are in source-frame
# pixels whichever backend ran (frames are fed downscaled; see frames.py).

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .. import weights
from .backends import APPLE_HINT, Backend, resolve_model
from .base import PermanentError, Readiness
from .frames import SampledProcessor, settings_number

log = logging.getLogger(__name__)

BACKENDS = (
    Backend("coreml", ("ultralytics", "coremltools"), apple_only=True, hint=APPLE_HINT),
    Backend("onnxruntime", ("onnxruntime",)),
)
DEFAULT_MODEL = "yolov8n"  # COCO, from the model catalog

# One detection: (class_id, confidence, [x1, y1, x2, y2] in the image given).
Detection = tuple[int, float, list[float]]


class YoloProcessor(SampledProcessor):
    name = "yolo"
    version = "1"
    item_key = "detections"
    backends = BACKENDS
    default_fps = 2.0
    # A spare per thread held ~100 MiB more and made a default scan no quicker.
    spares = False

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.model = str(self.settings.get("model", DEFAULT_MODEL))
        self._engine: OrtYolo | UltralyticsYolo | None = None

    def readiness(self) -> Readiness:
        state = super().readiness()
        if not state.ready:
            return state
        try:
            self._weights()
        except PermanentError as exc:
            return Readiness(False, str(exc))
        return Readiness(True)

    def settings_problem(self) -> str | None:
        if problem := super().settings_problem():
            return problem
        if self.settings.get("model_path") or self.choice.backend is None:
            return None  # a file of its own; or no backend, which readiness says
        try:
            catalog = weights.load_catalog()
        except weights.ModelError:
            return None  # readiness says so
        if catalog.find(self.model, self.backend, self.name) is None:  # type: ignore[arg-type]
            # A model no run here can load: the service refuses to start with it.
            return f"model: {catalog.unknown(self.name, self.model, self.backend)}"  # type: ignore[arg-type]
        return None

    def _weights(self) -> Path:
        # Core ML is exported from the PyTorch weights; onnxruntime runs the ONNX export.
        suffix = ".pt" if self.backend == "coreml" else ".onnx"
        return resolve_model(self.name, self.model, self.backend, suffix, self.settings)  # type: ignore[arg-type]

    def own_settings(self) -> dict[str, Any]:
        conf = settings_number(self.settings, "confidence", 0.25, self.name)
        iou = settings_number(self.settings, "iou", 0.7, self.name)  # ultralytics' defaults
        if not (0 < conf < 1 and 0 < iou <= 1):
            raise PermanentError("bad yolo settings: 0 < confidence < 1, 0 < iou <= 1")
        return {"confidence": conf, "iou": iou}

    def load(self) -> None:
        self.require_backend()
        if self.backend == "coreml":
            self._engine = UltralyticsYolo(self._weights())
            self.backend = self._engine.backend  # "coreml", or the fallback it used
        else:
            self._engine = OrtYolo(self._weights())
        super().load()

    def unload(self) -> None:
        self._engine = None
        super().unload()

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        assert self._engine is not None
        names = self._engine.names
        found = self._engine.detect(image, self._run["confidence"], self._run["iou"])
        return [
            {
                "label": names.get(cls, str(cls)),
                "class_id": cls,
                "confidence": round(conf, 3),
                "box": self.to_source(box),
            }
            for cls, conf, box in found
        ]

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for frame in frames:
            for d in frame["detections"]:
                counts[d["label"]] = counts.get(d["label"], 0) + 1
        return {"summary": counts}  # detections per label over the sampled frames


class OrtYolo:
    """An Ultralytics ONNX export run by onnxruntime, pre/post-processing as ultralytics does."""

    backend = "onnxruntime"

    def __init__(self, path: Path, max_det: int = 300) -> None:
        import numpy as np
        import onnxruntime as ort  # imported here: the service starts without [ml]

        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        # One thread: its default pool (one per core) spins between calls and took ~2x
        # the CPU per frame; the cores are used by running members side by side instead.
        options.intra_op_num_threads = 1
        wanted = ["CoreMLExecutionProvider", "CPUExecutionProvider"]
        available = ort.get_available_providers()
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=[p for p in wanted if p in available]
            )
        except Exception as exc:  # onnxruntime's own exception types vary by version
            raise PermanentError(f"yolo: cannot load {path.name}: {exc}") from None
        spec = self.session.get_inputs()[0]
        self.input_name = spec.name
        self.dtype = np.float16 if spec.type == "tensor(float16)" else np.float32
        meta = self.session.get_modelmeta().custom_metadata_map
        self.names = parse_names(meta.get("names"), path)
        height, width = spec.shape[2:4]
        if not (isinstance(height, int) and isinstance(width, int)):
            height, width = _imgsz(meta.get("imgsz"))
        self.shape = (int(height), int(width))
        self.max_det = max_det

    def detect(self, rgb: np.ndarray, conf: float, iou: float) -> list[Detection]:
        import numpy as np

        tensor, gain, pad = letterbox(rgb, self.shape)
        (output,) = self.session.run(None, {self.input_name: tensor.astype(self.dtype, copy=False)})
        boxes, scores, classes = decode(np.asarray(output, np.float32)[0], conf)
        keep = nms(boxes, scores, classes, iou)[: self.max_det]
        boxes = (boxes[keep] - [pad[0], pad[1], pad[0], pad[1]]) / gain
        return [
            (int(c), float(s), b.tolist())
            for b, s, c in zip(boxes, scores[keep], classes[keep], strict=True)
        ]


class UltralyticsYolo:
    """Apple silicon: ultralytics on a Core ML export of the weights (made once, kept)."""

    def __init__(self, weights: Path, imgsz: int = 640) -> None:
        # Never reach the network from a job: no online checks, no auto-installs.
        os.environ.setdefault("YOLO_OFFLINE", "1")
        os.environ.setdefault("YOLO_AUTOINSTALL", "0")
        from ultralytics import YOLO

        self.imgsz = imgsz
        self.device: str | None = None
        package = weights.with_suffix(".mlpackage")
        try:
            if not package.exists():
                exported = YOLO(str(weights)).export(format="coreml", imgsz=imgsz, nms=False)
                package = Path(exported)
            self.model = YOLO(str(package), task="detect")
            self.backend = "coreml"
        except Exception as exc:  # coremltools missing or too old, export bug
            log.warning("yolo: Core ML export failed (%s); running the weights on mps", exc)
            self.model = YOLO(str(weights))
            self.device = "mps"
            self.backend = "ultralytics-mps"
        self.names = {int(k): str(v) for k, v in self.model.names.items()}

    def detect(self, rgb: np.ndarray, conf: float, iou: float) -> list[Detection]:
        import numpy as np

        result = self.model.predict(
            np.ascontiguousarray(rgb[:, :, ::-1]),  # ultralytics takes arrays as BGR
            imgsz=self.imgsz,
            conf=conf,
            iou=iou,
            device=self.device,
            verbose=False,
        )[0]
        boxes = result.boxes
        return [
            (int(c), float(s), [float(v) for v in b])
            for b, s, c in zip(
                boxes.xyxy.tolist(), boxes.conf.tolist(), boxes.cls.tolist(), strict=True
            )
        ]


def parse_names(raw: str | None, path: Path) -> dict[int, str]:
    """Class labels from an Ultralytics export's ``names`` metadata ("{0: 'person', ...}")."""
    try:
        names = ast.literal_eval(raw) if raw else None
    except (ValueError, SyntaxError):
        names = None
    if not isinstance(names, dict) or not names:
        raise PermanentError(f"yolo: {path.name} has no class names in its metadata")
    return {int(k): str(v) for k, v in names.items()}


def _imgsz(raw: str | None) -> tuple[int, int]:
    try:
        value = ast.literal_eval(raw) if raw else 640
    except (ValueError, SyntaxError):
        value = 640
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[1])


def letterbox(
    rgb: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, float, tuple[float, float]]:
    """Resize keeping the aspect, pad with grey to ``shape`` (h, w), as ultralytics does.

    Returns the NCHW float tensor in [0, 1], the scale and the (left, top) padding.
    """
    import cv2
    import numpy as np

    height, width = rgb.shape[:2]
    gain = min(shape[0] / height, shape[1] / width)
    new_w, new_h = round(width * gain), round(height * gain)
    dw, dh = (shape[1] - new_w) / 2, (shape[0] - new_h) / 2
    if (new_w, new_h) != (width, height):
        rgb = cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    padded = cv2.copyMakeBorder(
        rgb, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114)
    )
    # One pass straight into the NCHW tensor: the same float32 values as casting, then
    # dividing, then copying to contiguous, without the two temporaries.
    tensor = np.empty((1, 3, *padded.shape[:2]), np.float32)
    np.divide(padded.transpose(2, 0, 1), np.float32(255.0), out=tensor[0], dtype=np.float32)
    return tensor, gain, (left, top)


def decode(output: np.ndarray, conf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A YOLOv8/11 head (4 + classes, anchors) -> xyxy boxes, scores, classes above ``conf``."""
    import numpy as np

    rows = output.T  # (anchors, 4 + classes)
    scores_all = rows[:, 4:]
    classes = scores_all.argmax(axis=1)
    scores = scores_all[np.arange(len(rows)), classes]
    keep = scores > conf
    cx, cy, w, h = rows[keep, :4].T
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    return boxes, scores[keep], classes[keep]


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> list[int]:
    """Greedy per-class non-maximum suppression; indices kept, best first."""
    import numpy as np

    # Shifting each class far apart lets one pass suppress within classes only.
    shifted = boxes + (classes.astype(np.float32) * 7680.0)[:, None]
    order = list(np.argsort(-scores, kind="stable"))
    areas = (shifted[:, 2] - shifted[:, 0]) * (shifted[:, 3] - shifted[:, 1])
    keep: list[int] = []
    while order:
        best, rest = order[0], np.array(order[1:], dtype=int)
        keep.append(int(best))
        if not len(rest):
            break
        x1 = np.maximum(shifted[best, 0], shifted[rest, 0])
        y1 = np.maximum(shifted[best, 1], shifted[rest, 1])
        x2 = np.minimum(shifted[best, 2], shifted[rest, 2])
        y2 = np.minimum(shifted[best, 3], shifted[rest, 3])
        inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        overlap = inter / (areas[best] + areas[rest] - inter + 1e-9)
        order = list(rest[overlap <= iou])
    return keep
