"""Where the CLI finds this user's running service, whatever its config, data dir or port:
each service registers in ~/.momentry-edge/services/ (its URL, data dir, config file and
settings), and removes its entry when it stops. Entries of processes that are gone (a
kill -9, a power cut) are passed over, and removed by the next service that registers.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from . import runfile

log = logging.getLogger(__name__)


def folder() -> Path:
    """The user's registry (HOME is the operator's also under launchd and systemd units)."""
    return Path(os.path.expanduser("~")) / ".momentry-edge" / "services"


def register(info: dict[str, Any]) -> None:
    """Add or replace this process's entry; a registry that cannot be written is logged
    (the service runs on: `--url` still finds it)."""
    where = folder()
    try:
        where.mkdir(parents=True, exist_ok=True)
        for stale in where.glob("*.json"):
            if runfile.held_by_live_process(stale) is None:
                stale.unlink(missing_ok=True)
        staged = where / f".{os.getpid()}.json.tmp"
        staged.write_text(json.dumps(info) + "\n", encoding="utf-8")
        staged.chmod(0o600)  # the settings name folders and servers; the token is left out
        os.replace(staged, where / f"{os.getpid()}.json")
    except OSError as exc:
        log.warning(
            "cannot register in %s (%s); clients need --url to find this service", where, exc
        )


def registered() -> bool:
    return (folder() / f"{os.getpid()}.json").exists()


def unregister(owner: str) -> None:
    entry = folder() / f"{os.getpid()}.json"
    try:
        info = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(info, dict) and info.get("owner") == owner:
        entry.unlink(missing_ok=True)


def running() -> list[dict[str, Any]]:
    """The entries of live services, the most recently started first."""
    try:
        entries = list(folder().glob("*.json"))
    except OSError:
        return []
    live = [info for entry in entries if (info := runfile.held_by_live_process(entry))]
    return sorted(live, key=lambda info: str(info.get("started_at", "")), reverse=True)
