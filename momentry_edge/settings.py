"""The effective settings and where each came from (`config show`, the service's registry
entry), and the queue settings changed at run time, which outlast a restart."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from . import redact
from .config import SECTIONS, Config

SECRET = {"service.token"}  # shown as set or not, never printed
# Their passwords, keys and secret-looking parameters are masked (redact.py).
URLS = {"service.database_url", "service.redis_url", "alerts.url"}
# Changed through the API (the TUI's + and -, `momentry-edge concurrency`) and kept in the
# queue database: a restart keeps them until the config file's value changes.
RUN_TIME = {
    "queue.max_concurrent": "max_concurrent",
    "queue.dynamic_concurrency": "dynamic_concurrency",
}


def effective(cfg: Config) -> list[dict[str, Any]]:
    """Every setting: ``{"key", "value", "origin"}`` (origin: default, config file,
    environment variable X)."""
    rows = []
    for section in SECTIONS:
        values = getattr(cfg, section)
        for f in dataclasses.fields(values):
            key = f"{section}.{f.name}"
            value = _plain(getattr(values, f.name))
            if key in SECRET:
                value = "(set)" if value else "(not set)"
            elif key in URLS and value:
                value = redact.url(value)
            rows.append({"key": key, "value": value, "origin": cfg.origin(key)})
    for name, table in sorted(cfg.processors.items()):
        for option, value in sorted(table.items()):
            rows.append(
                {
                    "key": f"processors.{name}.{option}",
                    "value": _plain(value),
                    "origin": "config file",
                }
            )
    return rows


def with_run_time(rows: list[dict[str, Any]], status: dict[str, Any]) -> list[dict[str, Any]]:
    """``rows`` with the values a running service uses in place of its settings' (from its
    queue status), each saying what it replaces."""
    changed = []
    for row in rows:
        field = RUN_TIME.get(row["key"])
        if field in status and status[field] != row["value"]:
            row = row | {
                "value": status[field],
                "origin": f"set at run time (TUI, `concurrency` or the API), kept across "
                f"restarts until the setting changes; {row['origin']} says {row['value']}",
            }
        changed.append(row)
    return changed


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
