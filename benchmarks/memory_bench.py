"""Memory of `momentry-edge run` (the resident size of its process tree): at start, at its
peak during one default deep scan of 720p video, during two at once, and after it has
been idle long enough to let its models go (``models.idle_release_seconds``, shortened
here); and what the next job pays to load them again.

    .venv/bin/python benchmarks/memory_bench.py [--seconds 30] [--idle-seconds 5]
        [--checkout PATH]   # another checkout's service (e.g. main, for "before")

The videos are e2e_bench.py's (1280x720 25 fps, speech, a new scene every 6 s), two of
them (``--seconds``, a frame and two frames longer), so that no job is another's content. The
service runs with the default processors and settings, but dynamic concurrency off (so
that the second job starts whatever the machine's load). RSS is sampled every 0.2 s;
"anon" is the part that is not files mapped in (the libraries' code, which the system can
drop and read again): RssAnon from /proc. A checkout without the idle release (before)
is measured after the same idle time, its models still loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
from common import ROOT, service_process
from e2e_bench import FINAL, FPS, PeakRss, load_average, make_bench_video, revision
from frame_media import pull_models

from momentry_edge.processors import Registry
from momentry_edge.processors.whisper import Options as AsrOptions
from momentry_edge.processors.yolo import DEFAULT_MODEL as YOLO_MODEL

MIB = 2**20
PROCESSORS = ["asr", "cut", "yolo", "ocr", "face", "pose"]


@contextlib.contextmanager
def service(root: Path, checkout: Path, extra: str) -> Iterator[tuple[httpx.Client, int]]:
    """`momentry-edge run` of ``checkout`` on a free loopback port; a client and its pid."""
    config = f"[queue]\ndynamic_concurrency = false\n{extra}"
    with (
        service_process(root, config, checkout=checkout, wait=120) as (url, proc),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield client, proc.pid


def resident(pid: int) -> tuple[int, int]:
    """(RSS, RssAnon) of the process and its children, bytes."""
    rss = anon = 0
    process = psutil.Process(pid)
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error, OSError):
            rss += p.memory_info().rss
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    anon += int(line.split()[1]) * 1024
    return rss, anon


def register(client: httpx.Client, drop: Path, video: Path) -> str:
    target = drop / video.name
    with contextlib.suppress(FileExistsError):
        os.link(video, target)
    reply = client.post("/api/v1/files/register", json={"path": str(target)})
    reply.raise_for_status()
    return str(reply.json()["task_id"])


def wait_done(client: httpx.Client, tasks: list[str]) -> float:
    started = time.perf_counter()
    for task in tasks:
        while (job := client.get(f"/api/v1/jobs/{task}").json())["status"] not in FINAL:
            time.sleep(0.2)
        if job["status"] != "completed":
            raise SystemExit(f"job {task} ended {job['status']}")
    return time.perf_counter() - started


def loaded(client: httpx.Client) -> int | None:
    """Instances with a model loaded (None: the service does not say)."""
    answer = client.get("/api/v1/processors").json()["processors"]
    counts = [p.get("loaded") for p in answer.values()]
    return None if None in counts else sum(counts)


def idle(client: httpx.Client, pid: int, seconds: float) -> tuple[tuple[int, int], float]:
    """Wait until the models are let go (or ``seconds`` where the service cannot); the
    memory then and the seconds waited."""
    started = time.monotonic()
    time.sleep(seconds)
    while (count := loaded(client)) and time.monotonic() - started < seconds + 120:
        time.sleep(0.2)
    if count:
        print(f"warning: {count} instances still loaded", file=sys.stderr)
    time.sleep(1)  # the step that let them go gave the heap back, or started afresh
    while client.get("/healthz").status_code != 200:  # a fresh start answers once it is up
        time.sleep(0.2)
    return resident(pid), time.monotonic() - started


def load_seconds(models: Path) -> dict[str, tuple[float, float]]:
    """Seconds to load each processor's model: the first time in this process (its library
    imported too: what the next job pays after a fresh start) and again (the library
    imported: after a release that kept the process). The next job's parts load side by side."""
    registry = Registry([], {n: {"models_dir": str(models)} for n in ("asr", "yolo")})
    out = {}
    for name in PROCESSORS:
        started = time.perf_counter()
        registry.create(name).load()
        first = time.perf_counter() - started
        started = time.perf_counter()
        registry.create(name).load()
        out[name] = (first, time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the videos")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the service's checkout")
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "momentry-memory-bench"
    )
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    loads = load_average()
    videos = []
    for k in range(3):  # three contents: none of the jobs is skipped as done already
        seconds = args.seconds + k / FPS
        path = work / f"memory-{k}-{seconds:g}s.mp4"
        videos.append(make_bench_video(path, seconds))
    models = pull_models(work / "models", AsrOptions().model, YOLO_MODEL)
    ours = args.checkout.resolve() == ROOT
    extra = f"[models]\nidle_release_seconds = {args.idle_seconds:g}\n" if ours else ""
    root = work / "service"
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    (root / "data" / "models").symlink_to(models)
    rows: list[tuple[str, Any, Any, str]] = []
    with service(root, args.checkout, extra) as (client, pid):
        time.sleep(2)
        rss, anon = resident(pid)
        rows.append(("at start", rss, anon, ""))
        with PeakRss(pid) as peak:
            wall = wait_done(client, [register(client, root / "drop", videos[0])])
        rows.append(("one job, peak", peak.peak, None, f"{wall:.0f} s, models loaded cold"))
        (rss, anon), waited = idle(client, pid, args.idle_seconds)
        rows.append(("idle after it", rss, anon, f"after {waited:.0f} s"))
        with PeakRss(pid) as peak:
            tasks = [register(client, root / "drop", v) for v in videos[1:]]
            wall = wait_done(client, tasks)
        rows.append(("two jobs at once, peak", peak.peak, None, f"{wall:.0f} s"))
        (rss, anon), waited = idle(client, pid, args.idle_seconds)
        rows.append(("idle after them", rss, anon, f"after {waited:.0f} s"))
    costs = load_seconds(models)
    print(f"memory_bench: {args.seconds:g} s of 1280x720 {FPS} fps, default deep scan")
    print(
        f"service: {args.checkout} (git {revision() if ours else 'see --checkout'}); "
        f"{os.cpu_count()} cores; load average {loads} at start, {load_average()} at end"
    )
    print(f"{'':<24}{'RSS MiB':>9}{'anon MiB':>10}  note")
    for label, rss, anon, note in rows:
        anon_text = f"{anon / MIB:.0f}" if anon is not None else "-"
        print(f"{label:<24}{rss / MIB:>9.0f}{anon_text:>10}  {note}")
    for k, label in enumerate(("with their libraries (after a fresh start)", "libraries imported")):
        each = ", ".join(f"{n} {s[k]:.2f}" for n, s in costs.items())
        total = sum(s[k] for s in costs.values())
        print(f"loading the models again, {label}: {each}; sum {total:.1f} s")


if __name__ == "__main__":
    main()
