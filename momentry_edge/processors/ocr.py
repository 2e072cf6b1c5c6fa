"""Text in frames with RapidOCR (PP-OCR detection + recognition) on onnxruntime."""

# The rapidocr package ships its ONNX models, so nothing is downloaded. On a Mac,
# onnxruntime's Core ML provider runs them (``onnxruntime-coreml``); elsewhere the
# CPU provider. Frames go in at up to ``max_side`` pixels (default 1920: text
# needs resolution), text is found as RapidOCR's own default call finds it (on a
# copy whose shorter side is at least 736 px; ``det_max_side`` > 0 caps the longer
# side instead: faster, small text is lost) and read at full size; boxes come back
# in source-frame pixels.

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .backends import Backend
from .base import PermanentError
from .frames import SampledProcessor, settings_number

_NEEDS = ("rapidocr", "onnxruntime")
BACKENDS = (
    Backend("onnxruntime-coreml", _NEEDS, apple_only=True),
    Backend("onnxruntime", _NEEDS),
)
MODEL = "pp-ocrv6-small"  # what rapidocr 3.10 bundles: PP-OCRv6 det/rec small, v2 cls


class OcrProcessor(SampledProcessor):
    name = "ocr"
    version = "1"
    item_key = "lines"
    backends = BACKENDS
    default_fps = 1.0
    default_max_side = 1920
    fmt = "bgr24"  # rapidocr takes arrays as OpenCV BGR
    # A spare would hold another ~300 MiB of text detection's working memory at 720p (and
    # more at 1080p): one instance, on one thread, while the other members share the rest.
    spares = False

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.model = MODEL
        self._engine: Any = None

    def own_settings(self) -> dict[str, Any]:
        score = settings_number(self.settings, "min_confidence", 0.5, self.name)
        det_side = settings_number(self.settings, "det_max_side", 0, self.name)
        if not (0 <= score < 1 and (det_side == 0 or det_side >= 32)):
            raise PermanentError(
                "bad ocr settings: 0 <= min_confidence < 1, det_max_side 0 or >= 32"
            )
        return {"min_confidence": score, "det_max_side": int(det_side)}

    def load(self) -> None:
        self.require_backend()
        from rapidocr import RapidOCR  # imported here: the service starts without [ml]

        # Text detection as rapidocr's default does it (a shorter side of at least 736
        # px: small frames are enlarged, or their small labels are missed), unless a
        # cap on the longer side is set (PaddleOCR's classic 960: less work on 1080p
        # frames, small text lost). Lines are read from the frame at full size.
        det_max_side = self.own_settings()["det_max_side"]
        limits = {"Det.limit_type": "max", "Det.limit_side_len": det_max_side}
        self._engine = RapidOCR(
            params={
                "Global.log_level": "error",
                "EngineConfig.onnxruntime.use_coreml": self.backend == "onnxruntime-coreml",
                # One thread, as yolo (see there): no spinning pool, half the CPU.
                "EngineConfig.onnxruntime.intra_op_num_threads": 1,
                **(limits if det_max_side else {}),
                # rapidocr turns onnxruntime's memory arena off: every run of a model then
                # maps, faults in and frees its intermediate tensors afresh (tens of MB
                # for detection). Kept, they cost ~70 MB an instance and save that CPU.
                "EngineConfig.onnxruntime.enable_cpu_mem_arena": True,
            }
        )
        detector = self._engine._load_det_model()  # rapidocr (pinned) loads it on first use
        fast = DetInput(detector.get_preprocess())
        detector.get_preprocess = lambda: fast
        detector.session.session = ShrinkingSession(detector.session.session)
        super().load()

    def unload(self) -> None:
        self._engine = None
        super().unload()

    def detect(self, image: np.ndarray) -> list[dict[str, Any]]:
        out = self._engine(image, text_score=self._run["min_confidence"])
        if not out.txts:
            return []
        lines = []
        for quad, text, score in zip(out.boxes, out.txts, out.scores, strict=True):
            xs, ys = [p[0] for p in quad], [p[1] for p in quad]
            box = self.to_source([min(xs), min(ys), max(xs), max(ys)])
            lines.append({"text": text, "confidence": round(float(score), 3), "box": box})
        return lines

    def summarize(self, frames: list[dict[str, Any]]) -> dict[str, Any]:
        seen = dict.fromkeys(line["text"] for f in frames for line in f["lines"])
        return {"text": list(seen)}  # unique lines, in order of first appearance


class ShrinkingSession:
    """An onnxruntime session whose memory arena gives back, at the end of each run, what
    the run grew it by. Text detection's arena otherwise stays at its largest (~580 MiB
    an instance at 720p, in chunks each twice the last), however few frames hold text;
    within a run its chunks are still reused."""

    def __init__(self, session: Any) -> None:
        import onnxruntime as ort

        self._session = session
        self._options = ort.RunOptions()
        self._options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
        return self._session.run(output_names, input_feed, run_options or self._options)


class DetInput:
    """rapidocr's input for text detection (``preprocess``, a ``DetPreProcess``): the
    same float32 values, made ~4x faster.

    rapidocr normalises the resized frame in float64 (its mean and std are float64
    arrays), then transposes and casts it back: ~15 ms a 960 px frame. A pixel has only
    256 values a channel, so the same arithmetic on those 256 gives a table, and the
    input is the table looked up, written straight into the NCHW tensor.
    """

    def __init__(self, preprocess: Any) -> None:
        import numpy as np

        self.resize = preprocess.resize
        levels = np.broadcast_to(np.arange(256, dtype=np.uint8)[:, None], (256, 3))
        normalized = preprocess.normalize(levels[None])[0]  # (level, channel)
        self.table = np.ascontiguousarray(normalized.astype(np.float32).T)

    def __call__(self, img: np.ndarray) -> np.ndarray | None:
        import numpy as np

        resized = self.resize(img)
        if resized is None:
            return None
        tensor = np.empty((1, 3, *resized.shape[:2]), np.float32)
        for channel in range(3):
            np.take(self.table[channel], resized[:, :, channel], out=tensor[0, channel])
        return tensor
