"""The benchmark scripts still run to their end and print their figures.

Nothing else runs them, and a script left behind by a change stops half way (a call
whose arguments changed) or measures nothing (requests the service now refuses).
Each runs here on a small workload; no figure is judged, only that it was measured.
e2e_bench.py, frames_bench.py and memory_bench.py take minutes, and startup_bench.py
needs the one-file build (test_executable.py makes and runs that).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def test_queue_bench_drains_every_job_it_queued() -> None:
    out = run_benchmark("queue_bench.py", "--jobs", "20", "--samples", "2", "--idle-seconds", "1")
    assert "drain, 2 at a time (20 jobs)" in out
    assert "- drain: 20 jobs in" in out and ", 0 failed;" in out
    for figure in ("enqueue via HTTP (5 jobs)", "idle submit->run() max (2)", "idle RSS"):
        assert figure in out
    assert "exit code 0 after SIGTERM" in out


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_ingest_bench_registers_every_file_it_drops(backend: str) -> None:
    out = run_benchmark(
        "ingest_bench.py", "--backend", backend, "--single", "2", "--batch", "30",
        "--unchanged", "50",
    )  # fmt: skip
    assert "1 file at a time (2 drops)" in out
    assert "30 files written at once" in out and "30 files renamed into place" in out
    assert "bulk insert of 30 new files" in out
    assert "rescan of 50 unchanged files in 1 folders" in out


def test_slow_clients_bench_holds_its_streams_open() -> None:
    out = run_benchmark("slow_clients_bench.py", "--slow", "4", "--streams", "3")
    assert "event streams opened: 3 of 3;" in out
    assert "/api/v1/queue/status" in out


def test_backup_bench_restores_what_it_filled() -> None:
    out = run_benchmark("backup_bench.py", "--jobs", "200")
    assert "backup, writer every 10 ms" in out
    assert "restore (service stopped)" in out and "200 jobs" in out


def test_quality_audio_prints_a_row_for_each_case() -> None:
    out = run_benchmark("quality_audio.py", "--seconds", "16")
    assert out.splitlines()[0].split()[:3] == ["case", "taken", "tracks"]
    for case in ("JFK .m4a", "JFK on track 2", "music only .mp3", "16 s of speech .mp4"):
        assert case in out


def test_asr_bench_shares_one_model_call_between_asr_and_asrx() -> None:
    out = run_benchmark("asr_bench.py", "--seconds", "10", "--repeat", "1")
    assert "overhead ratio (edge RTF / direct RTF):" in out
    assert "(1 model call) vs asr then asrx" in out and "(2 model calls)" in out


def test_search_bench_times_queries_on_both_databases() -> None:
    out = run_benchmark("search_bench.py", "--segments", "1000", "--queries", "40", "--like", "2")
    for database in ("sqlite", "postgres"):
        assert f"{database}: indexing 1,000 segments" in out
    assert out.count("\nall ") == 2 and out.count("LIKE %word% (+count)") == 2
    assert out.count("indexing one hour of footage's results") == 2


def test_meaning_bench_prints_recall_cost_and_scan() -> None:
    out = run_benchmark(
        "meaning_bench.py", "--vectors", "3000", "--databases", "sqlite", "--cost-segments", "30"
    )
    assert out.count("| words |") == out.count("| any word |") == out.count("| meaning |") == 1
    assert "## Embedding cost: 30 segments" in out
    assert "| sqlite | 3,000 |" in out
