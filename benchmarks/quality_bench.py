"""Quality of the processors on public media: the service's result beside the golden or
the library called directly on the same media, and a phone-shaped set.

    .venv/bin/python benchmarks/quality_bench.py [--psd DIR] [--times [SECONDS]]

Needs the ml and test-models extras. Media:
- PySceneDetect's test videos and goldens (`git clone -b resources
  https://github.com/Breakthrough/PySceneDetect`; `--psd` is that checkout's
  `tests/resources`). They are not redistributable, so not in this repo; without
  `--psd` those rows are left out.
- RapidOCR's `ch_en_num.jpg` (tests/data, Apache-2.0), its tests expect 18 lines.
- scikit-image's astronaut (public domain), in 1280x720, 9:16 portrait, stored
  sideways with a -90 degree display matrix (a phone held upright), stored mirrored
  with a flipping display matrix (a front camera), and anamorphic (720x576 and 960x576
  stored with pixels 64:45 and 16:15 wide, shown 1024x576).
"Edge" is ``Processor.run``, the pass the worker runs. With ``benchmarks/
quality_audio.py`` present, its rows follow. ``--times`` adds the seconds each frame
processor takes alone on a 2-minute 720p clip (default 120 s of video).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' media makers

from frame_media import (  # noqa: E402
    SENTENCE,
    anamorphic_video,
    box_iou,
    context,
    hdr_video,
    mirrored_video,
    photo_frame,
    portrait_frame,
    pull_models,
    rotated_video,
    scenes_video,
    still_video,
    text_frame,
    write_video,
)
from reports import Reports  # noqa: E402

from momentry_edge import media  # noqa: E402
from momentry_edge.processors import BUILTIN, load_class  # noqa: E402

Row = tuple[str, str, str, str, str]  # processor, media, edge, reference, verdict
FRAME_NAMES = ["cut", "yolo", "ocr", "face", "pose"]
GOLDEN_VIDEOS = ("fades.mp4", "testvideo.mp4", "goldeneye-vfr-drop3.mp4", "counter.mp4")


def run(name: str, clip: Path, **settings: Any) -> dict[str, Any] | str:
    """The processor's result on ``clip``, or its error as text."""
    processor = make(name, settings)
    try:
        return processor.run(context(clip, Reports()))
    except Exception as exc:  # shown in the table
        return f"error: {exc}"[:70]


def make(name: str, settings: dict[str, Any] | None = None) -> Any:
    return load_class(BUILTIN[name])(settings or {})


def cut_rows(psd: Path | None) -> Iterator[Row]:
    if psd is None:
        return
    for name in GOLDEN_VIDEOS:
        golden = json.loads((psd / "goldens" / f"{name}.ContentDetector.default.json").read_text())
        result = run("cut", psd / name)
        if isinstance(result, str):
            yield "cut", name, result, str(golden["cuts"]), "FAIL"
            continue
        ours = [s["start_frame"] for s in result["scenes"][1:]]
        verdict = "same" if ours == golden["cuts"] else "differs"
        times = ", ".join(f"{t:g}" for t in result["cuts"])
        yield "cut", name, f"{ours} ({times} s)", f"golden {golden['cuts']}", verdict


def yolo_rows(clip: Path, image: np.ndarray, models_dir: Path) -> Iterator[Row]:
    from momentry_edge import weights
    from momentry_edge.processors.yolo import OrtYolo

    result = run("yolo", clip, models_dir=str(models_dir))
    direct = OrtYolo(weights.locate("yolov8n", "onnxruntime", ".onnx", models_dir))
    found = direct.detect(image, 0.25, 0.7)  # (class_id, confidence, box) on the full frame
    theirs = sorted(direct.names[c] for c, _, _ in found)
    if isinstance(result, str):
        yield "yolo", "astronaut 1280x720", result, ", ".join(theirs), "FAIL"
        return
    detections = result["frames"][0]["detections"]
    ours = sorted(d["label"] for d in detections)
    iou = box_iou(
        max(detections, key=lambda d: d["confidence"])["box"], max(found, key=lambda f: f[1])[2]
    )
    verdict = f"{'same' if ours == theirs else 'differs'}, IoU {iou:.2f}"
    yield "yolo", "astronaut 1280x720", ", ".join(ours), f"direct: {', '.join(theirs)}", verdict


