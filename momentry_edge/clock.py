"""The queue's time, and time as the API shows it: ISO 8601 UTC with a Z."""

from __future__ import annotations

import math
import time
from typing import overload

# The whole second last rendered, and its text: consecutive calls (log lines, documents)
# mostly fall within one second, and formatting is the costly part.
_second: tuple[int, str] = (0, "1970-01-01T00:00:00")

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


@overload
def iso(ts: float) -> str: ...


@overload
def iso(ts: None) -> None: ...


@overload
def iso(ts: float | None) -> str | None: ...


def iso(ts: float | None) -> str | None:
    """``ts`` (Unix seconds) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``, milliseconds cut, not rounded,
    after rounding to the microsecond as datetime.fromtimestamp does."""
    global _second
    if ts is None:
        return None
    fraction, whole = math.modf(ts)
    micros = round(fraction * 1e6)  # half to even, as datetime does
    seconds = int(whole)
    if micros >= 1_000_000:
        seconds, micros = seconds + 1, micros - 1_000_000
    elif micros < 0:
        seconds, micros = seconds - 1, micros + 1_000_000
    cached_second, text = _second
    if seconds != cached_second:
        # Not strftime: its %Y does not pad a year before 1000 to four digits on Linux.
        t = time.gmtime(seconds)
        text = (
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
            f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
        )
        _second = (seconds, text)
    return f"{text}.{micros // 1000:03d}Z"
