"""Ingest figures: how long after an upload's last write its job is queued, and rescan speed.

    .venv/bin/python benchmarks/ingest_bench.py [--backend sqlite|postgres] [--settle 1.0]
        [--single 20] [--batch 1000] [--unchanged 10000]

A real Service runs in this process (watcher, intake, HTTP; workers off, so queued
jobs stay queued) on a temp folder and a fresh SQLite file or PostgreSQL database.

1. One file at a time: a real video (5 s, 320x240, h264 + aac) is copied into the
   drop folder; the figure is the job's ``created_at`` minus the end of the copy,
   minus ``settle_seconds`` (the wait the settle rule imposes by design).
2. ``--batch`` copies of it written at once (each a new path, so each is queued).
   Registration keeps pace with the copying, so the last one is queued about when
   it is written; the files/s figure is bounded by the copy.
3. ``--batch`` copies written outside the drop folder, then renamed into it at once,
   as SFTPGo's atomic uploads and rsync finish theirs: the renames take milliseconds,
   so the time from the last rename to the last job queued is the intake's own
   (the bulk insert's) throughput.
4. The bulk insert alone (what a batch of new files costs the database code): 1,000
   new files' records, jobs and runs, ``ingest.BATCH`` to a transaction, written out
   (``store.insert_many``) against peewee's ``insert_many`` and a SELECT back, as the
   intake did before, alternately in the same run; the ratio is peewee's time over ours.
5. ``--unchanged`` files already registered (rows as ingest writes them, matching
   their size and mtime): the time of ``POST /api/v1/files/rescan``, which walks the
   folders and recognises each file by size and mtime without reading it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import peewee

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # media_factory: real videos made with PyAV

from common import running_service, scratch_postgres  # noqa: E402
from media_factory import make_video  # noqa: E402

from momentry_edge import config as config_module  # noqa: E402
from momentry_edge import jobs, store  # noqa: E402
from momentry_edge.ingest import intake as ingest  # noqa: E402
from momentry_edge.ingest import paths as ingest_paths  # noqa: E402
from momentry_edge.ingest import recording  # noqa: E402
from momentry_edge.store import Job, MediaFile, ProcessorRun  # noqa: E402


def write_config(root: Path, database_url: str, settle: float) -> config_module.Config:
    settings = {
        "service": {
            "data_dir": str(root / "data"),
            "watch": [str(root / "drop")],
            "port": 0,
            "database_url": database_url,
            "log_level": "warning",
        },
        "queue": {"worker_enabled": False, "dynamic_concurrency": False},
        "ingest": {"settle_seconds": settle, "processors": ["cut"], "rescan_interval": 86400},
    }
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    (root / "drop").mkdir(parents=True, exist_ok=True)
    path = root / "momentry.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config_module.load(path, env={})


@contextlib.contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        yield ""
        return
    with scratch_postgres(prefix="momentry_ingest_bench") as url:
        yield url


def queued_at(paths: list[Path], timeout: float) -> dict[str, float]:
    """Job created_at per path, waiting until every path has a job."""
    wanted = [str(p) for p in paths]
    deadline = time.monotonic() + timeout
    found: dict[str, float] = {}
    while True:
        for chunk in peewee.chunked([p for p in wanted if p not in found], 500):
            rows = (
                Job.select(MediaFile.path, Job.created_at)
                .join(MediaFile)
                .where(MediaFile.path.in_(chunk))
                .tuples()
            )
            found.update(rows)
        if len(found) == len(wanted):
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(found)} of {len(wanted)} files were queued in {timeout}s")
        time.sleep(0.02)


def copy_in(source: Path, target: Path) -> float:
    """Write ``target`` as an upload would; returns the time the last byte was written."""
    shutil.copyfile(source, target)
    return time.time()


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   "
        f"max {ordered[-1] * 1000:7.1f} ms"
    )


def bench_drops(cfg: config_module.Config, sample: Path, single: int, batch: int) -> None:
    settle = cfg.ingest.settle_seconds
    drop = cfg.service.watch[0]
    with running_service(cfg):
        # 1. One file at a time.
        extra = []
        for i in range(single):
            target = drop / f"single {i:03d}.mp4"
            written = copy_in(sample, target)
            extra.append(queued_at([target], timeout=60)[str(target)] - written - settle)
        print(f"1 file at a time ({single} drops), beyond settle_seconds: {percentiles(extra)}")

        # 2. A batch written at once, in ten folders.
        targets = [drop / f"batch {i % 10}" / f"clip {i:05d}.mp4" for i in range(batch)]
        for folder in {t.parent for t in targets}:
            folder.mkdir(parents=True, exist_ok=True)
        started = time.time()
        written = {str(t): copy_in(sample, t) for t in targets}
        copy_seconds = time.time() - started
        created = queued_at(targets, timeout=600)
        extra = [created[p] - written[p] - settle for p in written]
        last = max(created.values()) - max(written.values())
        print(
            f"{batch} files written at once (copy took {copy_seconds:.2f} s), beyond "
            f"settle_seconds: {percentiles(extra)}\n"
            f"  last one queued {last - settle:.2f} s after the last write + settle_seconds "
            f"({last:.2f} s after the last write); "
            f"{batch / (max(created.values()) - min(created.values()) or 1):.0f} files/s "
            "registered and queued"
        )

        # 3. A batch renamed into place at once.
        staging = drop.parent / "staging"
        staging.mkdir(exist_ok=True)
        names = [f"renamed {i % 10}/clip {i:05d}.mp4" for i in range(batch)]
        for name in names:
            shutil.copyfile(sample, staging / name.replace("/", " "))
        for folder in {(drop / n).parent for n in names}:
            folder.mkdir(parents=True, exist_ok=True)
        started = time.time()
        for name in names:
            os.rename(staging / name.replace("/", " "), drop / name)
        renamed = time.time()
        created = queued_at([drop / n for n in names], timeout=600)
        print(
            f"{batch} files renamed into place at once (renames took "
            f"{renamed - started:.2f} s): last one queued {max(created.values()) - renamed:.2f} s "
            f"after the last rename; {batch / (max(created.values()) - started):.0f} files/s "
            "registered and queued"
        )


def _peewee_insert(rows: list[dict], processors: list[str], now: float) -> None:
    """What the intake did before its bulk insert was written out: peewee's insert_many
    and a SELECT back, for the records, then for the jobs; then the runs."""
    MediaFile.insert_many(rows).execute()
    records = MediaFile.select().where(MediaFile.path.in_([r["path"] for r in rows]))
    jobs = [
        {
            "task_id": f"task_{os.urandom(6).hex()}",
            "file": record.id,
            "priority": 1,
            "seq": int(now * 1e6) + i,
            "processors": processors,
            "options": {},
            "max_retries": 3,
            "created_at": now,
            "queued_at": now,
        }
        for i, record in enumerate(records)
    ]
    Job.insert_many(jobs).execute()
    made = Job.select().where(Job.task_id.in_([j["task_id"] for j in jobs]))
    runs = [
        {"job": job.id, "processor": name, "position": i, "updated_at": now}
        for job in made
        for i, name in enumerate(processors)
    ]
    ProcessorRun.insert_many(runs).execute()


def bench_insert(cfg: config_module.Config, files: int) -> None:
    database = store.connect(cfg.service.database_url, cfg.data_dir)
    jobs.init_queue_state(2, False)
    intake = ingest.Intake(cfg.service.watch, [".mp4"], 1.0, ["cut"], 3)
    st = Path(__file__).stat()
    seen = recording._Observed(store.FileState.PRESENT, None, None, "1:0")
    timings: dict[str, list[float]] = {"written out": [], "peewee": []}
    for round_ in range(6):
        for way in timings:
            now = time.time()
            rows = [
                recording._fields(
                    Path(f"/drop/{way} {round_}/{i:05d}.mp4"), Path("/drop"), st, seen, now
                )
                for i in range(files)
            ]
            started = time.perf_counter()
            for chunk in peewee.chunked(rows, ingest.BATCH):
                with store.write_transaction(database):
                    if way == "peewee":
                        _peewee_insert(chunk, ["cut"], now)
                    else:
                        intake._insert_new(chunk, hold={})
            timings[way].append(time.perf_counter() - started)
    database.close()
    ours, theirs = (statistics.median(t) for t in timings.values())
    print(
        f"bulk insert of {files} new files (records, jobs, runs; {ingest.BATCH} a transaction; "
        f"median of 6): written out {ours:.3f} s, peewee insert_many {theirs:.3f} s; "
        f"ratio {theirs / ours:.2f}"
    )


def bench_rescan(cfg: config_module.Config, sample: Path, count: int) -> None:
    drop = cfg.service.watch[0]
    data = sample.read_bytes()[:4096]  # never read by a rescan of unchanged files
    paths = []
    for i in range(count):
        path = drop / f"archive {i // 100:03d}" / f"take {i:05d}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    # Registered before: rows as the intake writes them, written before the service starts.
    database = store.connect(cfg.service.database_url, cfg.data_dir)
    now = time.time()
    rows = []
    for path in paths:
        st = path.stat()
        rows.append(
            {
                "file_uuid": ingest_paths.file_uuid_for(path),
                "path": str(path),
                "watch_root": str(drop),
                "rel_path": str(path.relative_to(drop)),
                "name": path.name,
                "size": st.st_size,
                "mtime": st.st_mtime,
                "state": store.FileState.PRESENT,
                "fingerprint": f"{st.st_size}:0",
                "registered_at": now,
                "updated_at": now,
            }
        )
    with database.atomic():
        for chunk in peewee.chunked(rows, 500):
            MediaFile.insert_many(chunk).execute()
    database.close()

    with running_service(cfg) as service, httpx.Client(base_url=service.url, timeout=600) as http:
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            reply = http.post("/api/v1/files/rescan").json()
            timings.append(time.perf_counter() - started)
            assert reply["unchanged"] == count and reply["new"] == 0, reply
        print(
            f"rescan of {count} unchanged files in {len({p.parent for p in paths})} folders"
            " (POST /files/rescan, "
            f"5 runs): median {statistics.median(timings):.3f} s, min {min(timings):.3f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--settle", type=float, default=1.0, help="settle_seconds")
    parser.add_argument("--single", type=int, default=20, help="single drops to time")
    parser.add_argument("--batch", type=int, default=1000, help="files written at once")
    parser.add_argument("--unchanged", type=int, default=10_000, help="files to rescan")
    args = parser.parse_args()
    print(
        f"momentry-edge ingest, {args.backend}, settle_seconds {args.settle}, "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
        sample = make_video(
            Path(tmp) / "sample.mp4", segments=1, segment_seconds=5.0, size=(320, 240)
        )
        print(f"sample video: {sample.stat().st_size} bytes")
        with database(args.backend) as url:
            bench_drops(
                write_config(Path(tmp) / "drops", url, args.settle), sample, args.single, args.batch
            )
        with database(args.backend) as url:
            bench_insert(write_config(Path(tmp) / "insert", url, args.settle), args.batch)
        with database(args.backend) as url:
            bench_rescan(
                write_config(Path(tmp) / "rescan", url, args.settle), sample, args.unchanged
            )


if __name__ == "__main__":
    main()
