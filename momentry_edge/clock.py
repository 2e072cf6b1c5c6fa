"""The queue's time, and time as the API shows it: ISO 8601 UTC with a Z."""

from __future__ import annotations

import time
from datetime import UTC, datetime

# Seconds this machine's clock is behind the shared database server's (cluster.sync_clock).
_offset = 0.0


def now() -> float:
    """Unix time as the queue keeps it: this machine's clock set to the database server's.

    Nodes sharing a queue compare each other's leases, heartbeats and places in line;
    one whose clock is minutes off would otherwise take live nodes' jobs as abandoned,
    or leave a dead node's held for minutes.
    """
    return time.time() + _offset


def offset() -> float:
    return _offset


def set_offset(seconds: float) -> None:
    global _offset
    _offset = seconds


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
