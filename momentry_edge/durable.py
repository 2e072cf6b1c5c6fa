"""Flushing to the drive itself, so that what is written survives a power cut."""

# On macOS ``fsync`` hands the data to the drive but leaves it in the drive's own
# cache, where a power cut can lose it (fsync(2) there says so); ``F_FULLFSYNC``
# flushes that cache too. Elsewhere ``fsync`` does all of it. A rename or a new
# entry lives in its folder, so the folder is flushed after it.

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

_FULLFSYNC: int | None = getattr(fcntl, "F_FULLFSYNC", None)  # macOS only


def flush(fd: int) -> None:
    """Flush an open file's (or folder's) data and entries to the drive."""
    if _FULLFSYNC is not None:
        try:
            fcntl.fcntl(fd, _FULLFSYNC)
            return
        except OSError:  # a file system without it (some network and FAT volumes)
            pass
    os.fsync(fd)


def flush_file(path: Path | str) -> None:
    """Flush a closed file's data to the drive."""
    fd = os.open(path, os.O_RDONLY)
    try:
        flush(fd)
    finally:
        os.close(fd)


def flush_folder(folder: Path | str) -> None:
    """Flush a folder's entries (a rename or a new file in it). A file system that
    cannot flush a folder (EINVAL) keeps its entries as it does; other errors raise."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        flush(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
