"""The same answers: the documents of another checkout (the base, e.g. main at 595b26d in
its own worktree with its own .venv) beside this checkout's, with the frame processors'
savings on and off, on the two benchmark videos and the quality bench's public media.

    .venv/bin/python benchmarks/equality_bench.py --base /work/wt/base595 [--work DIR]
        [--seconds 120] [--only base,off,on]

Each side is a real `momentry-edge run` of its checkout (its own interpreter), default
settings but ``temperature_fallback = false`` for asr (so speech decodes the same each
run); every file is registered with the default deep scan and each processor's document
saved under ``--work``/<side>/<file>/<name>.json. Documents already there are reused
(delete the folder to run a side again). Sides: ``base``, ``off`` (this checkout, every
saving off: every sampled frame analysed), ``on`` (this checkout's defaults).

Compared, base against on and off against on: asr segments (text, start, end) identical;
cut's cuts identical; OCR lines the same texts, each first and last seen within one
sampled frame; yolo, face and pose: the same number of items (yolo: per class) on every
frame listed, boxes matched at IoU >= 0.9. Every difference is printed below the table;
one on a frame whose answer the second side carried (its picture unchanged) is marked
with the earlier frame whose answer, in the first document, it is exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from e2e_bench import make_bench_video
from frame_media import box_iou, photo_frame, portrait_frame, pull_models, scenes_video, still_video
from PIL import Image
from studio_bench import FRAME_PROCESSORS, SAVINGS_OFF, make_studio_video

from momentry_edge.processors.whisper import Options as AsrOptions
from momentry_edge.processors.yolo import DEFAULT_MODEL as YOLO_MODEL

ROOT = Path(__file__).resolve().parent.parent
FINAL = {"completed", "partial", "failed", "cancelled"}
SPEECH_SAME = "[processors.asr]\ntemperature_fallback = false\n"
IOU = 0.9
SHOWN = 4  # differences listed per file and processor
CARRIED = "carried, the first's answer at frame"


def media(work: Path, seconds: float) -> dict[str, Path]:
    """The files compared, made unless they exist."""
    folder = work / "media"
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "e2e": folder / f"e2e-{seconds:g}s.mp4",
        "studio": folder / f"studio-{seconds:g}s.mp4",
        "astronaut": folder / "astronaut.mp4",
        "ch_en_num": folder / "ch_en_num.mp4",
        "scenes": folder / "scenes.mp4",
        "portrait": folder / "portrait.mp4",
    }
    make_bench_video(files["e2e"], seconds)
    make_studio_video(files["studio"], seconds)
    if not files["astronaut"].exists():
        still_video(files["astronaut"], photo_frame(), seconds=2.0)
    if not files["ch_en_num"].exists():
        image = np.asarray(Image.open(ROOT / "tests/data/ch_en_num.jpg").convert("RGB"))
        height, width = image.shape[:2]
        canvas = np.full((height + height % 2, width + width % 2, 3), 255, np.uint8)
        canvas[:height, :width] = image
        still_video(files["ch_en_num"], canvas, seconds=2.0, fps=2)
    if not files["scenes"].exists():
        scenes_video(files["scenes"], size=(1280, 720))
    if not files["portrait"].exists():
        still_video(files["portrait"], portrait_frame(), seconds=2.0)
    return files


@contextlib.contextmanager
def service(checkout: Path, root: Path, models: Path, extra: str) -> Iterator[httpx.Client]:
    """A `momentry-edge run` of ``checkout`` with its data in ``root``; a client for it."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "drop").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "models").symlink_to(models)
    config = root / "momentry.toml"
    auth = "auth = false\n" if "auth" in (checkout / "momentry_edge/config.py").read_text() else ""
    config.write_text(
        f'[service]\ndata_dir = "{root / "data"}"\nwatch = ["{root / "drop"}"]\nport = 0\n'
        + auth
        + SPEECH_SAME
        + extra,
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    env["PYTHONPATH"] = str(checkout)
    proc = subprocess.Popen(
        [
            str(checkout / ".venv/bin/python"),
            "-m",
            "momentry_edge.cli",
            "--config",
            str(config),
            "run",
        ],
        cwd=checkout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError, ValueError):
                info = json.loads((root / "data" / "run.json").read_text())
                if info["pid"] == proc.pid:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the service of {checkout} did not start")
            time.sleep(0.2)
        with httpx.Client(base_url=info["url"], timeout=60) as client:
            yield client
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def collect(checkout: Path, out: Path, files: dict[str, Path], models: Path, extra: str) -> None:
    """Each file's documents from ``checkout``'s service, saved under ``out``."""
    todo = {k: p for k, p in files.items() if not (out / k / "done").exists()}
    if not todo:
        return
    root = Path(tempfile.mkdtemp(prefix="equality-"))
    try:
        with service(checkout, root, models, extra) as client:
            for key, path in todo.items():
                started = time.monotonic()
                target = root / "drop" / f"{key}{path.suffix}"
                os.link(path, target)
                reply = client.post("/api/v1/files/register", json={"path": str(target)})
                reply.raise_for_status()
                task = reply.json()["task_id"]
                while (job := client.get(f"/api/v1/jobs/{task}").json())["status"] not in FINAL:
                    time.sleep(0.5)
                folder = out / key
                folder.mkdir(parents=True, exist_ok=True)
                for name, run in job["processors"].items():
                    if run.get("status") not in ("completed", "skipped"):
                        continue
                    got = client.get(f"/api/v1/files/{job['file_uuid']}/results/{name}")
                    if got.status_code == 200:
                        text = json.dumps(got.json()["result"], indent=1, sort_keys=True)
                        (folder / f"{name}.json").write_text(text, encoding="utf-8")
                (folder / "done").write_text(job["status"])
                took = time.monotonic() - started
                print(f"{out.name} {key}: {job['status']} in {took:.0f} s", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- comparing ----------------------------------------------------------------------------------


def compare(name: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Differences between two documents of processor ``name``; [] when they agree."""
    if name == "asr":
        return _asr(a, b)
    if name == "cut":
        return [] if a.get("cuts") == b.get("cuts") else [f"cuts {a.get('cuts')} / {b.get('cuts')}"]
    if name == "ocr":
        return _ocr(a, b)
    if name in ("yolo", "face", "pose"):
        return _boxes(name, a, b)
    return []


def _asr(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    def lines(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(s["start"], s["end"], s["text"]) for s in doc.get("segments", [])]

    out = []
    for x, y in zip(lines(a), lines(b), strict=False):
        if x != y:
            out.append(f"segment {x} / {y}")
    if len(lines(a)) != len(lines(b)):
        out.append(f"{len(lines(a))} segments / {len(lines(b))}")
    return out


def _ocr(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    def spans(doc: dict[str, Any]) -> dict[str, tuple[float, float]]:
        seen: dict[str, tuple[float, float]] = {}
        for frame in doc.get("frames", []):
            for line in frame["lines"]:
                t = frame["timestamp"]
                first, _ = seen.get(line["text"], (t, t))
                seen[line["text"]] = (first, t)
        return seen

    step = 1 / float(a.get("sample_fps") or 1)
    x, y = spans(a), spans(b)
    out = [f"only in the first: {t!r} {x[t]}" for t in x if t not in y]
    out += [f"only in the second: {t!r} {y[t]}" for t in y if t not in x]
    for text in x.keys() & y.keys():
        (f1, l1), (f2, l2) = x[text], y[text]
        if abs(f1 - f2) > step + 1e-6 or abs(l1 - l2) > step + 1e-6:
            out.append(f"{text!r} seen {f1}-{l1} / {f2}-{l2}")
    return out


def _boxes(name: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    key = {"yolo": "detections", "face": "faces", "pose": "people"}[name]
    x = {f["frame"]: f[key] for f in a.get("frames", [])}
    y = {f["frame"]: f[key] for f in b.get("frames", [])}
    out = []
    for frame in sorted(x.keys() | y.keys()):
        found = _frame_boxes(frame, x.get(frame, []), y.get(frame, []))
        if found and (source := carried_from(frame, x, y.get(frame, []))) is not None:
            found = [f"frame {frame}: {CARRIED} {source}"]
        out += found
    return out


def _frame_boxes(frame: int, one: list[dict[str, Any]], two: list[dict[str, Any]]) -> list[str]:
    def label(item: dict[str, Any]) -> str:
        return str(item.get("label", item.get("class", "")))

    if Counter(map(label, one)) != Counter(map(label, two)):
        return [f"frame {frame}: {len(one)} / {len(two)} items"]
    out = []
    unmatched = list(two)
    for item in one:
        box = item.get("box")
        if box is None:
            continue
        best = max(
            (m for m in unmatched if label(m) == label(item) and m.get("box") is not None),
            key=lambda m: box_iou(box, m["box"]),
            default=None,
        )
        iou = box_iou(box, best["box"]) if best is not None else 0.0
        if iou < IOU:
            out.append(f"frame {frame}: {label(item) or 'item'} box IoU {iou:.2f}")
        if best is not None:
            unmatched.remove(best)
    return out


def carried_from(frame: int, first: dict[int, Any], given: Any) -> int | None:
    """The earlier frame whose answer in the first document is exactly what the second
    gives at ``frame`` (an answer carried forward: the model's own there), else None."""
    earlier = sorted((g for g in first if g < frame), reverse=True)
    return next((g for g in earlier if first[g] == given), None)


def person_gate(doc: dict[str, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """For face and pose: (frames where they found something, of those frames where yolo
    saw no person at the same time): what running them only where yolo sees a person
    would lose."""
    yolo = doc.get("yolo")
    if yolo is None:
        return {}
    people = {
        round(f["timestamp"], 2)
        for f in yolo.get("frames", [])
        if any(str(d.get("label")) == "person" for d in f.get("detections", []))
    }
    out = {}
    for name in ("face", "pose"):
        frames = doc.get(name, {}).get("frames", [])
        lost = sum(1 for f in frames if round(f["timestamp"], 2) not in people)
        out[name] = (len(frames), lost)
    return out


def load(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def report(work: Path, files: dict[str, Path], pairs: list[tuple[str, str]]) -> None:
    names = ["asr", "cut", *FRAME_PROCESSORS]
    print(f"{'file':<11}{'pair':<10}" + "".join(f"{n:>7}" for n in names))
    details = []
    for key in files:
        for first, second in pairs:
            a, b = load(work / first / key), load(work / second / key)
            if not a or not b:
                continue  # a side not collected for this file
            cells = []
            for name in names:
                if name not in a and name not in b:
                    cells.append(f"{'-':>7}")
                    continue
                diffs = compare(name, a.get(name, {}), b.get(name, {}))
                carried = sum(CARRIED in d for d in diffs)
                other = len(diffs) - carried
                cell = "+".join(
                    [*([str(other)] if other else []), *([f"c{carried}"] if carried else [])]
                )
                cells.append(f"{cell or 'same':>7}")
                details += [f"{key} {first}/{second} {name}: {d}" for d in diffs[:SHOWN]]
                if len(diffs) > SHOWN:
                    details.append(f"{key} {first}/{second} {name}: {len(diffs) - SHOWN} more")
            print(f"{key:<11}{first + '/' + second:<10}" + "".join(cells))
    print(
        "same: equal as the module docstring says; a number: that many differences, below;"
        " cN: N frames where the second carried an answer that differs from the first's own"
        " there, and is exactly the first's own answer at an earlier frame"
    )
    for line in details:
        print("  " + line)
    print("\nshare of sampled frames analysed (skipped: the answer carried forward), savings on:")
    for key in files:
        docs = load(work / "on" / key)
        cells = []
        for name in FRAME_PROCESSORS:
            doc = docs.get(name)
            if doc:
                sampled, skipped = doc["frames_sampled"], doc.get("frames_skipped", 0)
                cells.append(f"{name} {sampled - skipped}/{sampled}")
        print(f"  {key:<11}" + ", ".join(cells))
    print("\nface and pose only where yolo sees a person (measured on the base's documents):")
    for key in files:
        gate = person_gate(load(work / "base" / key))
        cells = [f"{n}: {lost} of {found} frames lost" for n, (found, lost) in gate.items()]
        print(f"  {key:<11}" + "; ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "momentry-equality"
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--only", default="base,off,on", help="sides to collect now")
    parser.add_argument("--files", default="", help="collect only these files (default: all)")
    args = parser.parse_args()
    work = args.work
    files = media(work, args.seconds)
    models = pull_models(work / "models", AsrOptions().model, YOLO_MODEL)
    sides = {"base": (args.base.resolve(), ""), "off": (ROOT, SAVINGS_OFF), "on": (ROOT, "")}
    for side in args.only.split(","):
        if side:
            checkout, extra = sides[side]
            wanted = {k: p for k, p in files.items() if k in args.files.split(",")}
            collect(checkout, work / side, wanted if args.files else files, models, extra)
    print(
        f"git {ROOT}: {subprocess.getoutput(f'git -C {ROOT} rev-parse --short HEAD')}; base "
        f"{args.base}: {subprocess.getoutput(f'git -C {args.base} rev-parse --short HEAD')}"
    )
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    report(work, files, [("base", "on"), ("off", "on")])


if __name__ == "__main__":
    main()