def ocr_rows(workdir: Path) -> Iterator[Row]:
    from rapidocr import RapidOCR

    image = np.asarray(Image.open(ROOT / "tests/data/ch_en_num.jpg").convert("RGB"))
    height, width = image.shape[:2]
    canvas = np.full((height + height % 2, width + width % 2, 3), 255, np.uint8)
    canvas[:height, :width] = image
    clip = still_video(workdir / "ch_en_num.mp4", canvas, seconds=1.0, fps=2)
    _, _, frame = next(media.iter_frames(clip, fmt="bgr24"))
    theirs = list(RapidOCR(params={"Global.log_level": "error"})(np.ascontiguousarray(frame)).txts)
    result = run("ocr", clip)
    if isinstance(result, str):
        yield "ocr", "ch_en_num.jpg", result, f"{len(theirs)} lines", "FAIL"
        return
    ours = [line["text"] for line in result["frames"][0]["lines"]]
    same = sum(1 for text in ours if text in theirs)
    verdict = "same" if ours == theirs else f"{same}/{len(theirs)} of its lines"
    shown = f"{len(ours)} lines: {', '.join(ours[:3])}..."
    yield "ocr", "ch_en_num.jpg", shown, f"RapidOCR default: {len(theirs)} lines", verdict


def mediapipe_counts(name: str, clip: Path) -> list[int]:
    """Faces or people MediaPipe finds on each sampled frame, called directly."""
    import mediapipe as mp

    info = media.probe(clip)
    plan = make(name).plan(info, None)
    rate = getattr(plan, "rate", 0.0)  # sampled by time here; by frame count before
    step = max(1, round(info.fps / rate)) if rate else plan.step
    if name == "face":
        model = mp.solutions.face_detection.FaceDetection(model_selection=1)
    else:
        model = mp.solutions.pose.Pose(static_image_mode=True, model_complexity=1)
    counts = []
    for _, _, image in media.iter_frames(clip, step=step, fmt="rgb24", size=plan.size):
        found = model.process(np.ascontiguousarray(image))
        if name == "face":
            counts.append(len(found.detections or []))
        else:
            counts.append(1 if found.pose_landmarks else 0)
    return counts


def mediapipe_rows(clip: Path, label: str) -> Iterator[Row]:
    for name, key in (("face", "faces"), ("pose", "people")):
        result = run(name, clip)
        theirs = mediapipe_counts(name, clip)
        if isinstance(result, str):
            yield name, label, result, f"direct: {sum(theirs)} in {len(theirs)} frames", "FAIL"
            continue
        ours = sum(len(f[key]) for f in result["frames"])
        shown = f"{ours} in {result['frames_sampled']} frames"
        verdict = "same" if ours == sum(theirs) else "differs"
        yield name, label, shown, f"direct: {sum(theirs)} in {len(theirs)} frames", verdict


def phone_rows(workdir: Path, models_dir: Path, psd: Path | None) -> Iterator[Row]:
    upright = portrait_frame()
    clips = {
        "portrait 720x1280": still_video(workdir / "portrait.mp4", upright, seconds=2.0),
        "rotated -90 (1280x720 stored)": rotated_video(workdir / "phone.mp4", upright, seconds=2.0),
        "mirrored (front camera)": mirrored_video(workdir / "selfie.mp4", upright, seconds=2.0),
        "mirrored, rotated -90": mirrored_video(
            workdir / "selfie-90.mp4", upright, degrees=-90, seconds=2.0
        ),
    }
    reference: dict[str, Any] = {}
    for label, clip in clips.items():
        info = media.probe(clip)
        yield (
            "probe",
            label,
            f"{info.width}x{info.height}",
            "upright 720x1280",
            _ok((info.width, info.height) == (720, 1280)),
        )
        for name, key in (
            ("yolo", "detections"),
            ("face", "faces"),
            ("pose", "people"),
            ("ocr", "lines"),
        ):
            settings = {"models_dir": str(models_dir)} if name == "yolo" else {}
            result = run(name, clip, **settings)
            if isinstance(result, str):
                yield name, label, result, "", "FAIL"
                continue
            items = [item for f in result["frames"] for item in f[key]]
            best = max(items, key=lambda i: i["confidence"], default=None)
            shown = f"{len(items)} in {result['frames_sampled']} frames"
            if best is not None and key != "lines":
                shown += " box " + ",".join(f"{v:.0f}" for v in best["box"])
            if label.startswith("portrait"):
                reference[name] = best
                yield name, label, shown, "", "ok"
            else:
                theirs = reference.get(name)
                same = (
                    best is not None
                    and theirs is not None
                    and box_iou(best["box"], theirs["box"]) > 0.85
                )
                yield (
                    name,
                    label,
                    shown,
                    "as portrait",
                    _ok(same or (best is None and theirs is None)),
                )
        result = run("cut", clip)
        if isinstance(result, str):
            yield "cut", label, result, "", "FAIL"
            continue
        thumb = clip.parent / "out" / result["scenes"][0]["thumbnail"]
        with Image.open(thumb) as picture:
            shown = np.asarray(picture.convert("RGB"))
        want = np.asarray(Image.fromarray(upright).resize(picture.size, Image.Resampling.BILINEAR))
        upright_thumb = (
            shown.shape[0] > shown.shape[1] and np.abs(shown.astype(int) - want).mean() < 8
        )
        yield (
            "cut",
            label,
            f"thumbnail {picture.size[0]}x{picture.size[1]}",
            "upright",
            _ok(upright_thumb),
        )
    if psd is not None:
        info = media.probe(psd / "issue-134-rotate.mp4")
        yield (
            "probe",
            "issue-134-rotate.mp4",
            f"{info.width}x{info.height}",
            "shown 544x1280",
            _ok((info.width, info.height) == (544, 1280)),
        )


