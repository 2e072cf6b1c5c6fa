"""Who may read what the service writes: its own account alone, or results shared with
one group (``service.share_group``). Transcripts, file names and detections are in the
queue database, its logs, its results and its backups: none is readable by another
account on the machine."""

# The process umask (077) makes everything the service creates private: the database and
# the -wal/-shm files SQLite gives the database's own mode, logs, backups, run.json,
# temp files. Results get their modes explicitly (outputs.py), as the umask would not
# widen them for a shared group. A data dir left open by an earlier version (0755,
# a database 0644) is closed at start.

from __future__ import annotations

import grp
import logging
import os
import stat
import tempfile
from pathlib import Path

from . import outputs
from .config import Config

log = logging.getLogger(__name__)

UMASK = 0o077
PRIVATE_FILE = 0o600
# With a shared group the data dir lets the group through to results/ (x), not list it.
SHARED_DATA_DIR = 0o710


def apply(config: Config) -> int | None:
    """Make what this process writes private (its umask), results readable by the
    service.share_group if one is set (outputs.share_with); returns that group's id."""
    os.umask(UMASK)
    name = config.service.share_group
    try:
        gid = group_id(name) if name else None
    except ValueError as exc:
        raise config.error("service.share_group", str(exc)) from None
    outputs.share_with(gid)
    return gid


def group_id(name: str) -> int:
    """The id of the group ``name``; ValueError says why it cannot be shared with."""
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise ValueError(f"no group named {name!r} on this machine") from None
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise ValueError(f"the service's account is not in the group {name!r}")
    return gid


def secure_data_dir(data_dir: Path, results: Path, gid: int | None) -> None:
    """Close a data dir an earlier version left open: the folder itself, the database
    files, logs, backups and the results folder; said once in the log when anything
    changed. Only the top of each tree: below a closed folder no other account gets.
    The owner's own bits are kept (a database made read-only stays so)."""
    changed: list[str] = []
    _close(data_dir, 0o010 if gid is not None else 0, gid, changed)
    if results.is_dir():
        _close(results, 0o050 if gid is not None else 0, gid, changed)
    for path in (
        data_dir / "logs",
        data_dir / "backups",
        *data_dir.glob("momentry.db*"),
        *data_dir.glob("logs/*"),
        data_dir / "run.json",
    ):
        if path.exists():
            _close(path, 0, None, changed)
    if changed:
        log.info(
            "made the data dir's files private to the service's account (they were "
            "readable by others): %s",
            ", ".join(changed),
        )


def _close(path: Path, group: int, gid: int | None, changed: list[str]) -> None:
    """Take away the group's and others' bits of ``path`` but ``group`` (with ``gid``)."""
    try:
        st = path.stat()
        if gid is not None and st.st_gid != gid:
            os.chown(path, -1, gid)
        before = stat.S_IMODE(st.st_mode)
        after = (before & 0o700) | group
        if before != after:
            os.chmod(path, after)
            changed.append(f"{path} {before:04o} -> {after:04o}")
    except OSError as exc:  # another account's file: the start goes on, the log says so
        log.warning("cannot make %s private: %s", path, exc.strerror)


def ignores_modes(folder: Path) -> bool:
    """Whether ``folder``'s volume keeps no modes (FAT, exFAT, some network shares): a
    file made 0600 there reads back otherwise, so any account may read it."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".mode-probe.", dir=folder)
    except OSError:
        return False  # cannot write there: doctor says so on its own
    try:
        os.close(fd)
        os.chmod(probe, PRIVATE_FILE)
        return stat.S_IMODE(os.stat(probe).st_mode) != PRIVATE_FILE
    except OSError:
        return True
    finally:
        os.unlink(probe)
