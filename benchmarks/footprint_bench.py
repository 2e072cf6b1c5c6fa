"""What a process costs to start: CPU seconds and memory of `momentry-edge run` from exec
to serving and stopping, and CPU seconds of a CLI command (`--help`, `status`).

run, default: a service on an empty data dir with the default settings (every processor);
run, as the tests: the settings tests/conftest.py's ServiceProcess writes (its test
processors from tests/workloads.py). CPU is the child's user+system time from exec to
its exit after SIGTERM once run.json names it; RSS is VmRSS once serving. Figures are
medians of --runs starts; CPU seconds, not wall, so a busy machine changes them little.

    .venv/bin/python benchmarks/footprint_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def _toml(settings: dict[str, dict[str, object]]) -> str:
    lines = []
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _settings(home: Path, as_tests: bool) -> dict[str, dict[str, object]]:
    service: dict[str, object] = {
        "data_dir": str(home / "data"),
        "watch": [str(home / "drop")],
        "port": 0,
    }
    if not as_tests:
        return {"service": service}
    service["plugins"] = [f"workloads:{name}" for name in ("Noop", "Steps", "Flaky", "Crash")]
    return {
        "service": service,
        "queue": {"dynamic_concurrency": False, "poll_interval": 0.2, "job_threads": 1},
        "ingest": {"processors": []},
        "models": {"auto_pull": False},
    }


def _cpu(usage: os.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    env["HOME"] = str(home)
    env["PYTHONPATH"] = str(TESTS)
    return env


def run_once(home: Path, as_tests: bool) -> tuple[float, float]:
    """(CPU seconds from exec to exit after SIGTERM, VmRSS MiB once serving)."""
    data = home / "data"
    (home / "drop").mkdir(parents=True, exist_ok=True)
    config = home / "momentry.toml"
    config.write_text(_toml(_settings(home, as_tests)), encoding="utf-8")
    run_file = data / "run.json"
    run_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), "run"],
        env=_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited with {proc.returncode}")
        try:
            if json.loads(run_file.read_text())["pid"] == proc.pid:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    status = Path(f"/proc/{proc.pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    proc.send_signal(signal.SIGTERM)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped by wait4
    return _cpu(usage), rss / 1024


def cli_once(home: Path, args: list[str]) -> float:
    home.mkdir(parents=True, exist_ok=True)
    config = home / "momentry.toml"
    config.write_text(_toml(_settings(home, False)), encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), *args],
        env=_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return _cpu(usage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    # As tests/conftest.py does: where PYTHONDONTWRITEBYTECODE is set, every process
    # would otherwise compile the package again, which is not what a start costs.
    for folder in (ROOT / "momentry_edge", TESTS):
        compileall.compile_dir(folder, quiet=2)
    print(f"{'':34}{'CPU s':>8}{'RSS MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, as_tests in (("run, default", False), ("run, as the tests", True)):
            home = Path(tmp) / label.replace(" ", "_").replace(",", "")
            runs = [run_once(home, as_tests) for _ in range(args.runs)]
            cpu = statistics.median(r[0] for r in runs)
            rss = statistics.median(r[1] for r in runs)
            print(f"{label:34}{cpu:>8.2f}{rss:>9.0f}")
        home = Path(tmp) / "cli"
        for label, command in (("--help", ["--help"]), ("status (no service)", ["status"])):
            cpu = statistics.median(cli_once(home, command) for _ in range(args.runs))
            print(f"{label:34}{cpu:>8.2f}")


if __name__ == "__main__":
    main()