def anamorphic_rows(workdir: Path) -> Iterator[Row]:
    """Pixels that are not square (PAL DV/DVD 16:9 and 4:3), and mirrored text."""
    shown = np.asarray(Image.fromarray(photo_frame()).resize((1024, 576), Image.Resampling.LANCZOS))
    (workdir / "square").mkdir()
    square = still_video(workdir / "square" / "square.mp4", shown)
    reference = run("face", square)
    theirs = _best_box(reference, "faces")
    for sar, stored in ((Fraction(64, 45), 720), (Fraction(16, 15), 960)):
        label = f"{stored}x576 SAR {sar.numerator}:{sar.denominator}"
        folder = workdir / f"sar-{stored}"
        folder.mkdir()
        clip = anamorphic_video(folder / "pal.mp4", shown, sar)
        info = media.probe(clip)
        size = f"{info.width}x{info.height}"
        yield "probe", label, size, "shown 1024x576", _ok(size == "1024x576")
        found = run("face", clip)
        ours = None if isinstance(found, str) else _best_box(found, "faces")
        iou = box_iou(ours, theirs) if ours and theirs else 0.0
        yield "face", label, f"IoU {iou:.3f}", "square-pixel 1024x576", _ok(iou > 0.85)
        result = run("cut", clip)
        if isinstance(result, str):
            yield "cut", label, result, "", "FAIL"
            continue
        with Image.open(folder / "out" / result["scenes"][0]["thumbnail"]) as picture:
            thumb = picture.size
        yield "cut", label, f"thumbnail {thumb[0]}x{thumb[1]}", "320x180", _ok(thumb == (320, 180))
    (workdir / "mirrored-text").mkdir()
    clip = mirrored_video(workdir / "mirrored-text" / "text.mp4", text_frame())
    found = run("ocr", clip)
    lines = [] if isinstance(found, str) else list(found["text"])
    yield "ocr", "mirrored text", "; ".join(lines)[:40], SENTENCE[:40], _ok(lines == [SENTENCE])


def hdr_rows(workdir: Path) -> Iterator[Row]:
    """HDR (HLG as phones record, PQ) made from an SDR picture: the frames against it."""
    shown = np.asarray(Image.fromarray(photo_frame()).resize((640, 360), Image.Resampling.LANCZOS))
    (workdir / "sdr").mkdir()
    theirs = _best_box(run("face", still_video(workdir / "sdr" / "sdr.mp4", shown)), "faces")
    for transfer in ("hlg", "pq"):
        folder = workdir / f"hdr-{transfer}"
        folder.mkdir()
        clip = hdr_video(folder / "hdr.mp4", shown, transfer)
        info = media.probe(clip)
        _, _, image = next(media.iter_frames(clip, fmt="rgb24"))
        error = np.abs(image.astype(int) - shown).mean(axis=(0, 1))
        label = f"{transfer} 640x360 10-bit"
        yield "probe", label, f"hdr {info.hdr}", transfer, _ok(info.hdr == transfer)
        errors = "/".join(f"{e:.1f}" for e in error)
        yield "frames", label, f"MAE {errors}", "the SDR picture", _ok(error.max() < 4)
        found = run("face", clip)
        ours = None if isinstance(found, str) else _best_box(found, "faces")
        iou = box_iou(ours, theirs) if ours and theirs else 0.0
        yield "face", label, f"IoU {iou:.3f}", "the SDR clip", _ok(iou > 0.85)


