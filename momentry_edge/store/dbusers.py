"""Whether a process on this host uses this queue database: has its SQLite file open, or
a session on its PostgreSQL database by the name connection.application_name gives it."""

from __future__ import annotations

import os

import peewee as pw
import psutil

from .connection import application_name
from .sql import is_postgres


def uses(process: psutil.Process, database: pw.Database) -> bool:
    """True also when it cannot be told (another user's process; a database URL that
    names its own application_name): then the process counts as a user, as before."""
    if is_postgres(database):
        return _has_session(process.pid, database)
    return _has_open(process, str(database.database))


def _has_open(process: psutil.Process, path: str) -> bool:
    try:
        ours = os.stat(path)
        files = process.open_files()
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False  # gone meanwhile
    except OSError:
        return True
    for opened in files:
        try:
            st = os.stat(opened.path)
        except OSError:
            continue  # a file deleted since (one a restore replaced): not this one
        if (st.st_dev, st.st_ino) == (ours.st_dev, ours.st_ino):
            return True
    return False


def _has_session(pid: int, database: pw.Database) -> bool:
    if database.connect_params.get("application_name") != application_name():
        return True  # the URL names the sessions: theirs cannot be told from others'
    row = database.execute_sql(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = %s)",
        (application_name(pid),),
    ).fetchone()
    return bool(row[0])
