"""Start-up of the one-file executable (dist/momentry-edge, made by scripts/build) against
the virtualenv's `momentry-edge run`: seconds from exec to `/healthz` answering.

cold: the executable's first start with an empty cache folder (it unpacks itself once);
warm: every later start. The virtualenv's start is warm by nature (files in the page cache
after the first run; the first is shown apart). Also prints the executable's size and that
of the folder it unpacks to.

    .venv/bin/python benchmarks/startup_bench.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def time_to_healthz(command: list[str], home: Path, env_extra: dict[str, str]) -> float:
    """Seconds from starting ``command ... run`` until /healthz answers; then SIGTERM."""
    data, drop = home / "data", home / "drop"
    drop.mkdir(parents=True, exist_ok=True)
    config = home / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{data}"\nwatch = ["{drop}"]\nport = 0\n',
        encoding="utf-8",
    )
    (data / "run.json").unlink(missing_ok=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **env_extra}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*command, "--config", str(config), "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{command[0]} exited with {proc.returncode}")
            try:
                url = json.loads((data / "run.json").read_text())["url"]
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except (OSError, ValueError, KeyError, httpx.HTTPError):
                pass
            time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    executable = ROOT / "dist" / "momentry-edge"
    if not executable.is_file():
        raise SystemExit("run scripts/build first")
    venv = ROOT / ".venv" / "bin" / "momentry-edge"
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        cold = []
        for _ in range(args.runs):
            shutil.rmtree(home / ".cache", ignore_errors=True)
            cold.append(time_to_healthz([str(executable)], home, {}))
        unpacked = next((home / ".cache" / "momentry-edge").iterdir())
        warm = [time_to_healthz([str(executable)], home, {}) for _ in range(args.runs)]
        venv_runs = [time_to_healthz([str(venv)], home, {}) for _ in range(args.runs + 1)]
        print(f"{'':34}{'median s':>10}{'max s':>8}")
        rows = [
            ("executable, cold (unpacks)", cold),
            ("executable, warm", warm),
            ("virtualenv momentry-edge run", venv_runs[1:]),
        ]
        for label, runs in rows:
            print(f"{label:34}{statistics.median(runs):>10.2f}{max(runs):>8.2f}")
        print(f"virtualenv first run: {venv_runs[0]:.2f} s")
        ratio = statistics.median(warm) / statistics.median(venv_runs[1:])
        print(f"warm executable / virtualenv: {ratio:.2f}")
        print(f"executable size: {size(executable) / 2**20:.0f} MiB")
        print(f"unpacked folder: {size(unpacked) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
