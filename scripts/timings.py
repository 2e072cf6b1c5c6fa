#!/usr/bin/env python3
"""Where a test run's time went: tables of wall and CPU seconds per file and per test.

    scripts/timings.py RUN [--top N] [--markdown]

RUN is a timings file (JSON lines, one per test: what tests/timings.py writes with
MOMENTRY_TEST_TIMINGS=FILE) or a folder holding ``timings.jsonl`` and, when the run was
timed as a whole (tests/README.md says how), ``t.before``/``t.after`` (epoch seconds),
``time.log`` (``/usr/bin/time -v``: the CPU of pytest and every process it started) and
``stat.before``/``stat.after`` (the first line of /proc/stat: the whole machine's CPU,
the database server included). A test's CPU is its worker's and that of the processes
the test started and waited for (the services); a module fixture counts towards the
first test that uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def load(path: Path) -> list[dict]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def machine_cpu(before: Path, after: Path) -> float:
    """Busy CPU seconds of the whole machine between two first lines of /proc/stat."""

    def busy(path: Path) -> float:
        fields = [int(x) for x in path.read_text().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        # guest and guest_nice (fields 8, 9) are already counted in user and nice.
        return (sum(fields[:8]) - idle) / CLOCK_TICKS

    return busy(after) - busy(before)


def tree_cpu(time_log: Path) -> float | None:
    """User + system seconds of the timed command and its children (/usr/bin/time -v)."""
    text = time_log.read_text(errors="replace")
    user = re.search(r"User time \(seconds\): ([\d.]+)", text)
    system = re.search(r"System time \(seconds\): ([\d.]+)", text)
    return float(user[1]) + float(system[1]) if user and system else None


def table(rows: list[tuple], head: tuple[str, ...], markdown: bool) -> str:
    cells = [head, *[tuple(str(c) for c in row) for row in rows]]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in cells]
        lines.insert(1, "|" + "|".join(" --- " for _ in head) + "|")
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )


def report(run: Path, top: int, markdown: bool) -> str:
    folder = run if run.is_dir() else run.parent
    tests = load(run / "timings.jsonl" if run.is_dir() else run)
    if not tests:
        return "no timings"
    out = []
    files: dict[str, list[dict]] = defaultdict(list)
    for t in tests:
        files[t["file"]].append(t)
    wall = sum(t["wall"] for t in tests)
    cpu = sum(t["cpu"] for t in tests)

    summary = [("tests", len(tests)), ("files", len(files))]
    summary += [("sum of test wall (s)", f"{wall:.0f}"), ("sum of test CPU (s)", f"{cpu:.0f}")]
    if any("polls" in t for t in tests):  # conftest.wait_for's share of that wall
        waited = sum(t.get("waited", 0) for t in tests)
        polls = sum(t.get("polls", 0) for t in tests)
        summary += [("of the wall, in wait_for (s)", f"{waited:.0f}"), ("its polls", polls)]
    if run.is_dir() and (folder / "t.after").exists():
        suite_wall = float((folder / "t.after").read_text()) - float(
            (folder / "t.before").read_text()
        )
        summary.append(("suite wall (s)", f"{suite_wall:.0f} ({suite_wall / 60:.1f} min)"))
        if (folder / "time.log").exists() and (tree := tree_cpu(folder / "time.log")):
            summary.append(("suite CPU, pytest's process tree (s)", f"{tree:.0f}"))
            summary.append(("CPU / wall", f"{tree / suite_wall:.2f}"))
        if (folder / "stat.after").exists():
            machine = machine_cpu(folder / "stat.before", folder / "stat.after")
            summary.append(("machine CPU, all processes (s)", f"{machine:.0f}"))
            summary.append(("machine CPU / wall", f"{machine / suite_wall:.2f}"))
    workers: dict[str, list[dict]] = defaultdict(list)
    for t in tests:
        workers[t["worker"]].append(t)
    if len(workers) > 1:
        last = max(t["end"] for t in tests)
        idle = {w: last - max(t["end"] for t in ts) for w, ts in workers.items()}
        summary.append(("longest a worker sat idle at the end (s)", f"{max(idle.values()):.0f}"))
    out.append(table(summary, ("figure", "value"), markdown))

    per_file = [
        (
            name,
            len(ts),
            round(sum(t["wall"] for t in ts), 1),
            round(sum(t["cpu"] for t in ts), 1),
        )
        for name, ts in files.items()
    ]
    per_test = [(t["test"], t["wall"], t["cpu"]) for t in tests]
    for label, rows, head, key in (
        ("files by wall", per_file, ("file", "tests", "wall s", "CPU s"), 2),
        ("files by CPU", per_file, ("file", "tests", "wall s", "CPU s"), 3),
        ("tests by wall", per_test, ("test", "wall s", "CPU s"), 1),
        ("tests by CPU", per_test, ("test", "wall s", "CPU s"), 2),
    ):
        ranked = sorted(rows, key=lambda r, k=key: -r[k])[:top]
        out.append(f"\n{'### ' if markdown else ''}The {top} slowest {label}\n")
        out.append(table(ranked, head, markdown))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a timings.jsonl, or the folder of a timed run")
    parser.add_argument("--top", type=int, default=10, help="rows per ranking (10)")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    args = parser.parse_args()
    print(report(args.run, args.top, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
