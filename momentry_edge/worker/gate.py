"""The concurrency gate: how many jobs may run here now."""

# effective limit = 0 when paused, else min(max_concurrent, what the machine's
# load allows). With dynamic concurrency the load limit steps down one job while
# CPU, memory or GPU is over its threshold and back up one job once all are
# comfortably under it (a hysteresis band), at most once per ``step_seconds``, so
# it follows load without flapping.
#
# With dynamic concurrency a job also counts for the threads it runs on (its
# parts side by side, ``queue.job_threads``), not as one: while the jobs running
# here hold as many threads as the machine has cores, the limit is the number
# running, so no further job starts until one ends or gives threads back. One job
# can always run; ``max_concurrent`` stays the hard cap. Without dynamic
# concurrency ``max_concurrent`` alone decides.

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..config import QueueConfig
from ..events import bus

HYSTERESIS = 10.0  # percentage points under a threshold before adding a job back
# A queue database's full disk is said in the log at most this often while it lasts.
DATABASE_FULL_SAID_EVERY = 60.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Load:
    cpu_percent: float
    memory_percent: float
    gpu_percent: float | None


def read_gpu_percent(system: str | None = None) -> float | None:
    """GPU utilisation where the platform exposes it without privileges; None elsewhere."""
    system = system or platform.system()
    try:
        if system == "Darwin":
            out = subprocess.run(
                ["ioreg", "-r", "-d", "1", "-c", "IOAccelerator"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            ).stdout
            return parse_ioreg_utilisation(out)
        if shutil.which("nvidia-smi"):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=2,
                check=False,
            ).stdout
            values = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]
            return max(values) if values else None
    except (OSError, subprocess.SubprocessError):
        return None
    return None


def parse_ioreg_utilisation(text: str) -> float | None:
    """Apple silicon reports ``"Device Utilization %"=NN`` among IOAccelerator's statistics."""
    values = [float(m) for m in re.findall(r'"Device Utilization %"\s*=\s*(\d+)', text)]
    return max(values) if values else None


