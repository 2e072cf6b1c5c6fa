"""End to end: the default deep scan of one video through a real `momentry-edge run`,
against each model called directly, one after another, on the same video.

    .venv/bin/python benchmarks/e2e_bench.py [--seconds 120] [--work DIR] [--keep-video]
        [--service-only] [--one-thread]

The video (made once with PyAV, kept with ``--keep-video``): ``--seconds`` of 1280x720
25 fps H.264 + AAC; espeak-ng sentences every 7.5 s; a new scene every 6 s, in turn
a photograph of a person panning, lines of text scrolling, coloured shapes moving
under a caption, the photograph with a subtitle. A 6 s clip made the same way is the
warm-up.

Service: a `momentry-edge run` of this checkout with a fresh data dir and the default
config (ingest.processors asr, cut, yolo, ocr, face, pose), the models in its
models folder. One warm-up job on the short clip, then the video is put in the
watched folder and registered with ``POST /api/v1/files/register`` (the default deep
scan); wall time runs from that request until ``GET /api/v1/jobs/{task_id}`` says
the job is done. Peak RSS is the process and its children, sampled every 0.2 s during
the job; VmHWM is the process's own high-water mark over its life (warm-up included).

Direct: each model on its own, one after another, with the settings the processors
use by default: faster-whisper ``WhisperModel.transcribe(path, vad_filter=True)``
(model, compute type, beam from the asr defaults); for cut, yolo, ocr, face and pose
PyAV decodes the video at the processor's sampling, size and pixel format and the
library is called on each sampled frame (PySceneDetect's ContentDetector, YOLOv8n on
onnxruntime with OpenCV letterbox and NMS, RapidOCR, MediaPipe face detection on the
whole frame and on each of the face processor's tiles, and pose). Each part has a
warm-up on the short clip first, like the service.

Model loads: the service keeps its models per worker thread and loads them on a
thread's first job, so the timed job may load them or not. Each direct part therefore
builds its model inside its time, and the table shows the loads apart; the ratio is
given both with and without them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import av
import cv2
import httpx
import numpy as np
import psutil
from common import ROOT, service_process
from frame_media import astronaut, pull_models
from media_factory import make_video, segment_colour
from PIL import Image, ImageDraw, ImageFont
from test_asr import SENTENCES, speech_track

from momentry_edge import weights
from momentry_edge.processors.face import OVERLAP, TILE, FaceProcessor
from momentry_edge.processors.frames import fit_size
from momentry_edge.processors.ocr import OcrProcessor
from momentry_edge.processors.pose import PoseProcessor
from momentry_edge.processors.tiles import tiles
from momentry_edge.processors.whisper import Options as AsrOptions
from momentry_edge.processors.yolo import DEFAULT_MODEL as YOLO_MODEL
from momentry_edge.processors.yolo import YoloProcessor

FPS = 25
SIZE = (1280, 720)
SCENE_SECONDS = 6.0
SPEECH_EVERY = 7.5  # seconds between the starts of two sentences
WARMUP_SECONDS = 6.0
VIDEO_VERSION = 1  # bump when the pictures or the speech change: cached videos are remade
CUT_WIDTH = 320  # cut's default downscale (decode width); ContentDetector's defaults otherwise
FINAL = {"completed", "partial", "failed", "cancelled"}
SAMPLE_EVERY = 0.2  # seconds between RSS samples
JOB_DEADLINE = 3600.0  # seconds: queue.task_timeout's default


# -- the video ------------------------------------------------------------------------------------


def _text(image: Image.Image, xy: tuple[int, int], text: str, size: int, fill: Any) -> None:
    ImageDraw.Draw(image).text(xy, text, font=ImageFont.load_default(size=size), fill=fill)


class Pictures:
    """Frame ``i`` of the video (RGB): one of four kinds of scene every SCENE_SECONDS."""

    def __init__(self) -> None:
        self.photo = astronaut()
        self.per_scene = round(SCENE_SECONDS * FPS)
        self.scene = -1
        self.base = np.zeros(0, np.uint8)

    def __call__(self, i: int) -> np.ndarray:
        scene, t = divmod(i, self.per_scene)
        if scene != self.scene:
            self.scene, self.base = scene, self._base(scene)
        width, height = SIZE
        kind = scene % 4
        if kind == 0:  # the photo pans: a window sliding over a wider canvas
            return np.ascontiguousarray(self.base[:, 2 * t : 2 * t + width])
        if kind == 1:  # text scrolls up
            return np.ascontiguousarray(self.base[t : t + height])
        image = self.base.copy()
        if kind == 2:  # shapes move
            for k in range(5):
                w, h = 80 + 30 * k, 60 + 20 * k
                x = (150 * k + (4 + k) * t) % (width - w)
                y = 200 + (70 * k + (2 + k) * t) % (height - 200 - h)
                image[y : y + h, x : x + w] = segment_colour(scene + k + 1)
        else:  # a bar crosses the photo
            x = (6 * t) % (width - 40)
            image[:560, x : x + 40] = 230
        return image

    def _base(self, scene: int) -> np.ndarray:
        width, height = SIZE
        sentence = SENTENCES[scene % len(SENTENCES)]
        kind = scene % 4
        if kind == 0:
            canvas = np.full((height, width + 2 * self.per_scene, 3), (40, 60, 90), np.uint8)
            x = 500 + 150 * (scene % 3)
            canvas[100:612, x : x + 512] = self.photo
            return canvas
        if kind == 1:
            image = Image.new("RGB", (width, height + self.per_scene), (250, 250, 245))
            lines = textwrap.wrap(f"{scene + 1}. {sentence}", 36)
            for n, line in enumerate(lines):
                _text(image, (80, 180 + 80 * n), line, 52, (10, 10, 10))
            return np.asarray(image)
        if kind == 2:
            image = Image.new("RGB", SIZE, segment_colour(scene))
            ImageDraw.Draw(image).rectangle((40, 30, width - 40, 150), fill=(255, 255, 255))
            _text(image, (70, 60), f"Scene {scene + 1}: {sentence[:34]}", 44, (0, 0, 0))
            return np.asarray(image)
        canvas = np.full((height, width, 3), (90, 70, 50), np.uint8)
        canvas[40:552, 100:612] = self.photo
        image = Image.fromarray(canvas)
        ImageDraw.Draw(image).rectangle((0, 580, width, height), fill=(0, 0, 0))
        _text(image, (60, 610), sentence[:48], 44, (255, 255, 255))
        return np.asarray(image)


def make_bench_video(
    path: Path,
    seconds: float,
    picture: Any = None,
    speech_every: float = SPEECH_EVERY,
    size: tuple[int, int] = SIZE,
    fps: int = FPS,
) -> Path:
    """The benchmark's video (see the module docstring), made unless it exists: its
    pictures (``Pictures()`` unless told) with a sentence spoken every ``speech_every`` s."""
    if path.exists():
        return path
    sentences = [SENTENCES[k % len(SENTENCES)] for k in range(math.ceil(seconds / speech_every))]
    with tempfile.TemporaryDirectory() as tmp:
        wav = speech_track(sentences, Path(tmp), speech_every)
        part = path.with_suffix(".part.mp4")
        make_video(
            part,
            segments=1,
            segment_seconds=seconds,
            fps=fps,
            size=size,
            speech_wav=wav,
            picture=Pictures() if picture is None else picture,
        )
    part.rename(path)
    return path


# -- through the service --------------------------------------------------------------------------


class PeakRss:
    """The largest RSS of a process and its children, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            with contextlib.suppress(psutil.Error):
                tree = [self.process, *self.process.children(recursive=True)]
                total = 0
                for p in tree:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                self.peak = max(self.peak, total)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def vm_hwm(pid: int) -> int:
    """The process's peak resident set (bytes) from /proc, 0 where there is none."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def scan(client: httpx.Client, drop: Path, video: Path) -> tuple[float, dict[str, Any]]:
    """Register ``video`` (linked into the watched folder) with the default deep scan and
    wait for its job; seconds from the request to done, and the job."""
    target = drop / video.name
    try:
        os.link(video, target)
    except OSError:
        shutil.copy2(video, target)
    started = time.perf_counter()
    reply = client.post("/api/v1/files/register", json={"path": str(target)})
    reply.raise_for_status()
    task = reply.json()["task_id"]
    deadline = time.monotonic() + JOB_DEADLINE
    while True:
        job = client.get(f"/api/v1/jobs/{task}").json()
        if job["status"] in FINAL:
            elapsed = time.perf_counter() - started
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"job {task} not done in time: {job}")
        time.sleep(0.1)
    if job["status"] != "completed":
        failed = {n: r.get("error") for n, r in job["processors"].items() if r.get("error")}
        raise SystemExit(f"job {task} ended {job['status']}: {failed}")
    return elapsed, job


def through_service(
    work: Path,
    models_dir: Path,
    warmup: Path,
    video: Path,
    results: Path | None = None,
    extra_config: str = "",
) -> dict[str, Any]:
    """The default deep scan of ``video`` on a fresh `momentry-edge run` (``extra_config``:
    TOML added to its config), after a warm-up job; each processor's result saved in
    ``results`` (``<name>.json``) when given."""
    root = work / "service"
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    (root / "data" / "models").symlink_to(models_dir)
    with (
        service_process(root, extra_config) as (url, proc),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        warm_seconds, _ = scan(client, root / "drop", warmup)
        print(f"service warm-up job: {warm_seconds:.1f} s", file=sys.stderr)
        ps = psutil.Process(proc.pid)
        cpu = sum(ps.cpu_times()[:2])
        with PeakRss(proc.pid) as rss:
            wall, job = scan(client, root / "drop", video)
        cpu = sum(ps.cpu_times()[:2]) - cpu
        counts, spans, skipped = {}, {}, {}
        for name, run in job["processors"].items():
            spans[name] = _seconds(run["completed_at"]) - _seconds(run["started_at"])
            reply = client.get(f"/api/v1/files/{job['file_uuid']}/results/{name}")
            counts[name] = count(name, reply.json()["result"])
            skipped[name] = int(reply.json()["result"].get("frames_skipped", 0))
            if results is not None:
                results.mkdir(parents=True, exist_ok=True)
                result = json.dumps(reply.json()["result"], indent=1, sort_keys=True)
                (results / f"{name}.json").write_text(result, encoding="utf-8")
        return {
            "wall": wall,
            "cpu": cpu,
            "peak_rss": rss.peak,
            "vm_hwm": vm_hwm(proc.pid),
            "counts": counts,
            "skipped": skipped,
            "spans": spans,
        }


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def count(name: str, result: dict[str, Any]) -> int:
    """What a part did: speech segments for asr, frames looked at for the others."""
    if name == "asr":
        return len(result["segments"])
    if name == "cut":
        return int(result["frame_count"])
    return int(result["frames_sampled"])


# -- direct ---------------------------------------------------------------------------------------


def decoded(
    video: Path, rate: float, size: tuple[int, int] | None, fmt: str
) -> Iterator[np.ndarray]:
    """``rate`` frames a second (0: every frame; the first at or after each 1/rate s) as
    HxWx3 arrays, resized to ``size`` (width, height)."""
    width, height = size or (None, None)
    last = -1
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            if rate:
                if (tick := math.floor(frame.time * rate + 1e-9)) <= last:
                    continue
                last = tick
            yield frame.to_ndarray(width=width, height=height, format=fmt)


def sampling(cls: type, video: Path) -> tuple[float, tuple[int, int] | None, str]:
    """A sampled frame processor's default rate, decode size and pixel format."""
    settings = cls().run_settings()
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        width, height = stream.width, stream.height
    return settings["sample_fps"], fit_size(width, height, settings["max_side"]), cls.fmt