def _best_box(result: dict[str, Any] | str, key: str) -> list[float] | None:
    if isinstance(result, str):
        return None
    items = [item for f in result["frames"] for item in f[key]]
    return max(items, key=lambda i: i["confidence"])["box"] if items else None


def _ok(good: bool) -> str:
    return "ok" if good else "FAIL"


def audio_rows() -> list[Row]:
    """The rows of ``benchmarks/quality_audio.py`` (the audio processors), when present:
    its ``rows()`` (or ``quality_rows()``), each (processor, media, edge, reference,
    verdict)."""
    path = ROOT / "benchmarks" / "quality_audio.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("quality_audio", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make_rows = getattr(module, "rows", None) or module.quality_rows
    return [tuple(str(v) for v in row) for row in make_rows()]  # type: ignore[misc]


def table(rows: list[Row]) -> None:
    head = ("processor", "media", "edge", "reference", "verdict")
    lines = [head, *rows]
    columns = max(len(line) for line in lines)
    widths = [
        min(60, max(len(str(line[i])) for line in lines if i < len(line))) for i in range(columns)
    ]
    for line in lines:
        print("  ".join(str(v)[: widths[i]].ljust(widths[i]) for i, v in enumerate(line)).rstrip())


def long_clip(path: Path, seconds: float) -> Path:
    """``seconds`` of 1280x720 at 25 fps: the four scenes of the tests' clip in turn."""
    base = scenes_video(path.with_name("scenes.mp4"), size=(1280, 720))
    pictures = [image for _, _, image in media.iter_frames(base, step=125, fmt="rgb24")]
    frame_at = lambda i: pictures[(i // 125) % len(pictures)]  # noqa: E731
    return write_video(path, frame_at, round(seconds * 25), 25)


def times(clip: Path, models_dir: Path, names: list[str]) -> None:
    """Seconds each frame processor takes alone (decode included) on ``clip``."""
    info = media.probe(clip)
    print(f"\ntime alone on {info.duration:g} s of {info.width}x{info.height} (load-sensitive):")
    warm = still_video(clip.with_name("warm.mp4"), photo_frame(), seconds=1.0)
    for name in names:
        settings = {"models_dir": str(models_dir)} if name == "yolo" else {}
        make(name, settings).run(context(warm, Reports()))  # libraries loaded, caches warm
        started = time.perf_counter()
        result = run(name, clip, **settings)
        spent = time.perf_counter() - started
        note = result if isinstance(result, str) else ""
        print(f"  {name:<5} {spent:7.2f} s {note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--psd", type=Path, help="PySceneDetect's tests/resources (resources branch)"
    )
    parser.add_argument(
        "--times", type=float, nargs="?", const=120.0, help="seconds of video to time"
    )
    parser.add_argument("--clip", type=Path, help="time on this video (made if missing)")
    parser.add_argument("--only", nargs="*", default=FRAME_NAMES, help="processors to time")
    parser.add_argument("--no-quality", action="store_true", help="only --times")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quality-bench-") as tmp:
        workdir = Path(tmp)
        models_dir = pull_models(workdir / "models", "yolov8n")
        if not args.no_quality:
            photo = photo_frame()
            clip = still_video(workdir / "astronaut.mp4", photo, seconds=1.0)
            rows = [*cut_rows(args.psd), *yolo_rows(clip, photo, models_dir), *ocr_rows(workdir)]
            rows += [*mediapipe_rows(clip, "astronaut 1280x720")]
            rows += [*phone_rows(workdir, models_dir, args.psd)]
            rows += [*anamorphic_rows(workdir)]
            rows += [*hdr_rows(workdir)]
            rows += audio_rows()
            table(rows)
        if args.times:
            clip = args.clip or workdir / "long.mp4"
            if not clip.exists():
                long_clip(clip, args.times)
            times(clip, models_dir, args.only)


if __name__ == "__main__":
    main()
