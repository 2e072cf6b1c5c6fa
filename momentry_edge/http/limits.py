"""Descriptors for the HTTP server: its connection limit, set from the open-file limit with
a reserve for the rest of the service, and the accepting of connections, which pauses
with a back-off while no descriptor is free and makes room at the limit by closing the
connection idle the longest, so a health check always gets in. Said once a second at most.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Descriptors kept for the database, logs, media and model files, the processors' pipes.
RESERVE = 256
OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
FIRST_PAUSE, LONGEST_PAUSE = 0.05, 1.0  # seconds without accepting; doubled each time
SAY_EVERY = 1.0  # seconds between two lines about it in the log


@dataclass(frozen=True)
class Limit:
    connections: int
    open_files: int  # the soft limit, raised as far as it goes
    in_use: int  # open at start
    reserve: int

    def said(self) -> str:
        return (
            f"HTTP connections limited to {self.connections} at once: open-file limit"
            f" {self.open_files}, {self.in_use} open now, {self.reserve} kept for the"
            " database, logs and media"
        )


def connection_limit(most: int) -> Limit:
    """At most ``most`` connections, fewer when the open-file limit leaves less room."""
    soft = raise_open_file_limit(most + RESERVE)
    reserve = min(RESERVE, soft // 2)
    in_use = _open_now()
    return Limit(max(4, min(most, soft - reserve - in_use)), soft, in_use, reserve)


def raise_open_file_limit(wanted: int) -> int:
    """Raise the soft open-file limit towards ``wanted`` (it is 256 under launchd) as far as
    the hard limit lets; returns the soft limit then."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass  # the limit the system gave stays
    return wanted if soft == resource.RLIM_INFINITY else soft


def _open_now() -> int:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 0


class Accepting:
    """When the server may accept, and what it says about it (from its loop thread).

    It holds a spare descriptor: when none is left, the spare is given up for the one
    connection waiting (a health check, say), and the connection idle the longest closed
    so that the spare can be taken again.
    """

    def __init__(self) -> None:
        self._resume_at = 0.0
        self._pause = 0.0
        self._said_at = float("-inf")
        self._room_said_at = float("-inf")
        self._unsaid = 0  # refusals since the last line
        self._out = False  # said "out of descriptors" and not yet "accepting again"
        self._spare: int | None = None
        self.refill()

    def refill(self) -> None:
        """Take the spare descriptor again, if it was given up and one is free."""
        if self._spare is None:
            with contextlib.suppress(OSError):  # none free yet: at the next turn
                self._spare = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def give_up_spare(self) -> bool:
        """Close the spare descriptor for an accept to use; False if it is gone already."""
        if self._spare is None:
            return False
        os.close(self._spare)
        self._spare = None
        return True

    def close(self) -> None:
        self.give_up_spare()

    def paused(self) -> bool:
        return time.monotonic() < self._resume_at

    def pause(self, error: OSError, connections: int) -> None:
        """No descriptor for an accept: none for a while, doubled each time."""
        now = time.monotonic()
        self._pause = min(LONGEST_PAUSE, max(FIRST_PAUSE, self._pause * 2))
        self._resume_at = now + self._pause
        self._unsaid += 1
        if now - self._said_at >= SAY_EVERY:
            log.warning(
                "out of file descriptors (%s): accepting paused for %g s; %d connections"
                " open, %d accepts refused since last said",
                os.strerror(error.errno or 0),
                self._pause,
                connections,
                self._unsaid,
            )
            self._said_at, self._unsaid, self._out = now, 0, True

    def accepted(self) -> None:
        self._pause = 0.0
        now = time.monotonic()
        if self._out and now - self._said_at >= SAY_EVERY:
            self._out, self._said_at = False, now
            log.info("accepting connections again")

    def make_room(self, channels: Iterable[Any], connections: int, say: bool = True) -> None:
        """At the connection limit, or out of descriptors: close the connection idle the
        longest (one at a time), so that a new client gets in; one running a request
        stays."""
        idle = None
        for channel in channels:
            if channel.will_close:
                return  # room is being made already
            # None running (idle, or one still arriving), and idle longer than the others.
            if not channel.requests and (
                idle is None or channel.last_activity < idle.last_activity
            ):
                idle = channel
        if idle is None:
            return
        idle.will_close = True  # closed by the loop at its next turn
        now = time.monotonic()
        if say and now - self._room_said_at >= SAY_EVERY:
            log.warning(
                "%d HTTP connections open, no room for more: closing the one idle the"
                " longest to let new ones in",
                connections,
            )
            self._room_said_at = now

    def shed(self, channels: Iterable[Any], watched: int) -> None:
        """More descriptors watched than the open-file limit allows (it was lowered): close
        idle connections, the longest idle first, until those left fit under it."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        idle = sorted((c for c in channels if not c.requests), key=lambda c: c.last_activity)
        excess = watched - (soft - min(RESERVE, soft // 2))
        for channel in idle[: max(1, excess)]:
            channel.handle_close()
        now = time.monotonic()
        if now - self._room_said_at >= SAY_EVERY:
            log.warning(
                "open-file limit %d, lower than the %d descriptors the HTTP server watches:"
                " %d idle connections closed",
                soft,
                watched,
                min(len(idle), max(1, excess)),
            )
            self._room_said_at = now
        time.sleep(FIRST_PAUSE)  # not a busy loop if nothing could be closed


def out_of_files(error: OSError) -> bool:
    return error.errno in OUT_OF_FILES