def load_asr(models_dir: Path) -> Callable[[Path], int]:
    from faster_whisper import WhisperModel

    opts = AsrOptions()
    spec = weights.load_catalog().find(opts.model, "faster-whisper")
    assert spec is not None
    model = WhisperModel(
        str(weights.model_dir(spec, models_dir)),
        device="cpu",
        compute_type=opts.compute_type,
        cpu_threads=opts.cpu_threads,
        local_files_only=True,
    )

    def run(video: Path) -> int:
        segments, _ = model.transcribe(
            str(video), language=opts.language, beam_size=opts.beam_size, vad_filter=opts.vad
        )
        return sum(1 for _ in segments)  # decoding happens while the segments are read

    return run


def load_cut(models_dir: Path) -> Callable[[Path], int]:
    from scenedetect.detectors import ContentDetector

    def run(video: Path) -> int:
        detector = ContentDetector()
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            size = (CUT_WIDTH, round(stream.height * CUT_WIDTH / stream.width))
        frames = -1
        for frames, image in enumerate(decoded(video, 0, size, "bgr24")):
            detector.process_frame(frames, image)
        detector.post_process(frames)
        return frames + 1

    return run


def load_yolo(models_dir: Path, threads: int = 0) -> Callable[[Path], int]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads  # 0: onnxruntime's default, a thread a core
    path = weights.locate(YOLO_MODEL, "onnxruntime", ".onnx", models_dir)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    side = 640
    conf, iou = 0.25, 0.7  # ultralytics' defaults, as the processor's

    def detect(rgb: np.ndarray) -> list[int]:
        # Letterbox to side x side (grey padding), as ultralytics does.
        h, w = rgb.shape[:2]
        gain = min(side / h, side / w)
        nw, nh = round(w * gain), round(h * gain)
        top, left = (side - nh) // 2, (side - nw) // 2
        canvas = np.full((side, side, 3), 114, np.uint8)
        canvas[top : top + nh, left : left + nw] = cv2.resize(
            rgb, (nw, nh), interpolation=cv2.INTER_LINEAR
        )
        tensor = canvas.transpose(2, 0, 1)[None].astype(np.float32) / 255
        (out,) = session.run(None, {name: tensor})
        rows = out[0].T  # (anchors, 4 + classes): cx, cy, w, h, class scores
        scores = rows[:, 4:].max(1)
        keep = scores > conf
        if not keep.any():
            return []
        boxes, scores = rows[keep, :4], scores[keep]
        classes = rows[keep, 4:].argmax(1)
        xywh = np.column_stack([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, 2:]])
        return list(cv2.dnn.NMSBoxesBatched(xywh.tolist(), scores.tolist(), classes, conf, iou))

    return _per_frame(YoloProcessor, detect)


