"""``<data_dir>/run.json``: how the CLI finds the running service (its URL, with port 0
chosen at start), and how ``restore`` knows that one runs.
"""

# The file names the process that wrote it. A process is taken to hold it only while it
# runs on this host and was started before the file was written: after a kill -9 its pid
# may be another program's by now.

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil

NAME = "run.json"


def write(data_dir: Path, info: dict[str, Any]) -> None:
    """Replace the file with ``info`` (its ``pid`` this process's), whole or not at all."""
    staged = data_dir / f".{NAME}.{os.getpid()}"
    staged.write_text(json.dumps(info) + "\n", encoding="utf-8")
    os.replace(staged, data_dir / NAME)


def holder(data_dir: Path) -> dict[str, Any] | None:
    """What the file says, while the process that wrote it runs; else None."""
    return held_by_live_process(data_dir / NAME)


def held_by_live_process(path: Path) -> dict[str, Any] | None:
    """What a JSON file with a ``pid`` says, while the process that wrote it runs."""
    try:
        written = path.stat().st_mtime
        info = json.loads(path.read_text(encoding="utf-8"))
        started = psutil.Process(int(info["pid"])).create_time()
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None
    return info if started <= written + 1 else None  # create_time is rounded


def remove(data_dir: Path, owner: str) -> None:
    """Remove the file if ``owner`` wrote it: a start that failed on a data dir another
    instance serves must not take away the file the CLI finds that one by."""
    path = data_dir / NAME
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(info, dict) and info.get("owner") == owner:
        path.unlink(missing_ok=True)
