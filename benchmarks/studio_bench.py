"""Studio footage: the default deep scan of footage that repeats, through a real
`momentry-edge run` with the frame processors' savings off and on, against each model
called directly, one after another, on the same video (as e2e_bench.py does).

    .venv/bin/python benchmarks/studio_bench.py [--seconds 120] [--work DIR] [--keep-video]
        [--results DIR]

The video (made once with PyAV, kept with ``--keep-video``): ``--seconds`` of 1280x720
25 fps H.264 (x264 superfast, its default quality) + AAC, in cycles of 20 s: a 14 s
interview shot from a still camera (a real photograph: scikit-image's astronaut or its
cameraman, on a studio backdrop) with sensor noise on every frame and a lower-third
caption (a name and a title) on screen from 3 s to 10 s into the shot, then 6 s of
moving B-roll (a pan over the astronaut, a zoom into the cameraman); 70 % interview,
30 % B-roll. Speech throughout: e2e_bench's espeak-ng sentences, one every
SPEECH_EVERY s. A 6 s clip made the same way is the warm-up.

The bar (issue #43): the service's wall with the savings on at most 0.4 of the direct
calls' sum in the same run. The table gives each processor's frames analysed and
skipped (carried forward from the last analysed frame) in both service runs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from e2e_bench import (
    direct,
    load_average,
    make_bench_video,
    revision,
    through_service,
)
from frame_media import astronaut, pull_models
from PIL import Image, ImageDraw, ImageFont

from momentry_edge.processors.whisper import Options as AsrOptions
from momentry_edge.processors.yolo import DEFAULT_MODEL as YOLO_MODEL

FPS = 25
SIZE = (1280, 720)
INTERVIEW_SECONDS = 14.0
BROLL_SECONDS = 6.0
CAPTION = (3.0, 10.0)  # seconds into an interview shot the lower third is on screen
SPEECH_EVERY = 5.0
NOISE = 3.0  # sensor noise: standard deviation in levels of 255, new on every frame
WARMUP_SECONDS = 6.0
VIDEO_VERSION = 1  # bump when the pictures or the speech change: cached videos are remade
FRAME_PROCESSORS = ("yolo", "ocr", "face", "pose")
# The savings turned off, for the "before" run: every sampled frame analysed.
SAVINGS_OFF = "".join(f"[processors.{name}]\nskip_unchanged = false\n" for name in FRAME_PROCESSORS)
PEOPLE = (
    ("Dr. Eileen Collins", "Astronaut, NASA"),
    ("Ansel Weston", "Photographer"),
)


def _camera() -> np.ndarray:
    from skimage import data

    return np.repeat(data.camera()[:, :, None], 3, axis=2)  # 512x512 grey -> RGB


class StudioPictures:
    """Frame ``i`` of the studio video (RGB), see the module docstring."""

    def __init__(self) -> None:
        self.photos = (astronaut(), _camera())
        self.cycle = round((INTERVIEW_SECONDS + BROLL_SECONDS) * FPS)
        self.interview = round(INTERVIEW_SECONDS * FPS)
        rng = np.random.default_rng(43)
        noise = rng.normal(0, NOISE, (8, SIZE[1], SIZE[0], 3))
        self.noise = np.clip(noise, -127, 127).astype(np.int16)
        self.shots: dict[tuple[int, bool], np.ndarray] = {}

    def __call__(self, i: int) -> np.ndarray:
        cycle, t = divmod(i, self.cycle)
        if t < self.interview:
            image = self._interview(cycle, t / FPS)
        else:
            image = self._broll(cycle, t - self.interview)
        noisy = image.astype(np.int16) + self.noise[(i * 5) % len(self.noise)]
        return np.clip(noisy, 0, 255).astype(np.uint8)

    def _interview(self, cycle: int, seconds: float) -> np.ndarray:
        captioned = CAPTION[0] <= seconds < CAPTION[1]
        key = (cycle % 2, captioned)
        if key not in self.shots:
            self.shots[key] = self._shot(*key)
        return self.shots[key]

    def _shot(self, person: int, captioned: bool) -> np.ndarray:
        width, height = SIZE
        rows = np.linspace(0, 1, height)[:, None, None]
        backdrop = np.array([30, 40, 70]) * (1 - rows) + np.array([70, 80, 110]) * rows
        frame = np.broadcast_to(backdrop, (height, width, 3)).astype(np.uint8).copy()
        x = 640 if person == 0 else 180
        frame[120:632, x : x + 512] = self.photos[person]
        if not captioned:
            return frame
        image = Image.fromarray(frame)
        draw = ImageDraw.Draw(image)
        name, title = PEOPLE[person]
        draw.rectangle((60, 540, 700, 660), fill=(20, 20, 30))
        draw.text((84, 548), name, font=ImageFont.load_default(size=44), fill=(255, 255, 255))
        draw.text((84, 604), title, font=ImageFont.load_default(size=34), fill=(230, 200, 80))
        return np.asarray(image)

    def _broll(self, cycle: int, t: int) -> np.ndarray:
        width, height = SIZE
        if cycle % 2 == 0:  # a pan over the astronaut, enlarged
            big = cv2.resize(self.photos[0], (1600, 1600), interpolation=cv2.INTER_LINEAR)
            x, y = 2 * t, 300 + t
            return np.ascontiguousarray(big[y : y + height, x : x + width])
        # a zoom into the cameraman
        scale = 1.0 + t / (BROLL_SECONDS * FPS)
        side = round(720 * scale)
        big = cv2.resize(self.photos[1], (side, side), interpolation=cv2.INTER_LINEAR)
        canvas = np.full((height, width, 3), 20, np.uint8)
        top = (side - height) // 2
        left = (width - side) // 2
        if left >= 0:
            canvas[:, left : left + side] = big[top : top + height]
        else:
            canvas[:] = big[top : top + height, -left : -left + width]
        return canvas


def make_studio_video(path: Path, seconds: float) -> Path:
    """The studio video (see the module docstring), made unless it exists."""
    return make_bench_video(path, seconds, StudioPictures(), SPEECH_EVERY, SIZE, FPS)


def studio_paths(work: Path, seconds: float) -> tuple[Path, Path]:
    stem = f"studio-v{VIDEO_VERSION}-{SIZE[0]}x{SIZE[1]}-{FPS}fps"
    return work / f"{stem}-{seconds:g}s.mp4", work / f"{stem}-warmup-{WARMUP_SECONDS:g}s.mp4"


def _table(off: dict[str, Any], on: dict[str, Any], parts: dict[str, Any]) -> None:
    print(
        f"{'part':<6}{'direct s':>10}{'direct n':>10}"
        f"{'off: s':>9}{'analysed':>10}{'skipped':>9}"
        f"{'on: s':>8}{'analysed':>10}{'skipped':>9}"
    )
    for name, (_, run, _, done) in parts.items():
        cells = []
        for service in (off, on):
            n, skipped = service["counts"].get(name, 0), service["skipped"].get(name, 0)
            span = service["spans"].get(name, math.nan)
            analysed = n - skipped if name not in ("asr", "cut") else n
            cells.append(f"{span:>9.1f}{analysed:>10}{skipped:>9}")
        print(f"{name:<6}{run:>10.1f}{done:>10}{cells[0]}{cells[1][1:]}")
    run_sum = sum(p[1] for p in parts.values())
    load_sum = sum(p[0] for p in parts.values())
    cpu_sum = sum(p[2] for p in parts.values())
    print(
        f"direct sum: runs {run_sum:.1f} s, with the loads {run_sum + load_sum:.1f} s;"
        f" the runs' CPU {cpu_sum:.1f} s"
    )
    for label, service in (("savings off", off), ("savings on", on)):
        wall = service["wall"]
        print(
            f"service wall, {label}: {wall:.1f} s, ratio {wall / run_sum:.2f} against the runs"
            f" alone, {wall / (run_sum + load_sum):.2f} with the loads; CPU {service['cpu']:.1f}"
            f" s ({service['cpu'] / cpu_sum:.2f} of the direct runs'), peak RSS"
            f" {service['peak_rss'] / 2**20:.0f} MiB"
        )
    print("bar: savings on <= 0.4 of the direct runs' sum")
    print(
        "n: frames sampled; analysed: looked at by the model; skipped: the picture had not"
        " changed since the last analysed frame, its answer carried forward"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="length of the video")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "momentry-studio-bench",
        help="folder for the videos, models and the service's data",
    )
    parser.add_argument("--keep-video", action="store_true", help="keep the videos for next time")
    parser.add_argument("--make-only", action="store_true", help="make the videos and stop")
    parser.add_argument(
        "--results", type=Path, help="save each processor's result (savings on) here"
    )
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is needed for the speech (apt-get install espeak-ng)")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    loads = load_average()
    video, warmup = studio_paths(work, args.seconds)
    models_dir = work / "models"
    for path, seconds in ((warmup, WARMUP_SECONDS), (video, args.seconds)):
        started = time.perf_counter()
        if not path.exists():
            make_studio_video(path, seconds)
            print(f"made {path.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.make_only:
        return
    try:
        pull_models(models_dir, AsrOptions().model, YOLO_MODEL)
        off = through_service(work, models_dir, warmup, video, extra_config=SAVINGS_OFF)
        on = through_service(work, models_dir, warmup, video, args.results)
        parts = direct(models_dir, warmup, video)
    finally:
        shutil.rmtree(work / "service", ignore_errors=True)
        shutil.rmtree(models_dir, ignore_errors=True)
        if not args.keep_video:
            for path in (video, warmup):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                work.rmdir()
    print(
        f"studio video: {args.seconds:g} s 1280x720 {FPS} fps, cycles of {INTERVIEW_SECONDS:g} s"
        f" interview (still camera, noise sd {NOISE:g}, caption {CAPTION[0]:g}-{CAPTION[1]:g} s)"
        f" + {BROLL_SECONDS:g} s moving B-roll; speech every {SPEECH_EVERY:g} s"
    )
    print(f"git {revision()}; load average {loads} at start, {load_average()} at end")
    _table(off, on, parts)


if __name__ == "__main__":
    main()