def load_ocr(models_dir: Path, threads: int = -1) -> Callable[[Path], int]:
    from rapidocr import RapidOCR

    engine = RapidOCR(
        params={
            "Global.log_level": "error",
            "Det.limit_type": "max",
            "Det.limit_side_len": 960,
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,  # -1: rapidocr's default
        }
    )
    return _per_frame(OcrProcessor, lambda bgr: engine(bgr, text_score=0.5))


def _mediapipe() -> Any:
    os.environ.setdefault("GLOG_minloglevel", "2")
    import mediapipe

    return mediapipe


def load_face(models_dir: Path) -> Callable[[Path], int]:
    """MediaPipe's detector on the whole frame and on each tile the face processor looks at
    by default (a crowd's small faces: TILE px pieces, OVERLAP shared): the same looks."""
    detector = _mediapipe().solutions.face_detection.FaceDetection(
        model_selection=1, min_detection_confidence=0.5
    )

    def looks(image: np.ndarray) -> None:
        detector.process(image)
        height, width = image.shape[:2]
        for x, y, w, h in tiles(width, height, TILE, OVERLAP):
            detector.process(np.ascontiguousarray(image[y : y + h, x : x + w]))

    return _per_frame(FaceProcessor, looks)


def load_pose(models_dir: Path) -> Callable[[Path], int]:
    pose = _mediapipe().solutions.pose.Pose(
        static_image_mode=True,
        model_complexity=1,
        enable_segmentation=False,
        min_detection_confidence=0.5,
    )
    return _per_frame(PoseProcessor, pose.process)


