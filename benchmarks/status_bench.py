"""Status at scale: what `GET /api/v1/queue/status`, `momentry-edge status` and one TUI
redraw cost with a long line of waiting jobs.

    .venv/bin/python benchmarks/status_bench.py [--jobs 50000] [--repeat 5]

A fresh SQLite file gets ``--jobs`` files' records and pending jobs (written as the
intake writes a batch of new files); a real `momentry-edge run` (queue paused, so they
stay waiting) then answers. Figures: median wall time and bytes of the HTTP answer;
wall time, bytes and lines of `momentry-edge status` (a subprocess); and one TUI
redraw: the view's poll of the service plus drawing it at 80x24 (in this process).
Before the status was paged, `?limit=20` was refused (400). Every other file is in a
folder ``day 2``: a page of that folder's waiting jobs deep in the line (each with its own
place and start) against the same page of the whole line, as a ratio.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import peewee
from common import ROOT, service_process
from rich.console import Console

from momentry_edge import jobs, store
from momentry_edge.cli import screen, tui
from momentry_edge.cli.client import ApiClient
from momentry_edge.ingest import intake, recording
from momentry_edge.jobs import capacity, estimates, views


def fill(data_dir: Path, count: int) -> None:
    """``count`` files (outside any watched folder) each with a pending job; every other
    one in a folder ``day 2``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    database = store.connect("", data_dir)
    jobs.init_queue_state(2, False)
    jobs.set_paused(True)
    folder = data_dir.parent / "elsewhere"
    admitting = intake.Intake([folder], [".mp4"], 1.0, ["asr", "cut"], 3)
    st = Path(__file__).stat()
    seen = recording._Observed(store.FileState.PRESENT, None, None, "1:0")
    now = time.time()
    rows = [
        recording._fields(
            folder / ("day 2" if i % 2 else "") / f"b {i:06d}.mp4", folder, st, seen, now
        )
        for i in range(count)
    ]
    for chunk in peewee.chunked(rows, intake.BATCH):
        with store.write_transaction(database):
            admitting._insert_new(chunk, hold={})
    database.close()


def timed(body) -> tuple[float, object]:
    started = time.perf_counter()
    result = body()
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="status-bench-") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        fill(root / "data", args.jobs)
        print(f"{args.jobs} pending jobs written in {time.perf_counter() - started:.1f} s")
        config = "[queue]\nworker_enabled = false\n[models]\nauto_pull = false\n"
        with service_process(root, config) as (url, _proc):
            http = httpx.Client(timeout=600)
            times, sizes = [], []
            for _ in range(args.repeat):
                took, reply = timed(lambda: http.get(f"{url}/api/v1/queue/status"))
                reply.raise_for_status()
                times.append(took)
                sizes.append(len(reply.content))
            print(
                f"GET /api/v1/queue/status: {statistics.median(times):.3f} s, "
                f"{statistics.median(sizes) / 1024:.1f} KB (median of {args.repeat})"
            )
            times, sizes = [], []
            for _ in range(args.repeat):
                took, reply = timed(lambda: http.get(f"{url}/api/v1/queue/status?limit=20"))
                times.append(took)
                sizes.append(len(reply.content))
            print(
                f"GET /api/v1/queue/status?limit=20 (what `status` asks): "
                f"{statistics.median(times):.3f} s, {statistics.median(sizes) / 1024:.1f} KB"
                f" (HTTP {reply.status_code})"
            )
            deep = args.jobs // 2 - 25  # the last page of day 2's jobs
            pages = {
                "the whole line": f"limit=25&offset={2 * deep}",
                "folder day 2": f"limit=25&offset={deep}&folder=day%202",
            }
            medians = {}
            for label, query in pages.items():
                times = []
                for _ in range(args.repeat):
                    took, reply = timed(lambda q=query: http.get(f"{url}/api/v1/queue/status?{q}"))
                    reply.raise_for_status()
                    times.append(took)
                medians[label] = statistics.median(times)
            whole, folder = medians["the whole line"], medians["folder day 2"]
            print("| page of 25, deep in the line | median s |")
            print("| --- | --- |")
            print(f"| the whole line (offset {2 * deep}) | {whole:.3f} |")
            print(f"| folder day 2 (offset {deep}) | {folder:.3f} (x{folder / whole:.1f}) |")
            env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
            command = [sys.executable, "-m", "momentry_edge.cli", "--help"]
            took, _ = timed(lambda: subprocess.run(command, env=env, capture_output=True, cwd=ROOT))
            print(f"momentry-edge --help (the interpreter's start alone): {took:.2f} s")
            command = [sys.executable, "-m", "momentry_edge.cli", "status", "--url", url]
            took, proc = timed(
                lambda: subprocess.run(command, env=env, capture_output=True, cwd=ROOT)
            )
            lines = proc.stdout.count(b"\n")
            print(
                f"momentry-edge status: {took:.2f} s, {len(proc.stdout) / 1024:.1f} KB, "
                f"{lines} lines (exit {proc.returncode}; one run, "
                "with the interpreter's start)"
            )
            api = ApiClient(url, timeout=600)
            snapshot = screen.Snapshot(url)
            times = []
            for _ in range(args.repeat):
                console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True)

                def redraw(console: Console = console) -> None:
                    nonlocal snapshot
                    snapshot = tui.fetch(api, snapshot)
                    console.print(screen.render(snapshot, None, "", 24, time.time(), 80))

                took, _ = timed(redraw)
                times.append(took)
            print(f"TUI redraw at 80x24 (poll + draw): {statistics.median(times):.3f} s (median)")
        # A filtered page's estimates: each job's start behind the work of every job before
        # it (one read of the line up to the last of them), here with one job's time known;
        # against estimating the same 25 jobs one by one (each summing the work ahead).
        database = store.connect("", root / "data")
        rates = estimates.Rates(average_job=10.0)
        nodes = capacity.Capacity((capacity.Taker("n", frozenset(), 2),), frozenset())
        positions = list(range(args.jobs - 49, args.jobs + 1, 2))  # day 2's last 25
        waiting = [(["asr", "cut"], None)] * len(positions)
        free = {"n": [0.0, 0.0]}
        one_pass, each = [], []
        for _ in range(args.repeat):
            took, _ = timed(lambda: capacity.starts_at(positions, waiting, free, nodes, rates))
            one_pass.append(took)
            took, _ = timed(
                lambda: [
                    views._starts_after(p - 1, [w], free, nodes, rates)
                    for p, w in zip(positions, waiting, strict=True)
                ]
            )
            each.append(took)
        fast, slow = statistics.median(one_pass), statistics.median(each)
        print("| estimates of a folder's last 25 jobs | median s |")
        print("| --- | --- |")
        print(f"| one job at a time (work ahead summed for each) | {slow:.3f} |")
        print(f"| one read of the line (what the status does) | {fast:.3f} (x{fast / slow:.2f}) |")
        database.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
