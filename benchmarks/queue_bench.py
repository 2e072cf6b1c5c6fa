"""Queue figures: momentry-edge's job table (+ Huey wake-ups) against raw Huey on the same database.

    .venv/bin/python benchmarks/queue_bench.py [--jobs N] [--backend sqlite|postgres]
        [--samples N] [--idle-seconds S]

Measures, in one run: enqueue rate (in-process and over HTTP), drain rate at two
jobs at a time (and, as a bound, with the result documents' flushes skipped), idle
enqueue-to-start latency, and the idle CPU and memory of a
real ``momentry-edge run`` process. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import huey
import peewee
import psutil
import psycopg
from common import PG_ADMIN_URL, running_service, scratch_postgres
from huey import Huey, PostgresHuey, SqliteHuey
from huey.consumer import Consumer

from momentry_edge import config as config_module
from momentry_edge import durable, jobs, outputs, store
from momentry_edge.ingest import paths
from momentry_edge.processors.base import Processor, RunContext
from momentry_edge.service import Service
from momentry_edge.store import Job, MediaFile

ROOT = Path(__file__).resolve().parent.parent
NOOP = ["noop"]
SETTLE_SECONDS = 3.0  # idle time before latency samples and before the CPU window
LATENCY_PAUSE = 1.0  # seconds between latency samples
DRAIN_TIMEOUT = 120.0

# time.monotonic() at which Stamp.run was entered, by file_uuid (its output folder's name).
STAMPS: dict[str, float] = {}


class Stamp(Processor):
    """A no-op processor that records when a worker entered it."""

    name = "stamp"

    def run(self, ctx: RunContext) -> dict[str, Any]:
        STAMPS[ctx.output_dir.name] = time.monotonic()
        return {}


# -- the printed table ---------------------------------------------------------------------------


COLUMNS = ["figure", "momentry-edge", "raw SqliteHuey", "edge/huey"]


@dataclass
class Row:
    figure: str
    edge: str
    raw: str
    ratio: str


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: str, edge: float, raw: float | None, unit: str, digits: int = 0) -> None:
        raw_text = "-" if raw is None else f"{raw:,.{digits}f} {unit}"
        ratio = f"{edge / raw:.2f}" if raw else "-"
        self.rows.append(Row(figure, f"{edge:,.{digits}f} {unit}", raw_text, ratio))

    def print(self, header: str) -> None:
        table = [astuple(row) for row in (Row(*COLUMNS), *self.rows)]
        widths = [max(map(len, column)) for column in zip(*table, strict=True)]
        print(header)
        for figure, *figures in table:
            cells = [c.rjust(w) for c, w in zip(figures, widths[1:], strict=True)]
            print("  ".join([figure.ljust(widths[0]), *cells]))
        for note in self.notes:
            print(f"- {note}")


@dataclass(frozen=True)
class Rate:
    per_second: float
    cpu_ms: float  # process CPU time (every thread) per job: less sensitive to other load


def timed(body: Callable[[], int]) -> Rate:
    """Run ``body`` (which returns how many jobs it handled) and rate it."""
    cpu, start = time.process_time(), time.perf_counter()
    count = body()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Rate(count / wall, 1000 * cpu / max(count, 1))


class ServerCpu:
    """CPU seconds of the PostgreSQL backends serving one database on a local server.

    On PostgreSQL part of each job's cost is in the server's processes, which the
    service's own CPU time leaves out; this measures that part.
    """

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.name = database_url.rsplit("/", 1)[1]
        self.peak_connections = 0  # the most backends seen on the database at a snapshot

    @classmethod
    def for_url(cls, database_url: str) -> ServerCpu | None:
        host = urlparse(database_url).hostname
        return cls(database_url) if host in ("127.0.0.1", "localhost", "::1") else None

    def snapshot(self) -> dict[int, float]:
        seconds = {}
        for pid in self._backends():
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                seconds[pid] = times.user + times.system
        self.peak_connections = max(self.peak_connections, len(seconds))
        return seconds

    def _backends(self, attempts: int = 20) -> list[int]:
        """Backend pids; retried while the server is out of connection slots."""
        for attempt in range(attempts):
            try:
                with psycopg.connect(self.database_url) as conn:
                    rows = conn.execute(
                        "SELECT pid FROM pg_stat_activity"
                        " WHERE datname = %s AND pid <> pg_backend_pid()",
                        (self.name,),
                    ).fetchall()
                return [pid for (pid,) in rows]
            except psycopg.OperationalError:  # "too many clients" while others run tests
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)
        return []

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        """Seconds between two snapshots; a backend that started in between counts whole."""
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


# -- momentry-edge in-process ----------------------------------------------------------------------


def toml(settings: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        # JSON strings, numbers, booleans and arrays are valid TOML values.
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def write_config(
    root: Path,
    database_url: str,
    name: str,
    *,
    node_id: str,
    queue: dict[str, Any],
    plugins: tuple[str, ...] = (),
) -> Path:
    """A momentry.toml under ``root`` (data dir, drop folder, port 0); returns its path."""
    (root / "drop").mkdir(parents=True, exist_ok=True)
    settings = {
        "service": {
            "data_dir": str(root / "data"),
            "watch": [str(root / "drop")],
            "port": 0,
            "database_url": database_url,
            "plugins": list(plugins),
            "node_id": node_id,
        },
        "queue": queue,
        # The queue alone: no model pull beside it (a fresh data dir would start one).
        "models": {"auto_pull": False},
    }
    path = root / name
    path.write_text(toml(settings), encoding="utf-8")
    return path


def bench_config(root: Path, database_url: str, *, workers: bool) -> config_module.Config:
    queue = {"max_concurrent": 2, "dynamic_concurrency": False, "worker_enabled": workers}
    name = f"bench-workers-{'on' if workers else 'off'}.toml"
    plugins = ("workloads:Noop", "queue_bench:Stamp")
    path = write_config(
        root, database_url, name, node_id="queue-bench", queue=queue, plugins=plugins
    )
    return config_module.load(path, env={})


def add_files(folder: Path, count: int, prefix: str) -> list[MediaFile]:
    """``count`` MediaFile rows (one per job, so nothing deduplicates); no file on disk.

    ``folder`` must not be a watched folder: the watcher would mark the rows missing.
    """
    now = time.time()
    rows = []
    for i in range(count):
        path = folder / f"{prefix}-{i:06d}.mp4"
        rows.append(
            {
                "file_uuid": paths.file_uuid_for(path),
                "path": str(path),
                "watch_root": str(folder),
                "rel_path": path.name,
                "name": path.name,
                "state": store.FileState.PRESENT,
                "registered_at": now,
                "updated_at": now,
            }
        )
    with MediaFile._meta.database.atomic():
        for chunk in peewee.chunked(rows, 200):
            MediaFile.insert_many(chunk).execute()
    return list(MediaFile.select().where(MediaFile.name.startswith(prefix)).order_by(MediaFile.id))


def count_jobs(*statuses: str) -> int:
    return Job.select().where(Job.status.in_(statuses)).count()


# -- raw Huey ------------------------------------------------------------------------------------


class QuietConsumer(Consumer):
    """A consumer started from the main thread of a process that keeps its own signals."""

    def _set_signal_handlers(self) -> None:
        pass


class RawHuey:
    """Raw Huey with default settings (SqliteHuey on a file, or PostgresHuey), a no-op task
    and a stamping task."""

    def __init__(self, huey: Huey) -> None:
        self.huey = huey
        self._done = itertools.count(1)
        self.completed = 0
        self.stamps: dict[str, float] = {}
        self.noop = self.huey.task(name="noop")(self._noop)
        self.stamp = self.huey.task(name="stamp")(self._stamp)
        self.document = self.huey.task(name="document")(self._document)

    def _noop(self) -> None:
        self.completed = next(self._done)  # next() on itertools.count is atomic under the GIL

    def _document(self, folder: str) -> None:
        """What a no-op job leaves besides its queue rows: a result document in a folder of
        its own, written as the service writes one (temp file, fsync, rename)."""
        document = {"processor": "noop", "status": "completed", "task_id": folder, "result": {}}
        outputs.write_json_atomic(outputs.document_path(Path(folder), "noop"), document)
        self.completed = next(self._done)

    def _stamp(self, key: str) -> None:
        self.stamps[key] = time.monotonic()

    @contextlib.contextmanager
    def consumer(self, **polling: float) -> Iterator[Consumer]:
        consumer = QuietConsumer(self.huey, workers=2, **polling)
        consumer.start()
        try:
            yield consumer
        finally:
            consumer.stop(graceful=True)


# -- 1. enqueue ----------------------------------------------------------------------------------


def enqueue_edge(files: list[MediaFile], max_retries: int) -> Rate:
    def body() -> int:
        for record in files:
            jobs.submit(record, NOOP, max_retries=max_retries)
        return len(files)

    return timed(body)


def enqueue_raw(raw: RawHuey, count: int) -> Rate:
    def body() -> int:
        for _ in range(count):
            raw.noop()
        return count

    return timed(body)


def enqueue_http(service: Service, files: list[MediaFile]) -> Rate:
    """Sequential POSTs on one keep-alive connection, as a client queuing a batch would."""
    with httpx.Client(base_url=service.url, timeout=30) as client:

        def body() -> int:
            for record in files:
                reply = client.post(
                    f"/api/v1/file/{record.file_uuid}/deep-scan", json={"processors": NOOP}
                )
                if reply.status_code != 202:
                    raise RuntimeError(f"deep-scan: {reply.status_code} {reply.text}")
            return len(files)

        return timed(body)


# -- 2. drain ------------------------------------------------------------------------------------


@dataclass
class Drain:
    rate: Rate
    done: int
    failed: int
    seconds: float
    startup_ms: float  # Service.start() alone
    job_ms: float  # mean started_at -> completed_at of one job
    in_flight: float  # mean jobs between started_at and completed_at (Little's law)
    two_after: float | None  # seconds from start until two jobs first overlapped
    server_ms: float | None  # PostgreSQL server CPU per job


def drain_edge(cfg: config_module.Config, count: int, server: ServerCpu | None) -> Drain:
    """From Service.start() (which starts the workers) until ``count`` jobs are final."""
    final = (store.JobStatus.COMPLETED, store.JobStatus.PARTIAL, store.JobStatus.FAILED)
    # Jobs an earlier drain ended are not counted (the database stays open after a Service).
    ended_before, failed_before = count_jobs(*final), count_jobs(*final[1:])
    server_before = server.snapshot() if server else {}
    server_used: float | None = None
    wall_start = time.time()
    cpu, start = time.process_time(), time.perf_counter()
    with running_service(cfg):
        startup_ms = 1000 * (time.perf_counter() - start)
        finished = 0
        while finished < count and time.perf_counter() - start < DRAIN_TIMEOUT:
            time.sleep(0.05)
            finished = count_jobs(*final) - ended_before
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if server:  # while the workers' connections are still open
            server_used = ServerCpu.used(server_before, server.snapshot())
    spans = list(
        Job.select(Job.started_at, Job.completed_at)
        .where(Job.completed_at >= wall_start, Job.started_at.is_null(False))
        .tuples()
    )
    busy = sum(end - begin for begin, end in spans)
    two = first_overlap(spans)
    return Drain(
        rate=Rate(finished / seconds, 1000 * cpu / max(finished, 1)),
        done=finished,
        failed=count_jobs(*final[1:]) - failed_before,
        seconds=seconds,
        startup_ms=startup_ms,
        job_ms=1000 * busy / max(len(spans), 1),
        in_flight=busy / seconds,
        two_after=None if two is None else two - wall_start,
        server_ms=None if server_used is None else 1000 * server_used / max(finished, 1),
    )


def first_overlap(spans: list[tuple[float, float]]) -> float | None:
    """The first moment two of the (start, end) spans were running at once."""
    busy_until = None
    for begin, end in sorted(spans):
        if busy_until is not None and begin < busy_until:
            return begin
        busy_until = end if busy_until is None else max(busy_until, end)
    return None


def drain_raw(raw: RawHuey, count: int) -> Rate:
    """In-process consumer, 2 thread workers, polling every 0.01..0.1 s."""
    raw.completed = 0
    raw._done = itertools.count(1)
    cpu, start = time.process_time(), time.perf_counter()
    with raw.consumer(initial_delay=0.01, max_delay=0.1):
        while raw.completed < count and time.perf_counter() - start < DRAIN_TIMEOUT:
            time.sleep(0.005)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return Rate(raw.completed / seconds, 1000 * cpu / max(raw.completed, 1))


# -- 3. idle latency ------------------------------------------------------------------------------


def sample_latency(
    submit: Callable[[int], str], stamps: dict[str, float], samples: int
) -> list[float]:
    """Seconds from submit returning to the task body starting, one job at a time."""
    time.sleep(SETTLE_SECONDS)
    latencies = []
    for i in range(samples):
        key = submit(i)
        returned = time.monotonic()
        deadline = returned + 30
        while key not in stamps and time.monotonic() < deadline:
            time.sleep(0.0005)
        latencies.append(stamps.get(key, deadline) - returned)
        time.sleep(LATENCY_PAUSE)
    return latencies


def latency_edge(cfg: config_module.Config, files: list[MediaFile]) -> list[float]:
    """Through Service.submit (what the API and the watcher call), stamped in run()."""
    with running_service(cfg) as service:

        def submit(i: int) -> str:
            service.submit(files[i], ["stamp"], "normal")
            return files[i].file_uuid

        return sample_latency(submit, STAMPS, len(files))


def latency_raw(raw: RawHuey, samples: int) -> list[float]:
    """Huey's default polling: 0.1 s, x1.15 per empty poll, at most 10 s."""
    with raw.consumer():

        def submit(i: int) -> str:
            raw.stamp(f"s{i}")
            return f"s{i}"

        return sample_latency(submit, raw.stamps, samples)