def _per_frame(cls: type, call: Callable[[np.ndarray], Any]) -> Callable[[Path], int]:
    def run(video: Path) -> int:
        frames = 0
        for image in decoded(video, *sampling(cls, video)):
            call(image)
            frames += 1
        return frames

    return run


PARTS: dict[str, Callable[[Path], Callable[[Path], int]]] = {
    "asr": load_asr,
    "cut": load_cut,
    "yolo": load_yolo,
    "ocr": load_ocr,
    "face": load_face,
    "pose": load_pose,
}


# yolo and ocr on one onnxruntime thread each, as the service calls them (--one-thread).
ONE_THREAD: dict[str, Callable[[Path], Callable[[Path], int]]] = {
    "yolo": functools.partial(load_yolo, threads=1),
    "ocr": functools.partial(load_ocr, threads=1),
}

Part = tuple[float, float, float, int]  # seconds to load, to run, CPU seconds of the run, n


def direct(
    models_dir: Path, warmup: Path, video: Path, one_thread: bool = False
) -> dict[str, Part]:
    """Per part: seconds to build the model, seconds to run it on ``video``, the CPU seconds
    of that run (the libraries' own thread pools included), and its count. A throwaway
    model first runs the short clip (imports, first-call set-up, page cache)."""
    out = {}
    for name, load in PARTS.items():
        if one_thread:
            load = ONE_THREAD.get(name, load)
        load(models_dir)(warmup)
        started = time.perf_counter()
        run = load(models_dir)
        loaded, cpu = time.perf_counter(), time.process_time()
        done = run(video)
        ran, cpu = time.perf_counter() - loaded, time.process_time() - cpu
        out[name] = (loaded - started, ran, cpu, done)
        print(f"direct {name}: {out[name][0] + out[name][1]:.1f} s", file=sys.stderr)
    return out