class Gate:
    def __init__(
        self, queue: QueueConfig, step_seconds: float = 6.0, cores: int | None = None
    ) -> None:
        self._queue = queue
        self.cores = cores or os.cpu_count() or 1
        self._step_seconds = step_seconds
        self._lock = threading.Lock()
        self._samples: deque[Load] = deque(maxlen=3)
        self._load_limit: int | None = None  # None until the first sample
        self._last_step = float("-inf")
        self._gpu_readable = True
        self._blocked: str | None = None  # why nothing may start, besides a pause
        # Why nothing may start while the queue database cannot be written (its disk is
        # full), set when a write finds it so and cleared once one gets through.
        self._database_full: str | None = None
        self._database_full_said = float("-inf")
        psutil.cpu_percent(None)  # primes the counter; the first real reading comes later

    def check_disk(self, *folders: Path) -> str | None:
        """Stop admitting jobs while the disk of any of ``folders`` (each may be a disk of
        its own) has less free space than ``queue.min_free_disk_mb`` or fewer free inodes
        than ``queue.min_free_inodes``. One not made yet is skipped: it will be made on a
        disk of another."""
        reason = None
        for folder in folders:
            try:
                reason = disk_shortage(folder, self._queue)
            except FileNotFoundError:
                continue
            if reason is not None:
                break
        with self._lock:
            was = self._blocked
            self._blocked = reason
        # Once per blocking and once when it lifts, not at every check.
        if reason is not None and was is None:
            bus.publish("queue.blocked", reason=reason)
        elif reason is None and was is not None:
            bus.publish("queue.unblocked")  # the jobs it held back may start now
        return reason

    def database_full(self, error: BaseException, folder: Path | None = None) -> None:
        """A write to the queue database failed because its disk is full: nothing starts
        until one gets through again (``database_writable``). ``folder``: where the
        database is, when it is a file here (SQLite)."""
        detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if folder is not None:
            with contextlib.suppress(OSError):
                free_mb = shutil.disk_usage(folder).free / 2**20
                detail += f"; {free_mb:,.1f} MB free for {folder}"
        reason = f"the queue database's disk is full ({detail}); free some space on it"
        if folder is not None:
            # Below the free-space floor the floor is named, as check_disk names it: it
            # says which setting holds starts back, whichever notices first.
            with contextlib.suppress(OSError):
                reason = disk_shortage(folder, self._queue) or reason
        now = time.monotonic()
        with self._lock:
            was, self._database_full = self._database_full, reason
            say = now - self._database_full_said >= DATABASE_FULL_SAID_EVERY
            if say:
                self._database_full_said = now
        if say:
            log.error("%s; no job starts meanwhile", reason)
        if was is None:
            bus.publish("queue.blocked", reason=reason)

    def database_writable(self) -> None:
        """A write to the queue database got through: starts may go on (if nothing else
        holds them back)."""
        with self._lock:
            was, self._database_full = self._database_full, None
            self._database_full_said = float("-inf")
        if was is not None:
            log.warning("the queue database can be written again; jobs start again")
            bus.publish("queue.unblocked")

    @property
    def blocked_reason(self) -> str | None:
        with self._lock:
            return self._database_full or self._blocked

    def sample(self, max_concurrent: int) -> Load:
        """Read the machine's load and move the load limit one step if needed."""
        gpu = read_gpu_percent() if self._gpu_readable else None
        self._gpu_readable = gpu is not None  # don't spawn a probe that never answers
        load = Load(psutil.cpu_percent(None), psutil.virtual_memory().percent, gpu)
        self.observe(load, max_concurrent)
        return load

    def observe(self, load: Load, max_concurrent: int, now: float | None = None) -> None:
        with self._lock:
            self._samples.append(load)
            self._step(max_concurrent, _now(now))

    def _step(self, max_concurrent: int, now: float) -> None:
        limit = min(self._load_limit or max_concurrent, max_concurrent)
        self._load_limit = limit
        if now - self._last_step < self._step_seconds:
            return
        cpu = sum(s.cpu_percent for s in self._samples) / len(self._samples)
        mem = self._samples[-1].memory_percent
        gpu = self._samples[-1].gpu_percent
        q = self._queue
        over = (
            cpu > q.cpu_threshold
            or mem > q.memory_threshold
            or (gpu is not None and gpu > q.gpu_threshold)
        )
        under = (
            cpu < q.cpu_threshold - HYSTERESIS
            and mem < q.memory_threshold - HYSTERESIS
            and (gpu is None or gpu < q.gpu_threshold - HYSTERESIS)
        )
        if over and limit > 1:
            self._load_limit = limit - 1
            self._last_step = now
        elif under and limit < max_concurrent:
            self._load_limit = limit + 1
            self._last_step = now

    @property
    def load(self) -> Load | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    def effective_limit(
        self,
        max_concurrent: int,
        dynamic: bool,
        paused: bool = False,
        threads: Sequence[int] = (),
    ) -> int:
        """How many jobs may run here at once now; ``threads``: what each job running
        here holds (see the module docstring)."""
        if paused:
            return 0
        with self._lock:
            if self._blocked or self._database_full:
                return 0
            if not dynamic:
                return max_concurrent
            limit = min(max_concurrent, self._load_limit or max_concurrent)
        if sum(threads) >= self.cores:
            limit = min(limit, len(threads))  # the cores are taken: none further for now
        return max(1, limit)


def disk_shortage(folder: Path, queue: QueueConfig) -> str | None:
    """Why the disk of ``folder`` is too full for a job to start, or None."""
    need_mb = queue.min_free_disk_mb
    free_mb = shutil.disk_usage(folder).free / 2**20
    if free_mb < need_mb:
        return (
            f"low disk space: {free_mb:,.0f} MB free for {folder}, "
            f"below queue.min_free_disk_mb = {need_mb:,.0f} MB"
        )
    stats = os.statvfs(folder)
    # f_files is 0 where the filesystem has no fixed number of inodes (btrfs, ZFS...).
    if stats.f_files and stats.f_favail < queue.min_free_inodes:
        return (
            f"low on inodes: {stats.f_favail:,} free of {stats.f_files:,} for {folder}, "
            f"below queue.min_free_inodes = {queue.min_free_inodes:,}"
        )
    return None


def disk_space(config: Any, *folders: Path) -> list[dict[str, Any]]:
    """Free space of each folder's disk (one entry a disk), and the floor below which no
    job starts (``queue.min_free_disk_mb``): what an operator sees beside a block."""
    seen: dict[int, dict[str, Any]] = {}
    for folder in folders:
        try:
            device, usage = os.stat(folder).st_dev, shutil.disk_usage(folder)
        except OSError:
            continue
        seen.setdefault(
            device,
            {
                "folder": str(folder),
                "free_mb": round(usage.free / 2**20),
                "total_mb": round(usage.total / 2**20),
                "min_free_mb": config.queue.min_free_disk_mb,
            },
        )
    return list(seen.values())


def _now(now: float | None) -> float:
    return time.monotonic() if now is None else now
