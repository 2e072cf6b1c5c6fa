"""Backup figures on a queue of many jobs: backup time and size, the start-up check, restore.

    .venv/bin/python benchmarks/backup_bench.py [--jobs 100000] [--backend sqlite|postgres]

Fills a fresh database with ``--jobs`` finished jobs (one file and three processor
runs each, bulk inserts through the project's peewee models), then measures the
start-up check (SQLite: ``PRAGMA quick_check``, and ``integrity_check`` beside it),
``momentry-edge backup`` with and without a writer updating jobs meanwhile (the
writer's slowest write during the copy shows whether the copy held it up), and
``momentry-edge restore`` of the copy into a new data dir.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import secrets
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from common import scratch_postgres

from momentry_edge import config as config_module
from momentry_edge import store
from momentry_edge.store import Job, MediaFile, ProcessorRun
from momentry_edge.upkeep import backup, dbcheck, restore

BATCH = 1000  # PostgreSQL takes at most 65,535 parameters a statement
PROCESSORS = ["asr", "cut", "yolo"]


def fill(jobs: int) -> None:
    """``jobs`` finished jobs, each with its file and three processor runs."""
    database = Job._meta.database
    if not store.is_postgres(database):
        database.execute_sql("PRAGMA synchronous = OFF")  # a scratch file: speed over safety
    now = time.time()
    for start in range(0, jobs, BATCH):
        ids = range(start, min(start + BATCH, jobs))
        with database.atomic():
            MediaFile.insert_many(
                {
                    "id": i + 1,
                    "file_uuid": f"{i:032x}",
                    "path": f"/drop/video {i:06d}.mp4",
                    "watch_root": "/drop",
                    "rel_path": f"video {i:06d}.mp4",
                    "name": f"video {i:06d}.mp4",
                    "size": 10_000_000 + i,
                    "mtime": now,
                    "fingerprint": secrets.token_hex(20),
                    "duration": 60.0,
                    "width": 1920,
                    "height": 1080,
                    "fps": 30.0,
                    "video_codec": "h264",
                    "audio_codec": "aac",
                }
                for i in ids
            ).execute()
            Job.insert_many(
                {
                    "id": i + 1,
                    "task_id": f"task_{i:012x}",
                    "file": i + 1,
                    "status": store.JobStatus.COMPLETED,
                    "seq": i,
                    "processors": PROCESSORS,
                    "options": {"callback_url": "http://studio.local/hook"},
                    "progress": 100,
                    "max_retries": 3,
                    "started_at": now,
                    "completed_at": now,
                }
                for i in ids
            ).execute()
            ProcessorRun.insert_many(
                {
                    "job": i + 1,
                    "processor": name,
                    "position": position,
                    "status": store.RunStatus.COMPLETED,
                    "progress_current": 100,
                    "progress_total": 100,
                    "last_checkpoint": {"frame": 1800, "timestamp": 60.0},
                    "output_path": f"/data/results/{i:032x}/{name}.json",
                    "attempts": 1,
                    "backend": "onnxruntime",
                    "model": "yolov8n",
                    "started_at": now,
                    "completed_at": now,
                }
                for i in ids
                for position, name in enumerate(PROCESSORS)
            ).execute()


@contextlib.contextmanager
def writer(cfg: config_module.Config) -> Iterator[list[float]]:
    """Update a job every 10 ms, as progress reports do; yields each write's duration."""
    stop, durations = threading.Event(), []

    def loop() -> None:
        path = backup.sqlite_path(cfg)
        conn = (
            sqlite3.connect(path, timeout=30, isolation_level=None)
            if path
            else psycopg.connect(cfg.service.database_url, autocommit=True)
        )
        mark = "?" if path else "%s"
        for n in itertools.count():
            if stop.wait(0.01):
                break
            began = time.monotonic()
            conn.execute(f"UPDATE job SET progress = {mark} WHERE id = {mark}", (n % 100, 1 + n))
            durations.append(time.monotonic() - began)
        conn.close()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        yield durations
    finally:
        stop.set()
        thread.join()


def timed(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    began = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="backup-bench-")))
        urls = ("", "")
        if args.backend == "postgres":
            urls = tuple(stack.enter_context(scratch_postgres(prefix="bench")) for _ in "ab")
        env = {"MOMENTRY_DATA_DIR": str(root / "data"), "DATABASE_URL": urls[0]}
        cfg = config_module.load(None, env)
        store.connect(cfg.service.database_url, cfg.data_dir)
        _, seconds = timed(fill, args.jobs)
        rows = [("fill (bulk insert)", f"{seconds:.1f} s", f"{args.jobs} jobs")]
        store.Job._meta.database.close()

        path = backup.sqlite_path(cfg)
        if path is not None:
            rows.append(("database file", f"{path.stat().st_size / 1e6:.1f} MB", ""))
            _, seconds = timed(dbcheck.check, path, cfg)
            rows.append(("start-up check (quick_check)", f"{seconds * 1000:.0f} ms", ""))
            conn = sqlite3.connect(path)
            _, seconds = timed(lambda: conn.execute("PRAGMA integrity_check").fetchall())
            conn.close()
            rows.append(("integrity_check (for comparison)", f"{seconds * 1000:.0f} ms", ""))

        made, seconds = timed(backup.take, cfg, root / "idle")
        rows.append(("backup, idle", f"{seconds:.2f} s", f"{made.size / 1e6:.1f} MB"))
        with writer(cfg) as durations:
            time.sleep(0.3)
            before = len(durations)
            made, seconds = timed(backup.take, cfg, root / "busy")
            during = durations[before:]
        slowest = max(during, default=0) * 1000
        rows.append(
            (
                "backup, writer every 10 ms",
                f"{seconds:.2f} s",
                f"{len(during)} writes meanwhile, slowest {slowest:.0f} ms",
            )
        )
        env2 = {"MOMENTRY_DATA_DIR": str(root / "restored"), "DATABASE_URL": urls[1]}
        restored, seconds = timed(restore.restore, config_module.load(None, env2), made.path)
        rows.append(("restore (service stopped)", f"{seconds:.2f} s", f"{restored.jobs} jobs"))

    width = max(len(r[0]) for r in rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"backup_bench: {args.backend}, {args.jobs} jobs, SQLite {sqlite3.sqlite_version}")
    print(f"  {os.cpu_count()} cores, load average {load}")
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>9}  {note}")


if __name__ == "__main__":
    main()