# -- the table ------------------------------------------------------------------------------------


def revision() -> str:
    git = ["git", "-C", str(ROOT)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return rev.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def describe(video: Path) -> str:
    with av.open(str(video)) as container:
        picture, sound = container.streams.video[0], container.streams.audio[0]
        return (
            f"video: {float(container.duration or 0) / av.time_base:.1f} s "
            f"{picture.width}x{picture.height} {float(picture.average_rate):g} fps "
            f"{picture.codec_context.name} + {sound.codec_context.name}, speech every "
            f"{SPEECH_EVERY:g} s, a scene every {SCENE_SECONDS:g} s"
        )


def report(about: str, service: dict[str, Any], parts: dict[str, Part], loads: str) -> None:
    print(about)
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
        f"git {revision()}; load average {loads} at start, {load_average()} at end"
    )
    wall = service["wall"]
    if not parts:  # --service-only
        counts = ", ".join(f"{name} {n}" for name, n in service["counts"].items())
        spans = ", ".join(f"{name} {s:.1f}" for name, s in service["spans"].items())
        print(f"service wall, register -> done: {wall:.1f} s; n: {counts}")
        print(f"service s (each run's start to its end): {spans}")
    else:
        _table(service, parts)
    print(
        f"service CPU during the job: {service['cpu']:.1f} s "
        f"({service['cpu'] / wall:.2f} cores on average)"
    )
    print(
        f"service peak RSS during the job: {service['peak_rss'] / 2**20:.0f} MiB "
        f"(process and children, sampled every {SAMPLE_EVERY:g} s); "
        f"VmHWM {service['vm_hwm'] / 2**20:.0f} MiB"
    )
    print(
        "n: speech segments (asr), frames decoded (cut), frames analysed (the others);"
        " service s: the run's start to its end in the service, side by side with the others"
    )