# -- 4. idle process -------------------------------------------------------------------------------


@dataclass
class Idle:
    cpu_percent: float
    rss_mib: float
    threads: int
    server_percent: float | None = None  # its PostgreSQL backends
    exit_code: int | None = None


def idle_process(root: Path, database_url: str, server: ServerCpu | None, window: float) -> Idle:
    """`momentry-edge run` with default queue settings, idle: CPU over ``window`` s, RSS."""
    config_path = write_config(
        root, database_url, "idle.toml", node_id="queue-bench-idle", queue={}
    )
    log_path = root / "idle.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "momentry_edge.cli", "--config", str(config_path), "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_run_file(proc, root / "data" / "run.json", log_path)
        time.sleep(SETTLE_SECONDS)
        ps = psutil.Process(proc.pid)
        server_before = server.snapshot() if server else {}
        before, start = ps.cpu_times(), time.monotonic()
        time.sleep(window)
        after, wall = ps.cpu_times(), time.monotonic() - start
        busy = (after.user + after.system) - (before.user + before.system)
        idle = Idle(100 * busy / wall, ps.memory_info().rss / 2**20, ps.num_threads())
        if server:
            idle.server_percent = 100 * ServerCpu.used(server_before, server.snapshot()) / wall
        proc.send_signal(signal.SIGTERM)
        idle.exit_code = proc.wait(timeout=60)
        return idle
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for_run_file(
    proc: subprocess.Popen[bytes], run_file: Path, log: Path, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"momentry-edge run exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads(run_file.read_text())["pid"] == proc.pid:
                return
        time.sleep(0.05)
    raise RuntimeError(f"no {run_file} after {timeout} s")


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Bench:
    n: int
    tmp: Path
    database_url: str
    raw: RawHuey
    edge_off: config_module.Config  # workers disabled: enqueue only
    edge_on: config_module.Config
    server: ServerCpu | None  # PostgreSQL only
    samples: int  # idle latency samples
    idle_seconds: float  # the idle process's CPU window
    report: Report = field(default_factory=Report)
    raw_enqueue: Rate | None = None

    @property
    def files(self) -> Path:
        return self.tmp / "unwatched"  # where the benchmark's file rows say they are

    def server_snapshot(self) -> dict[int, float]:
        return self.server.snapshot() if self.server else {}

    def add_server_cpu(self, figure: str, before: dict[int, float], count: int) -> None:
        if self.server is not None:
            used = ServerCpu.used(before, self.server.snapshot())
            self.report.add(figure, 1000 * used / count, None, "ms", 2)


def measure_enqueue(b: Bench) -> None:
    """N jobs.submit calls against N raw Huey enqueues, no workers running."""
    raw = b.raw_enqueue = enqueue_raw(b.raw, b.n)
    with running_service(b.edge_off):
        files = add_files(b.files, b.n, "direct")
        before = b.server_snapshot()
        edge = enqueue_edge(files, b.edge_off.queue.max_retries)
        b.report.add(f"enqueue in-process ({b.n} jobs)", edge.per_second, raw.per_second, "jobs/s")
        b.report.add("  CPU per enqueue", edge.cpu_ms, raw.cpu_ms, "ms", 2)
        b.add_server_cpu("  + PostgreSQL server CPU", before, b.n)


def measure_drain(b: Bench) -> None:
    """Drain the N queued jobs at two at a time on both sides; then raw Huey again, each
    task writing the result document a no-op job writes here."""
    edge = drain_edge(b.edge_on, b.n, b.server)
    raw = drain_raw(b.raw, b.n)
    b.report.add(f"drain, 2 at a time ({b.n} jobs)", edge.rate.per_second, raw.per_second, "jobs/s")
    b.report.add("  CPU per job", edge.rate.cpu_ms, raw.cpu_ms, "ms", 2)
    results = b.tmp / "raw-results"
    for i in range(b.n):
        b.raw.document(str(results / f"{i:06d}"))
    documented = drain_raw(b.raw, b.n)
    b.report.add(
        "  against raw + a result document", edge.rate.per_second, documented.per_second, "jobs/s"
    )
    b.report.add("  CPU per job", edge.rate.cpu_ms, documented.cpu_ms, "ms", 2)
    bound = drain_without_flushes(b)
    b.report.add("  bound: no document flushes", bound.rate.per_second, raw.per_second, "jobs/s")
    b.report.add("  CPU per job", bound.rate.cpu_ms, raw.cpu_ms, "ms", 2)
    if edge.server_ms is not None:
        b.report.add("  + PostgreSQL server CPU", edge.server_ms, None, "ms", 2)
    two = "never" if edge.two_after is None else f"{edge.two_after:.1f} s after start"
    b.report.notes.append(
        f"drain: {edge.done} jobs in {edge.seconds:.1f} s, {edge.failed} failed;"
        f" Service.start() {edge.startup_ms:.0f} ms; {edge.job_ms:.1f} ms per job from"
        f" started_at to completed_at; {edge.in_flight:.2f} jobs in flight on average;"
        f" two jobs first overlapped {two}"
    )


def drain_without_flushes(b: Bench) -> Drain:
    """N more jobs drained with the result documents' flushes skipped (the database's
    own stay): what the drain could reach were documents not made durable before their
    run's commit. A bound to judge that trade by, not a setting the service has."""
    with running_service(b.edge_off):
        files = add_files(b.files, b.n, "unflushed")
        enqueue_edge(files, b.edge_off.queue.max_retries)
    flush, flush_folder = durable.flush, durable.flush_folder
    durable.flush = durable.flush_folder = lambda _: None  # type: ignore[assignment]
    try:
        return drain_edge(b.edge_on, b.n, b.server)
    finally:
        durable.flush, durable.flush_folder = flush, flush_folder


def measure_http(b: Bench) -> None:
    """N/4 deep-scan POSTs into a queue holding the N finished jobs (history), no workers."""
    count = max(b.n // 4, 1)
    assert b.raw_enqueue is not None
    raw = b.raw_enqueue
    with running_service(b.edge_off) as service:
        history = Job.select().count()
        files = add_files(b.files, count, "http")
        before = b.server_snapshot()
        edge = enqueue_http(service, files)
        b.report.add(f"enqueue via HTTP ({count} jobs)", edge.per_second, raw.per_second, "jobs/s")
        b.report.add("  CPU per request (both ends)", edge.cpu_ms, raw.cpu_ms, "ms", 2)
        b.add_server_cpu("  + PostgreSQL server CPU", before, count)
        jobs.clear()  # out of the way of the latency samples
    b.report.notes.append(
        f"HTTP: POST /api/v1/file/{{uuid}}/deep-scan, one httpx client in the same process,"
        f" sequential; {history} finished jobs in the table, backlog growing to {count};"
        " compared with raw Huey's in-process enqueue"
    )


def measure_latency(b: Bench) -> None:
    """Idle: submit -> the processor's run() entered, one job at a time."""
    with running_service(b.edge_off):
        files = add_files(b.files, b.samples, "stamp")
    edge = latency_edge(b.edge_on, files)
    raw = latency_raw(b.raw, b.samples)
    for label, pick in (("median", statistics.median), ("max", max)):
        figure = f"idle submit->run() {label} ({b.samples})"
        b.report.add(figure, 1000 * pick(edge), 1000 * pick(raw), "ms", 1)
    b.report.notes.append(
        f"latency: {SETTLE_SECONDS:.0f} s idle, then one job per ~{LATENCY_PAUSE:.0f} s;"
        " momentry-edge through Service.submit (the API's path); raw Huey with its default"
        " polling (0.1 s x1.15 up to 10 s), which after 70 s idle the huey-probe note"
        " measured at 6.3 s median, 9.7 s max"
    )


def measure_idle(b: Bench) -> None:
    """A real `momentry-edge run` process doing nothing."""
    idle = idle_process(b.tmp, b.database_url, b.server, b.idle_seconds)
    b.report.add(
        f"idle CPU, momentry-edge run ({b.idle_seconds:g} s)", idle.cpu_percent, None, "%", 2
    )
    if idle.server_percent is not None:
        b.report.add("  + its PostgreSQL backends", idle.server_percent, None, "%", 2)
    b.report.add("idle RSS, momentry-edge run", idle.rss_mib, None, "MiB", 1)
    b.report.notes.append(
        f"idle process: no plugins, default queue settings, {idle.threads} threads,"
        f" exit code {idle.exit_code} after SIGTERM"
    )


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Progress on stderr, so a long run shows where it is."""
    start = time.perf_counter()
    print(f"{name} ...", end="", file=sys.stderr, flush=True)
    yield
    print(f" {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def header(backend: str, database_url: str, load_before: float) -> str:
    versions = [
        f"{os.cpu_count()} cores",
        f"Python {platform.python_version()}",
        f"SQLite {sqlite3.sqlite_version}",
        f"Huey {huey.__version__}",
        f"peewee {peewee.__version__}",
    ]
    if backend == "postgres":
        with psycopg.connect(database_url) as conn:
            versions.append(f"PostgreSQL {conn.execute('SHOW server_version').fetchone()[0]}")
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (
        f"machine: {', '.join(versions)}; load average {load_before:.1f} at start,"
        f" {os.getloadavg()[0]:.1f} at end\n"
        f"momentry-edge {revision or '?'} on {backend}; raw Huey: {COLUMNS[2].split()[1]}, defaults"
    )


def raw_huey(backend: str, database_url: str, tmp: Path) -> Huey:
    """Like for like: SqliteHuey beside SQLite, Huey's own PostgresHuey beside PostgreSQL."""
    if backend == "postgres":
        COLUMNS[2] = "raw PostgresHuey"
        return PostgresHuey("bench", dsn=database_url)
    return SqliteHuey("bench", filename=str(tmp / "huey.db"))


def run(args: argparse.Namespace, database_url: str, tmp: Path) -> None:
    load_before, backend = os.getloadavg()[0], args.backend
    bench = Bench(
        n=args.jobs,
        tmp=tmp,
        database_url=database_url,
        raw=RawHuey(raw_huey(backend, database_url, tmp)),
        edge_off=bench_config(tmp, database_url, workers=False),
        edge_on=bench_config(tmp, database_url, workers=True),
        server=ServerCpu.for_url(database_url) if backend == "postgres" else None,
        samples=args.samples,
        idle_seconds=args.idle_seconds,
    )
    for step in (measure_enqueue, measure_drain, measure_http, measure_latency, measure_idle):
        with phase(step.__name__.removeprefix("measure_")):
            step(bench)
    storage = "PostgreSQL" if backend == "postgres" else "SQLite as it sets it (WAL, FULL sync)"
    if bench.server is not None:
        bench.report.notes.append(
            f"PostgreSQL: up to {bench.server.peak_connections} connections to the run's"
            " database seen at once (a pool of up to 16 per service process)"
        )
    bench.report.notes.append(
        "momentry-edge: max_concurrent 2, dynamic_concurrency false, worker_threads 8,"
        f" {storage}, log level info to its log file; raw drain: 2 thread workers polling"
        " 0.01..0.1 s; CPU = this process's CPU time (all threads) per job"
    )
    bench.report.print(header(backend, database_url, load_before))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per rate figure")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pg-url", default=PG_ADMIN_URL, help="server to create a database on")
    parser.add_argument("--samples", type=int, default=15, help="idle latency samples")
    parser.add_argument(
        "--idle-seconds", type=float, default=20.0, help="the idle process's CPU window"
    )
    args = parser.parse_args(argv)
    # The service loads plugins by module name: Noop from tests/, Stamp from this file.
    sys.path.insert(0, str(ROOT / "tests"))
    sys.modules.setdefault("queue_bench", sys.modules[__name__])
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as tmp:
        if args.backend == "postgres":
            with scratch_postgres(args.pg_url) as url:
                run(args, url, Path(tmp))
        else:
            run(args, "", Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
