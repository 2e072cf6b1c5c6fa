"""Dynamic concurrency follows machine load one step at a time, with hysteresis."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from momentry_edge.config import QueueConfig
from momentry_edge.events import bus
from momentry_edge.worker.gate import Gate, Load, parse_ioreg_utilisation

HOT = Load(cpu_percent=95.0, memory_percent=40.0, gpu_percent=None)
WARM = Load(cpu_percent=75.0, memory_percent=40.0, gpu_percent=None)  # inside the band
COOL = Load(cpu_percent=20.0, memory_percent=40.0, gpu_percent=None)


def drive(
    gate: Gate, loads: list[Load], max_concurrent: int = 4, dynamic: bool = True
) -> list[int]:
    limits = []
    for t, load in enumerate(loads):
        gate.observe(load, max_concurrent, now=t * 10.0)
        limits.append(gate.effective_limit(max_concurrent, dynamic))
    return limits


def test_limit_steps_down_under_load_and_back_up_when_cool():
    gate = Gate(QueueConfig(max_concurrent=4, cpu_threshold=80.0))
    limits = drive(gate, [HOT] * 6 + [COOL] * 6)
    # Down one job per step, never below one; CPU is averaged over three samples, so the
    # first cool sample still reads 70% and holds; then up one per step to max_concurrent.
    assert limits == [3, 2, 1, 1, 1, 1, 1, 2, 3, 4, 4, 4]


def test_load_inside_the_hysteresis_band_holds_the_limit():
    gate = Gate(QueueConfig(max_concurrent=4, cpu_threshold=80.0))
    limits = drive(gate, [HOT] * 9 + [WARM] * 10)
    assert limits[9:] == [limits[8]] * 10, "75% CPU neither lowers nor raises it"


def test_memory_and_gpu_pressure_count_too():
    gate = Gate(QueueConfig(max_concurrent=3, memory_threshold=80.0, gpu_threshold=90.0))
    mem = Load(cpu_percent=10.0, memory_percent=92.0, gpu_percent=None)
    assert drive(gate, [mem] * 12)[-1] == 1
    gate = Gate(QueueConfig(max_concurrent=3))
    gpu = Load(cpu_percent=10.0, memory_percent=10.0, gpu_percent=99.0)
    assert drive(gate, [gpu] * 12)[-1] == 1


def test_static_limit_and_pause_ignore_load():
    gate = Gate(QueueConfig(max_concurrent=4))
    assert drive(gate, [HOT] * 10, dynamic=False)[-1] == 4
    assert gate.effective_limit(4, dynamic=True, paused=True) == 0
    assert gate.effective_limit(4, dynamic=True) == 1


def test_steps_are_spaced_in_time():
    gate = Gate(QueueConfig(max_concurrent=4), step_seconds=6.0)
    for t in (0.0, 1.0, 2.0, 3.0):  # four hot samples within six seconds
        gate.observe(HOT, 4, now=t)
    assert gate.effective_limit(4, dynamic=True) == 3


def test_apple_gpu_utilisation_is_read_from_ioreg_output():
    sample = """
    | "PerformanceStatistics" = {"In use system memory"=123,"Device Utilization %"=37,
    |   "Renderer Utilization %"=35,"Tiler Utilization %"=12}
    """
    assert parse_ioreg_utilisation(sample) == 37.0
    assert parse_ioreg_utilisation("no accelerator here") is None


def test_disk_guard_blocks_admission_and_says_why(tmp_path):
    gate = Gate(QueueConfig(min_free_disk_mb=10**9))  # the most it takes: 1 PB
    reason = gate.check_disk(tmp_path)
    assert reason and "low disk space" in reason and "queue.min_free_disk_mb" in reason
    assert gate.effective_limit(4, dynamic=False) == 0
    gate = Gate(QueueConfig(min_free_disk_mb=0))
    assert gate.check_disk(tmp_path) is None
    assert gate.effective_limit(4, dynamic=False) == 4


def test_disk_guard_says_when_it_lifts(tmp_path):
    """queue.blocked once when a full disk holds jobs back, queue.unblocked once when it
    no longer does (the workers wake on it). Two disks stand in for one filling and emptying."""
    small, large = sorted((Path("/dev/shm"), tmp_path), key=lambda p: shutil.disk_usage(p).free)
    free = [shutil.disk_usage(p).free / 2**20 for p in (small, large)]
    if not small.is_dir() or free[1] - free[0] < 100:
        pytest.skip("needs two filesystems with different free space")
    gate = Gate(QueueConfig(min_free_disk_mb=(free[0] + free[1]) / 2))
    with bus.subscribe() as events:
        assert gate.check_disk(small) and gate.check_disk(small)
        assert gate.check_disk(large) is None and gate.check_disk(large) is None
        seen = [events.get_nowait()["type"] for _ in range(events.qsize())]
    assert seen == ["queue.blocked", "queue.unblocked"]
    assert gate.effective_limit(4, dynamic=False) == 4


def test_running_jobs_that_hold_every_core_hold_back_further_jobs():
    gate = Gate(QueueConfig(max_concurrent=4), cores=4)
    assert gate.effective_limit(4, dynamic=True, threads=[]) == 4
    assert gate.effective_limit(4, dynamic=True, threads=[2, 1]) == 4  # 3 of 4 cores
    assert gate.effective_limit(4, dynamic=True, threads=[2, 2]) == 2  # full: those two
    assert gate.effective_limit(4, dynamic=True, threads=[8]) == 1
    assert gate.effective_limit(4, dynamic=True, threads=[1] * 4) == 4  # one each: 4 jobs
    assert gate.effective_limit(2, dynamic=True, threads=[1]) == 2  # max_concurrent caps
    # Without dynamic concurrency max_concurrent alone decides; a pause stops everything.
    assert gate.effective_limit(4, dynamic=False, threads=[4, 4]) == 4
    assert gate.effective_limit(4, dynamic=True, paused=True, threads=[1]) == 0


def test_the_thread_rule_and_the_load_limit_both_apply():
    gate = Gate(QueueConfig(max_concurrent=4, cpu_threshold=80.0), cores=4)
    drive(gate, [HOT] * 2)  # the load limit steps down to 2
    assert gate.effective_limit(4, dynamic=True, threads=[1]) == 2
    assert gate.effective_limit(4, dynamic=True, threads=[4]) == 1