def _table(service: dict[str, Any], parts: dict[str, Part]) -> None:
    print(
        f"{'part':<6}{'load s':>8}{'run s':>8}{'total s':>9}{'run CPU s':>11}"
        f"{'direct n':>10}{'service n':>11}{'service s':>11}"
    )
    for name, (load, run, cpu, done) in parts.items():
        n = service["counts"].get(name, "-")
        span = service["spans"].get(name, math.nan)
        print(
            f"{name:<6}{load:>8.2f}{run:>8.1f}{load + run:>9.1f}{cpu:>11.1f}{done:>10}{n:>11}"
            f"{span:>11.1f}"
        )
    load_sum = sum(p[0] for p in parts.values())
    run_sum = sum(p[1] for p in parts.values())
    cpu_sum = sum(p[2] for p in parts.values())
    print(f"{'sum':<6}{load_sum:>8.2f}{run_sum:>8.1f}{load_sum + run_sum:>9.1f}{cpu_sum:>11.1f}")
    wall = service["wall"]
    print(f"service wall, register -> done: {wall:.1f} s")
    print(
        f"ratio service / direct sum: {wall / run_sum:.2f} against the runs alone, "
        f"{wall / (load_sum + run_sum):.2f} with the loads (goal <= 0.6)"
    )
    print(
        f"direct runs' CPU {cpu_sum:.1f} s ({cpu_sum / run_sum:.2f} cores on average); "
        f"service CPU / direct runs' CPU: {service['cpu'] / cpu_sum:.2f}"
    )
    # The job can end no sooner than its CPU time spread over every core.
    cores = os.cpu_count() or 1
    floor = service["cpu"] / cores
    print(
        f"the service's CPU on all {cores} cores with none idle: {floor:.1f} s, ratio"
        f" {floor / run_sum:.2f}: the least wall time this job's work can take here"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="length of the video")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "momentry-e2e-bench",
        help="folder for the videos, models and the service's data",
    )
    parser.add_argument("--keep-video", action="store_true", help="keep the videos for next time")
    parser.add_argument(
        "--service-only",
        action="store_true",
        help="skip the direct calls (to compare the service side of two checkouts)",
    )
    parser.add_argument(
        "--one-thread",
        action="store_true",
        help="the direct yolo and ocr on one thread each, as the service calls them",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="save each processor's result from the service here (to compare two checkouts)",
    )
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is needed for the speech (apt-get install espeak-ng)")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    loads = load_average()
    stem = f"e2e-v{VIDEO_VERSION}-{SIZE[0]}x{SIZE[1]}-{FPS}fps"
    video = work / f"{stem}-{args.seconds:g}s.mp4"
    warmup = work / f"{stem}-warmup-{WARMUP_SECONDS:g}s.mp4"
    models_dir = work / "models"
    try:
        for path, seconds in ((warmup, WARMUP_SECONDS), (video, args.seconds)):
            started = time.perf_counter()
            if not path.exists():
                make_bench_video(path, seconds)
                print(f"made {path.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        about = describe(video)
        pull_models(models_dir, AsrOptions().model, YOLO_MODEL)
        service = through_service(work, models_dir, warmup, video, args.results)
        parts = {} if args.service_only else direct(models_dir, warmup, video, args.one_thread)
    finally:
        shutil.rmtree(work / "service", ignore_errors=True)
        shutil.rmtree(models_dir, ignore_errors=True)
        if not args.keep_video:
            for path in (video, warmup):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                work.rmdir()  # when nothing else is in it
    report(about, service, parts, loads)


if __name__ == "__main__":
    main()
