"""The data dir's lock: a running service holds it shared, a restore exclusively from its
first step to its last, so neither starts while the other runs. flock() on the folder:
the kernel lets go when the process ends, however it ends. On PostgreSQL a restore also
holds an advisory lock on the database, which a node starting elsewhere asks about.
"""

from __future__ import annotations

import fcntl  # POSIX (macOS, Linux): the platforms this service runs on
import logging
import os
from pathlib import Path

import peewee as pw

log = logging.getLogger(__name__)


class Held(Exception):
    """Another process holds the data dir: ``by`` is "restore" or "service"."""

    def __init__(self, data_dir: Path, by: str) -> None:
        super().__init__(f"{data_dir} is held by a {by}")
        self.data_dir, self.by = data_dir, by


def share(data_dir: Path) -> int:
    """Hold ``data_dir`` for a service (others may too); Held when a restore holds it.
    Returns the descriptor, whose close lets go."""
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    if not _lock(fd, fcntl.LOCK_SH, data_dir):
        os.close(fd)
        raise Held(data_dir, "restore")
    return fd


def exclusive(data_dir: Path) -> int:
    """Hold ``data_dir`` for a restore; Held (by "service" or "restore") when another
    process holds it. Returns the descriptor, whose close lets go."""
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    if _lock(fd, fcntl.LOCK_EX, data_dir):
        return fd
    # Shared holders are services; a shared lock refused means a restore holds it.
    by = "service" if _lock(fd, fcntl.LOCK_SH, data_dir) else "restore"
    os.close(fd)
    raise Held(data_dir, by)


def _lock(fd: int, kind: int, data_dir: Path) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        log.warning(
            "cannot lock %s (%s): a restore and a start cannot tell of each other", data_dir, exc
        )
    return True


# The advisory lock a restore into PostgreSQL holds (the server keeps one per database).
RESTORE_KEY = 0x6D6F6D656E747279  # "momentry"


def restoring(database: pw.Database) -> bool:
    """Whether a restore holds this PostgreSQL database. Asked by a node after it has
    registered: a restore that checked for nodes before that finds none but holds the
    lock already, so one of the two is refused."""
    (free,) = database.execute_sql(
        "SELECT pg_try_advisory_lock_shared(%s)", (RESTORE_KEY,)
    ).fetchone()
    if free:
        database.execute_sql("SELECT pg_advisory_unlock_shared(%s)", (RESTORE_KEY,))
    return not free
