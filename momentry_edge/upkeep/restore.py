"""Restore: a backup put in place of the queue (and results), the replaced files kept aside."""

# One piece (~690 lines): a restore's steps (check, stage, swap, the PostgreSQL
# script) share its locks and what it sets aside; undone together when one fails.

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import datalock, outputs, runfile, store, trees
from ..config import Config
from .backup import (
    DUMP_NAME,
    MB,
    RESTORING,
    SETTINGS_NAME,
    SIDECARS,
    SQLITE_HEADER,
    SQLITE_NAME,
    STEP_PAGES,
    BackupError,
    _check_data_dir,
    _copy_tree,
    _failed,
    _job_count,
    _make_folders,
    _pg_command,
    _problems,
    _remove_made,
    _sync,
    _sync_file,
    _sync_tree,
    _tree_size,
    _unfinished,
    sqlite_path,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    database: str  # what was restored into: the SQLite file or the PostgreSQL database
    aside: str | None  # where the database it replaced was put
    jobs: int | None
    results_aside: str | None
    settings: str | None  # the backup's settings file, left for the user to compare
    skipped: tuple[str, ...] = ()  # links in the backup's results, not restored

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def restore(cfg: Config, source: Path) -> Restored:
    """Put a backup in place of the database, with the service stopped.

    The backup is checked before anything is touched; the database it replaces is
    renamed, never deleted. Everything is copied beside its place first and put there by
    renames, so a crash at any step leaves the database there was or the restored one,
    and running the restore again finishes it.
    """
    try:
        return _restore(cfg, source)
    except OSError as exc:  # one no step below expected (a folder on the way unreadable...)
        raise _failed(f"cannot restore {source}", exc) from None


def _restore(cfg: Config, source: Path) -> Restored:
    source = source.expanduser().absolute()
    _check_data_dir(cfg.data_dir)
    folder = source if source.is_dir() else source.parent
    if _unfinished(folder):
        raise BackupError(
            f"{folder} is an unfinished backup, cut off before it was whole (the next "
            "backup removes it); restore a complete one"
        )
    copy = _backup_file(source)
    target = sqlite_path(cfg)
    # What the backup is, before whether anything runs: said even while something does.
    if target is not None and copy.name.endswith(".pgdump"):
        raise BackupError(f"{copy} is a PostgreSQL dump; this service uses SQLite ({target})")
    if target is None and not copy.name.endswith(".pgdump"):
        raise BackupError(f"{copy} is {_not_a_dump(copy)}; this service uses PostgreSQL")
    if target is not None:
        _check_header(copy)  # before a byte is copied: a large file that is none goes nowhere
    results = folder / "results" if source.is_dir() else None
    skipped: list[str] = []
    if results is not None and results.is_symlink():
        skipped.append(str(results))  # not followed: it could lead anywhere
        results = None
    if results is not None and not results.is_dir():
        results = None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    made = _make_folders(cfg.data_dir)
    try:
        # Held from before the check that no service runs to the last rename: a start
        # meanwhile is refused (datalock), and so is a second restore.
        with _restore_lock(cfg):
            refuse_if_running(cfg)
            if target is not None:
                made += _make_folders(target.parent)
            home = _results_home(cfg.data_dir) if results is not None else None
            _check_restore_room(copy if target is not None else None, target, results, home)
            staged = []
            try:
                if target is not None:
                    staged.append(_stage_sqlite(copy, target))
                else:
                    _check_dump(copy)
                if results is not None and home is not None:
                    staged.append(_stage_results(results, home, skipped))
                # Nothing was changed up to here.
                if target is not None:
                    aside = _swap_sqlite(staged[0], target, stamp)
                    jobs, where = _count_jobs(target), str(target)
                else:
                    aside, jobs = _restore_postgres(copy, cfg.service.database_url, stamp)
                    where = store.safe_url(cfg.service.database_url)
            except BaseException:
                for path in staged:
                    _remove_staged(path)
                raise
            results_aside = None
            if home is not None:
                results_aside = _swap_results(staged[-1], home, stamp)
    except BaseException as exc:
        _remove_made(made)  # only folders still empty: never one a restore put a file in
        if isinstance(exc, OSError):
            raise _failed(f"cannot restore {source}", exc) from None
        raise
    settings = folder / SETTINGS_NAME
    return Restored(
        database=where,
        aside=aside,
        jobs=jobs,
        results_aside=results_aside,
        settings=str(settings) if source.is_dir() and settings.is_file() else None,
        skipped=tuple(skipped),
    )


def _check_header(copy: Path) -> None:
    try:
        with copy.open("rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise _failed(f"cannot read {copy}", exc) from None
    if header != SQLITE_HEADER:
        raise BackupError(
            f"{copy} is not a usable backup (not a SQLite database: its header is not "
            "SQLite's); nothing was changed"
        )


def _not_a_dump(copy: Path) -> str:
    """What a file given to a PostgreSQL service is, said by its first bytes."""
    with contextlib.suppress(OSError), copy.open("rb") as f:
        if f.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
            return "a SQLite database (a backup of a service on SQLite)"
    return f"not a PostgreSQL dump (a backup of a service on PostgreSQL holds {DUMP_NAME})"


def _check_restore_room(
    copy: Path | None, target: Path | None, results: Path | None, home: Path | None
) -> None:
    """Room for the copies a restore makes (the database beside its place, the results
    beside theirs, ``home``) on each disk they go to, before any is made: the databases and
    results they replace are renamed, which takes none."""
    wants = []
    if copy is not None and target is not None:
        wants.append((target.parent, copy))
    if results is not None and home is not None:
        wants.append((home.parent, results))
    needs: dict[int, tuple[Path, int]] = {}
    for where, what in wants:
        usage = os.statvfs(where)
        device = os.stat(where).st_dev
        first, need = needs.get(device, (where, 0))
        needs[device] = (first, need + _tree_size(what, usage.f_frsize))
    for where, need in needs.values():
        usage = os.statvfs(where)
        free = usage.f_bavail * usage.f_frsize
        if need > free:
            raise BackupError(
                f"a restore needs up to {need / MB:,.1f} MB and the disk of {where} has "
                f"{free / MB:,.1f} MB free; free some space. Nothing was changed"
            )


def _results_home(data_dir: Path) -> Path:
    """Where the results folder is: ``<data_dir>/results``, or the folder that names (on
    shared storage), which a restore puts the results in, keeping the link."""
    current = data_dir / "results"
    if not current.is_symlink():
        return current
    home = Path(os.path.realpath(current))
    if not home.is_dir():
        raise BackupError(
            f"{current} is a link to {home}, which is not a folder; make that folder (or "
            "remove the link) and restore again. Nothing was changed"
        )
    return home


def _backup_file(source: Path) -> Path:
    if source.is_dir():
        for name in (SQLITE_NAME, DUMP_NAME):
            if (source / name).is_file():
                return source / name
        raise BackupError(f"{source} holds no backup ({SQLITE_NAME} or {DUMP_NAME})")
    if source.is_file():
        return source
    raise BackupError(f"{source} does not exist")


def refuse_if_running(cfg: Config) -> None:
    """Raise BackupError while a service uses this data dir or database."""
    info = runfile.holder(cfg.data_dir)  # None: stopped (or killed), or never started
    if info is not None and info["pid"] != os.getpid():
        raise BackupError(
            f"the service is running (pid {info['pid']}, {info.get('url', '')}); stop it first "
            "(Ctrl-C or kill -TERM; `momentry-edge service uninstall` when it starts at login)"
        )
    target = sqlite_path(cfg)
    if target is None:
        _refuse_if_nodes(cfg)
    elif target.is_file():
        conn = sqlite3.connect(target, timeout=0)
        try:
            # Every connection to a WAL database holds a shared lock on the file while it is
            # open, so an exclusive one is refused while any other process has it open.
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise BackupError(f"{target} is in use by another process; stop it first") from None
        except sqlite3.DatabaseError:
            pass  # damaged: nobody can be using it, and restoring is the point
        finally:
            conn.close()


def _refuse_if_nodes(cfg: Config) -> None:
    """A shared PostgreSQL queue: refuse while any node's heartbeat is recent."""
    with _postgres(cfg.service.database_url) as conn:
        if not conn.execute("SELECT to_regclass('public.node') IS NOT NULL").fetchone()[0]:
            return
        # By the server's clock, which the nodes' heartbeats keep (cluster.sync_clock).
        rows = conn.execute(
            "SELECT node_id, host, pid FROM node"
            " WHERE last_seen > EXTRACT(EPOCH FROM clock_timestamp()) - %s",
            (2 * cfg.queue.lease_seconds,),
        ).fetchall()
    if rows:
        nodes = ", ".join(f"{node} (pid {pid} on {host})" for node, host, pid in rows)
        raise BackupError(f"service nodes are working on this database: {nodes}; stop them first")


@contextlib.contextmanager
def _postgres(url: str) -> Iterator[Any]:
    """A psycopg connection (autocommit); a server that cannot be reached is a BackupError."""
    import psycopg  # only restore into PostgreSQL needs it directly

    try:
        conn = psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        raise BackupError(f"cannot reach the database {store.safe_url(url)}: {exc}") from None
    with conn:
        yield conn


@contextlib.contextmanager
def _restore_lock(cfg: Config) -> Iterator[None]:
    """The data dir held for a whole restore (datalock): a second restore, or a service
    starting, is refused meanwhile, and the service's start finds no copy being made."""
    try:
        fd = datalock.exclusive(cfg.data_dir)
    except datalock.Held as held:
        if held.by == "restore":
            raise BackupError(
                f"another restore into {cfg.data_dir} is running; wait for it"
            ) from None
        refuse_if_running(cfg)  # says which process, when it has written run.json
        raise BackupError(
            f"a service using {cfg.data_dir} is starting or stopping; stop it first"
        ) from None
    try:
        if sqlite_path(cfg) is None:
            with _postgres_held(cfg.service.database_url):
                yield
        else:
            yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _postgres_held(url: str) -> Iterator[None]:
    """The database held for the restore (datalock.RESTORE_KEY): nodes with other data
    dirs, on other machines, ask about it as they start (datalock.restoring)."""
    with _postgres(url) as conn:
        held = conn.execute("SELECT pg_try_advisory_lock(%s)", (datalock.RESTORE_KEY,))
        if not held.fetchone()[0]:
            raise BackupError(f"another restore into {store.safe_url(url)} is running; wait for it")
        yield  # the lock ends with the session


def remove_restore_leftovers(cfg: Config) -> list[Path]:
    """Remove the copies a restore that was cut off left (the database copy, the results
    copy); returns what was removed. The caller holds the data dir (datalock.share), so
    no restore is making them now."""
    target = sqlite_path(cfg)
    found = [cfg.data_dir / f"results{RESTORING}"]
    with contextlib.suppress(BackupError):
        home = _results_home(cfg.data_dir)
        found.append(home.with_name(home.name + RESTORING))
    if target is not None:
        staging = target.with_name(target.name + RESTORING)
        found += [Path(f"{staging}{suffix}") for suffix in ("", *SIDECARS)]
    found = [path for path in dict.fromkeys(found) if path.exists() or path.is_symlink()]
    for path in found:
        _remove_staged(path)
        log.info("removed %s, left by a restore that was cut off", path)
    return found


def _remove_staged(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        trees.remove(path)
    else:
        _remove_sqlite(path)


def _stage_sqlite(copy: Path, target: Path) -> Path:
    """The backup's database copied beside ``target`` and checked there."""
    staging = target.with_name(target.name + RESTORING)
    _remove_sqlite(staging)  # what an interrupted restore left
    try:
        _read_sqlite(copy, staging)
        conn = sqlite3.connect(staging)
        try:
            problems = _problems(conn, "integrity_check") or _sqlite_not_a_queue(conn)
            if not problems:
                _no_node_runs(conn)
        finally:
            conn.close()  # the last connection: a WAL the update made goes into the file
        _sync_file(staging)
    except sqlite3.DatabaseError as exc:
        problems = str(exc)
    except BaseException as exc:
        _remove_sqlite(staging)
        if isinstance(exc, OSError):
            raise BackupError(f"cannot copy {copy} to {staging}: {exc.strerror}") from None
        raise
    if problems:
        _remove_sqlite(staging)
        raise BackupError(f"{copy} is not a usable backup ({problems}); nothing was changed")
    return staging


def _swap_sqlite(staging: Path, target: Path, stamp: str) -> str | None:
    """Put the checked copy in place of ``target``; the database it replaces is kept aside."""
    _fold_wal(target)
    # The -wal (or -journal) file belongs to the old database: left in place it would be
    # replayed into the restored one. Moved also when the database itself is not there
    # (it may be what a crash left), and never over an earlier restore's.
    sidecars = [suffix for suffix in SIDECARS if Path(f"{target}{suffix}").exists()]
    if not target.exists() and not sidecars:
        os.replace(staging, target)
        _sync(target.parent)
        return None
    aside = _free_name(target.with_name(f"{target.name}.before-restore-{stamp}"), SIDECARS)
    had_target, linked = target.exists(), False
    if had_target:
        try:
            # A second name for the current file: it keeps its own until the copy takes it
            # in one step, so no crash leaves the service without a database to open.
            os.link(target, aside)
            linked = True
        except OSError:
            pass  # a filesystem without hard links: renamed below instead
    for suffix in sidecars:
        os.rename(f"{target}{suffix}", f"{aside}{suffix}")
    if had_target and not linked:
        target.rename(aside)
    os.replace(staging, target)
    _sync(target.parent)
    if not had_target:
        found = ", ".join(f"{target.name}{suffix}" for suffix in sidecars)
        log.warning("found %s without %s; kept aside as %s*", found, target.name, aside)
        return None
    return str(aside)


def _fold_wal(target: Path) -> None:
    """Write the WAL of the database being replaced into its main file, as SQLite does at
    the next open, so that file is whole by itself and its WAL goes away with the close."""
    if not (target.is_file() and Path(f"{target}-wal").exists()):
        return
    try:
        conn = sqlite3.connect(target)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        pass  # damaged: its WAL is kept aside with it, as it is


def _free_name(path: Path, suffixes: tuple[str, ...] = ()) -> Path:
    """``path``, or ``path-2``, ``path-3``...: the first that is not there, nor with any of
    ``suffixes`` (a restore again in the same second never replaces an earlier aside)."""
    for n in itertools.count(1):
        name = path if n == 1 else path.with_name(f"{path.name}-{n}")
        if not any(Path(f"{name}{suffix}").exists() for suffix in ("", *suffixes)):
            return name
    raise AssertionError("unreachable")


def _stage_results(source: Path, home: Path, skipped: list[str]) -> Path:
    """The backup's results copied beside the results folder ``home``, with the modes the
    service gives results (outputs.py), whatever modes the backup's files have."""
    staged = home.with_name(home.name + RESTORING)
    _remove_staged(staged)  # what an interrupted restore left
    try:
        _copy_tree(source, staged, skipped, (outputs.FILE_MODE, outputs.DIR_MODE))
        _sync_tree(staged)
    except BaseException as exc:
        _remove_staged(staged)
        if isinstance(exc, BackupError):
            raise BackupError(f"{exc}; nothing was changed") from None
        raise
    return staged


def _swap_results(staged: Path, home: Path, stamp: str) -> str | None:
    """The staged results in place of ``home``, which is kept aside beside it (a link to
    it in the data dir stays as it is)."""
    aside = None
    if home.exists() or home.is_symlink():
        aside = _free_name(home.with_name(f"{home.name}.before-restore-{stamp}"))
        home.rename(aside)
    staged.rename(home)
    _sync(home.parent)
    return str(aside) if aside else None


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", *SIDECARS):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _read_sqlite(source: Path, target: Path) -> None:
    """What a reader of ``source`` sees, its -wal included, written to ``target`` by
    SQLite's online backup; ``source`` is opened read-only and left as it is. A file
    that cannot be read so (a -wal beside it in a folder this user cannot write) is
    refused: its main file alone may lack the last jobs."""
    try:
        src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=15)
    except sqlite3.OperationalError as exc:
        raise BackupError(f"cannot read {source}: {exc}; nothing was changed") from None
    try:
        # Made first, so that a folder this user cannot write is said as such (OSError).
        with open(target, "xb"):
            pass
        dst = sqlite3.connect(target)
        try:
            src.backup(dst, pages=STEP_PAGES)
        finally:
            dst.close()
    except sqlite3.OperationalError as exc:
        wal = [f"{source.name}{s}" for s in SIDECARS if Path(f"{source}{s}").exists()]
        beside = f" with {' and '.join(wal)} beside it" if wal else ""
        raise BackupError(
            f"cannot read {source}{beside}: {exc}; restore from a folder this user can write "
            "(SQLite writes there to read a -wal), or from a backup. Nothing was changed"
        ) from None
    finally:
        src.close()


def _no_node_runs(conn: sqlite3.Connection) -> None:
    """The restored queue's nodes marked stopped (as a clean stop leaves them): the
    processes in the backup's rows work on no restored database."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if NODE_TABLE in tables:
        with conn:
            conn.execute(NODES_STOPPED.format(schema=""))


def _count_jobs(path: Path) -> int | None:
    conn = sqlite3.connect(path)
    try:
        return _job_count(conn)
    finally:
        conn.close()


def _check_dump(dump: Path) -> None:
    listed, _ = _pg_command("pg_restore", "")
    check = subprocess.run([listed[0], "--list", str(dump)], capture_output=True, text=True)
    if check.returncode != 0:
        raise BackupError(f"{dump} is not a usable dump ({check.stderr.strip()}); nothing changed")


def _restore_postgres(dump: Path, url: str, stamp: str) -> tuple[str | None, int | None]:
    """The dump in place of the ``public`` schema, which is kept under another name.

    All in one transaction, run by psql: the rename, a new ``public``, the dump's
    statements (pg_restore writes them out), the check that what they made is a queue
    (_not_a_queue, asked through psql inside the transaction), and COMMIT, sent only once
    all that went through. Whatever stops it first (an error, a dump of another database,
    a kill here, a power cut here or on the server) ends the session without COMMIT, and
    the server rolls all of it back.
    """
    script_command, _ = _pg_command("pg_restore", "")
    psql_command, env = _pg_command("psql", url)
    with _postgres(url) as conn:
        had_tables = conn.execute("SELECT to_regclass('public.job') IS NOT NULL").fetchone()[0]
        names = {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace")}
    aside = None
    begin = "BEGIN;\n"
    if had_tables:
        base = f"momentry_before_restore_{stamp.lower()}"
        aside = next(
            name
            for name in (base if n == 1 else f"{base}_{n}" for n in itertools.count(1))
            if name not in names
        )
        begin += f"ALTER SCHEMA public RENAME TO {aside};\nCREATE SCHEMA public;\n"
    problem, jobs = "", None
    with tempfile.TemporaryFile() as script_err, tempfile.TemporaryFile() as psql_err:
        psql = subprocess.Popen(
            # Unaligned rows without headers: the check's answers, one line each.
            [
                *psql_command,
                *("--no-psqlrc", "--quiet", "--no-align", "--tuples-only"),
                *("--set=ON_ERROR_STOP=1", "--file=-"),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=psql_err,
        )
        # psql's output read as it comes: the dump's statements print lines too (setval),
        # and a full pipe would stop psql while this writes to it.
        lines: queue.Queue[bytes] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(psql.stdout, lines), daemon=True)
        reader.start()
        script = subprocess.Popen(
            # The queue's schema alone: a dump taken by an earlier version also holds the
            # schemas restores set aside, which are there already.
            [script_command[0], "--no-owner", "--schema=public", "--file=-", str(dump)],
            stdout=subprocess.PIPE,
            stderr=script_err,
        )
        assert psql.stdin and psql.stdout and script.stdout  # all PIPEs
        try:
            psql.stdin.write(begin.encode())
            shutil.copyfileobj(script.stdout, psql.stdin)
            if script.wait() == 0:
                problem, jobs = _check_restored(psql.stdin, lines)
                if not problem:
                    psql.stdin.write(b"COMMIT;\n")
        except BrokenPipeError:
            pass  # psql stopped at an error: its message says which
        finally:
            with contextlib.suppress(BrokenPipeError):
                psql.stdin.close()  # the end of the script: without COMMIT, a rollback
            script.kill()  # it ended already, unless psql stopped first
            script.wait()
            script.stdout.close()
            psql.wait()
            reader.join()
            psql.stdout.close()
        if script.returncode or psql.returncode:
            said = []
            for stream in (script_err, psql_err):
                stream.seek(0)
                said.append(stream.read().decode(errors="replace").strip())
            detail = "; ".join(filter(None, said)) or f"exit {script.returncode or psql.returncode}"
            raise BackupError(f"pg_restore failed, nothing changed: {detail}")
    if problem:
        raise BackupError(f"{dump} is not a usable backup ({problem}); nothing was changed")
    return (f"schema {aside}" if aside else None), jobs


ANSWER = "momentry-check:"  # marks the check's answers among what psql prints


def _read_lines(stream: Any, lines: queue.Queue[bytes]) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(b"")  # the end: psql exited


def _check_restored(to_psql: Any, lines: queue.Queue[bytes]) -> tuple[str, int | None]:
    """Whether the restored ``public`` schema is a queue (_not_a_queue), asked through
    psql inside its transaction; and its jobs. ("", None) when psql stopped meanwhile: its
    exit code and message then say why."""

    def ask(query: str) -> str | None:
        # The dump set search_path to '': names are written with their schema.
        to_psql.write(f"SELECT '{ANSWER}' || coalesce(({query})::text, '');\n".encode())
        to_psql.flush()
        while line := lines.get():
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(ANSWER):
                return text[len(ANSWER) :]
        return None

    listed = ask(
        "SELECT string_agg(tablename, ' ') FROM pg_catalog.pg_tables WHERE schemaname = 'public'"
    )
    if listed is None:
        return "", None
    tables = set(listed.split())
    version = None
    if VERSION_TABLE in tables:
        version = ask(f"SELECT max(version) FROM public.{VERSION_TABLE}")
    problem = _not_a_queue(tables, version)
    if problem:
        return problem, None
    if NODE_TABLE in tables:  # as _no_node_runs: no node of the dump runs on it
        to_psql.write(f"{NODES_STOPPED.format(schema='public.')};\n".encode())
    jobs = ask("SELECT count(*) FROM public.job")
    return "", int(jobs) if jobs else None


NODE_TABLE = store.Node._meta.table_name


NODES_STOPPED = f"UPDATE {{schema}}{NODE_TABLE} SET last_seen = 0"


# The tables a queue has from its first schema version on, and where the version is kept.

VERSION_TABLE = store.SchemaVersion._meta.table_name


QUEUE_TABLES = (
    VERSION_TABLE,
    *(
        model._meta.table_name
        for model in (store.QueueState, store.MediaFile, store.Job, store.ProcessorRun)
    ),
)


def _not_a_queue(tables: Collection[str], version: object) -> str:
    """Why a database (SQLite's file, PostgreSQL's restored schema) is not a queue this
    service can run on, given its tables and its schema version; "" when it is one. A
    queue of an older version is one: the service brings it up to date at its start."""
    missing = [name for name in QUEUE_TABLES if name not in tables]
    if missing:
        return f"not a momentry-edge queue: it has no table {', '.join(missing)}"
    try:
        number = int(str(version))
    except ValueError:
        number = 0
    if number < 1:
        return "not a momentry-edge queue: it records no schema version"
    if number > len(store.MIGRATIONS):
        return (
            f"its schema version is {number}, newer than this momentry-edge's "
            f"{len(store.MIGRATIONS)}: upgrade momentry-edge to restore it"
        )
    return ""


def _sqlite_not_a_queue(conn: sqlite3.Connection) -> str:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    version = None
    if VERSION_TABLE in tables:
        version = conn.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()[0]
    return _not_a_queue(tables, version)
