"""The database check at start-up: a damaged SQLite file named, with the restore that fixes it."""

from __future__ import annotations

import shlex
import sqlite3
from pathlib import Path

import peewee as pw

from .. import store
from ..config import Config
from .backup import SQLITE_HEADER, _problems, backups_dir, latest, sqlite_path
from .restore import remove_restore_leftovers


class DatabaseDamaged(Exception):
    """The queue database failed its check; the message names the file and the restore."""


def connect_checked(cfg: Config) -> pw.Database:
    """Check the SQLite file, then open and migrate the database, as store.connect does.

    A damaged file raises DatabaseDamaged (never a traceback or a half-started
    service), whether the check finds it or SQLite says so while migrating. The caller
    holds the data dir (datalock.share): no restore runs.
    """
    path = sqlite_path(cfg)
    remove_restore_leftovers(cfg)  # what a restore that was cut off left
    if path is not None:
        check(path, cfg)
    try:
        return store.connect(cfg.service.database_url, cfg.data_dir, cfg.service.database_timeout)
    except (sqlite3.DatabaseError, pw.DatabaseError) as exc:
        if path is not None and _is_damage(exc):
            raise damaged(path, str(exc), cfg) from None
        raise


def check(path: Path, cfg: Config) -> None:
    """The header, then ``PRAGMA quick_check`` on the SQLite file.

    quick_check reads every page but skips matching indexes to rows: under a second on
    100,000 jobs (130 MB), where integrity_check takes several.
    """
    try:
        with path.open("rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return  # a new service: connect makes it
    if header and header != SQLITE_HEADER:
        if cfg.service.database_url:
            # A file the URL names, not one the service made: most likely the wrong file.
            raise cfg.error(
                "service.database_url",
                f"{path} is not an SQLite database (it does not begin as one does); "
                "name the queue's database file, or a new one",
            )
        raise damaged(path, "its header is not SQLite's", cfg)
    conn = sqlite3.connect(path, timeout=15)
    try:
        problems = _problems(conn, "quick_check")
    except sqlite3.DatabaseError as exc:
        if not _is_damage(exc):
            raise
        problems = str(exc)
    finally:
        conn.close()
    if problems:
        raise damaged(path, problems, cfg)


def damaged(path: Path, detail: str, cfg: Config) -> DatabaseDamaged:
    config = f" --config {shlex.quote(str(cfg.source))}" if cfg.source else ""
    newest = latest(cfg.data_dir)
    if newest is not None:
        hint = (
            f"Restore the newest backup (the damaged file is kept, renamed):\n"
            f"  momentry-edge{config} restore {shlex.quote(str(newest))}"
        )
    else:
        hint = (
            f"There is no backup in {backups_dir(cfg.data_dir)}. Restore one from elsewhere "
            f"with `momentry-edge{config} restore SRC`, or move {path.name} aside to start "
            "with an empty queue (the rescan registers the drop folders' files again); then "
            "take backups: `momentry-edge backup`, or [service] backup_interval."
        )
    return DatabaseDamaged(f"the queue database {path} is damaged ({detail}).\n{hint}")


def _is_damage(exc: Exception) -> bool:
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text
