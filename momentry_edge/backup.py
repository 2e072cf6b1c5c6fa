"""Backups of the queue database, restore, and the database check at start-up.

A backup is a folder (``<data_dir>/backups/<UTC time>/`` unless given) holding
``momentry.db`` (SQLite, copied with SQLite's online backup API while the service
runs) or ``momentry.pgdump`` (PostgreSQL, ``pg_dump`` custom format), the settings
file in use (``momentry.toml``), ``results/`` when asked, and ``manifest.json``,
written last: a folder without it is not a backup. A folder rather than a .tar.gz:
the copy is written straight into it with no second pass to pack it, restore checks
the database where it lies, and rsync or Time Machine copy only what changed.

A backup is written into ``<folder>.partial`` and renamed into place once it is whole
and on disk (into an empty folder already there, which cannot be renamed onto, through
``STAGING`` inside it: see _claim_named), and a restore copies into ``<name>.restoring``
first: a crash at any step leaves either what was there before or the finished result,
and a leftover with one of these names, which is never taken for a backup and is
removed later ("what a crash left", below, says when).
"""

from __future__ import annotations

import contextlib
import fcntl  # POSIX (macOS, Linux): the platforms this service runs on
import itertools
import json
import logging
import os
import queue
import shlex
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse, urlunparse

import peewee as pw

from . import __version__, db, durable, outputs, runfile
from .config import Config
from .events import bus

log = logging.getLogger(__name__)

SQLITE_NAME, DUMP_NAME, MANIFEST = "momentry.db", "momentry.pgdump", "manifest.json"
# A backup's folder until it is whole, and a restore's copies until they are put in place.
PARTIAL, RESTORING = ".partial", ".restoring"
# A backup into an existing empty folder (a mounted drive, a link to a folder), which
# cannot be renamed into place, is written in this folder inside it first.
STAGING = ".momentry-backup" + PARTIAL
SETTINGS_NAME = "momentry.toml"
# What a backup puts in its folder.
OURS = (SQLITE_NAME, DUMP_NAME, SETTINGS_NAME, "results", MANIFEST)
SIDECARS = ("-wal", "-shm", "-journal")  # SQLite's files beside a database
SQLITE_HEADER = b"SQLite format 3\x00"
# Pages copied per backup step (4 MiB at SQLite's default page size).
STEP_PAGES = 1024
MB = 2**20


class BackupError(Exception):
    """A backup or restore that cannot be done; the message says why and what to do."""


class DatabaseDamaged(Exception):
    """The queue database failed its check; the message names the file and the restore."""


@dataclass(frozen=True)
class Backup:
    path: Path
    database: str  # "sqlite" or "postgresql"
    size: int  # bytes of the database copy
    jobs: int | None  # jobs in the copy (SQLite; a dump is not opened)
    settings: bool
    results: bool
    seconds: float
    skipped: tuple[str, ...] = ()  # links in results, not copied

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


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


def backups_dir(data_dir: Path) -> Path:
    return data_dir / "backups"


# -- backup ---------------------------------------------------------------------------------------


def take(
    cfg: Config, dest: Path | None = None, *, results: bool = False, scheduled: bool = False
) -> Backup:
    """Copy the database (consistently, while the service runs), the settings, and results."""
    try:
        return _take(cfg, dest, results, scheduled)
    except OSError as exc:  # one no step below expected (a folder on the way unreadable...)
        raise _failed("cannot take the backup", exc) from None


def _take(cfg: Config, dest: Path | None, results: bool, scheduled: bool) -> Backup:
    started = time.monotonic()
    _check_data_dir(cfg.data_dir)
    sqlite_file = sqlite_path(cfg)
    if sqlite_file is not None and not sqlite_file.is_file():
        # Before anything is made: a backup of nothing leaves nothing behind.
        raise BackupError(f"there is no database at {sqlite_file} yet")
    parent = backups_dir(cfg.data_dir)
    remove_leftovers(parent)  # first: the room they take counts for this backup
    # A scheduled backup also leaves the room the queue keeps free for results.
    keep_free = cfg.queue.min_free_disk_mb * MB if scheduled else 0
    if dest is None:
        made = _make_folders(parent)
        try:
            folder, handle = _claim_new(parent)
        except BaseException:
            _remove_made(made)
            raise
        work = _partial(folder)
    else:
        folder = _named(dest)
        _refuse_inside_results(folder, cfg.data_dir)
        folder, work, handle, made = _claim_named(folder)
    try:
        _check_room(cfg, work, folder, results, keep_free)
        if sqlite_file is None:
            kind, copy, jobs = "postgresql", work / DUMP_NAME, None
            _dump_postgres(cfg.service.database_url, copy)
        else:
            kind, copy = "sqlite", work / SQLITE_NAME
            jobs = _copy_sqlite(sqlite_file, copy)
        if cfg.source is not None:
            shutil.copy2(cfg.source, work / SETTINGS_NAME)
        skipped: list[str] = []
        if results and (cfg.data_dir / "results").is_dir():
            # Result files are written to a temp name and renamed, so each copy is whole.
            _copy_tree(cfg.data_dir / "results", work / "results", skipped)
        backup = Backup(
            path=folder,
            database=kind,
            size=copy.stat().st_size,
            jobs=jobs,
            settings=cfg.source is not None,
            results=(work / "results").is_dir(),
            seconds=round(time.monotonic() - started, 3),
            skipped=tuple(skipped),
        )
        manifest = {
            **backup.as_dict(),
            "created_at": time.time(),
            "version": __version__,
            "scheduled": scheduled,
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        # On disk before the rename: after a power cut, a folder by the backup's name holds
        # every file whole, not a manifest over files the disk never got.
        _sync_tree(work)
        if work.parent == folder:
            _move_inside(work, folder)
        else:
            work.rename(folder)
            _sync(folder.parent)
    except BaseException as exc:
        _discard_work(work, folder)
        _remove_made(made)
        if isinstance(exc, OSError):
            raise _failed(f"cannot write the backup {folder}", exc) from None
        raise
    finally:
        os.close(handle)  # lets go of the lock
    return backup


def _check_data_dir(data_dir: Path) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise BackupError(f"the data dir {data_dir} is not a folder (service.data_dir)")


def _named(dest: Path) -> Path:
    """The DEST a user gave, absolute, its parent's ``..`` and links resolved (so that
    ``bk/b2/../b3`` makes no ``bk/b2``), its own name kept."""
    folder = dest.expanduser().absolute()
    if folder.name in ("", ".."):
        folder = folder.resolve()
    return Path(os.path.realpath(folder.parent)) / folder.name


def _refuse_inside_results(folder: Path, data_dir: Path) -> None:
    # A backup there would copy itself (with --results) and be served as results.
    root = Path(os.path.realpath(data_dir / "results"))
    if Path(os.path.realpath(folder)).is_relative_to(root):
        raise BackupError(
            f"{folder} is inside the results folder {root}, which a backup copies; "
            "give a DEST outside it"
        )


def _failed(what: str, exc: OSError) -> BackupError:
    """``what`` with the reason and the path an OSError names, for a message."""
    path = exc.filename2 if exc.filename2 is not None else exc.filename
    return BackupError(f"{what}: {exc.strerror or exc}" + (f" ({path})" if path else ""))


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; returns those made, for _remove_made."""
    missing = []
    there = folder
    while not (there.exists() or there.is_symlink()):
        missing.append(there)
        there = there.parent
    if not there.is_dir():
        raise BackupError(f"{there} is not a folder")
    made: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue  # made meanwhile
        except OSError as exc:
            _remove_made(made)
            raise BackupError(f"{path.parent} is not writable ({exc.strerror})") from None
        made.append(path)
    return made


def _remove_made(made: list[Path]) -> None:
    for path in reversed(made):
        with contextlib.suppress(OSError):
            path.rmdir()  # only while empty: what another process put there stays


def _move_inside(work: Path, folder: Path) -> None:
    """Move the finished backup from ``work`` into ``folder``, the manifest last: up to
    then ``folder`` holds ``work``, which marks it unfinished (_unfinished)."""
    names = sorted(p.name for p in work.iterdir() if p.name != MANIFEST)
    for name in [*names, MANIFEST]:
        os.rename(work / name, folder / name)
    _sync(folder)
    with contextlib.suppress(OSError):
        work.rmdir()  # left empty beside the manifest, it marks nothing


def _discard_work(work: Path, folder: Path) -> None:
    """Remove what a backup that failed wrote, in ``work`` and (written inside the folder
    the user gave) what it moved into ``folder`` before its manifest."""
    if work.parent == folder and not (folder / MANIFEST).exists():
        for name in OURS:
            _remove_path(folder / name)
    shutil.rmtree(work, ignore_errors=True)


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _unfinished(folder: Path) -> bool:
    """A backup cut off before it was whole: its .partial folder, or a folder it was being
    written into (STAGING there, and no manifest yet)."""
    if folder.name.endswith(PARTIAL):
        return True
    return (folder / STAGING).exists() and not (folder / MANIFEST).exists()


def scheduled(cfg: Config) -> Backup | None:
    """The periodic backup: take one, then keep only the newest ``backup_keep`` scheduled ones."""
    try:
        backup = take(cfg, scheduled=True)
    except BackupError as exc:
        log.warning("scheduled backup skipped: %s", exc)
        bus.publish("backup.skipped", reason=str(exc))  # an operator alert
        return None
    removed = prune(backups_dir(cfg.data_dir), cfg.service.backup_keep)
    log.info(
        "backup written to %s (%d bytes, %.1f s)%s",
        backup.path,
        backup.size,
        backup.seconds,
        f"; removed {len(removed)} older" if removed else "",
    )
    return backup


def estimate(cfg: Config, results: bool = False, block: int = 1) -> int:
    """Bytes a backup takes, at most: the database (with its WAL; on PostgreSQL its size on
    the server, which the compressed dump does not exceed), the settings, the results.
    Each file and folder counted in whole ``block``s, as the disk written to stores them."""
    sqlite_file = sqlite_path(cfg)
    if sqlite_file is None:
        size = _blocks(_postgres_size(cfg), block)
    else:
        wal = sqlite_file.with_name(sqlite_file.name + "-wal")
        size = _tree_size(sqlite_file, block) + _tree_size(wal, block)
    if cfg.source is not None:
        size += _tree_size(cfg.source, block)
    if results:
        size += _tree_size(cfg.data_dir / "results", block)
    return size + block  # the backup's folder


def _check_room(cfg: Config, work: Path, folder: Path, results: bool, keep_free: float) -> None:
    """Measured on the folder being written (so on the drive mounted at DEST, not beside)."""
    usage = os.statvfs(work)
    free = usage.f_bavail * usage.f_frsize
    need = estimate(cfg, results, usage.f_frsize)
    if free - need >= keep_free:
        return
    said = f"a backup needs up to {need / MB:,.1f} MB and the disk of {folder} has "
    said += f"{free / MB:,.1f} MB free"
    if keep_free:
        raise BackupError(
            f"{said}; it would leave less than queue.min_free_disk_mb = {keep_free / MB:,.0f} MB"
        )
    raise BackupError(f"{said}; free some space or give another DEST")


def _blocks(size: int, block: int) -> int:
    return -(-size // block) * block


def _tree_size(path: Path, block: int) -> int:
    """The bytes the file or folder ``path`` takes copied, in whole blocks (a folder one
    block, and each file in it rounded up: many small results take a block each); links
    count nothing, as they are not copied. Files gone meanwhile count nothing either."""
    try:
        st = path.stat()  # ``path`` itself followed: the data dir's results may be a link
    except OSError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return _blocks(st.st_size, block)
    if not stat.S_ISDIR(st.st_mode):
        return 0
    total = 0
    for top, _, names in os.walk(path):
        total += block
        for name in names:
            with contextlib.suppress(OSError):
                entry = os.lstat(os.path.join(top, name))
                if stat.S_ISREG(entry.st_mode):
                    total += _blocks(entry.st_size, block)
    return total


def _postgres_size(cfg: Config) -> int:
    database = db.open_database(cfg.service.database_url, cfg.data_dir)
    try:
        with database.connection_context():
            row = database.execute_sql("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0])
    except pw.DatabaseError as exc:
        raise BackupError(f"cannot reach the database: {exc}") from None
    finally:
        database.close_all()


def prune(folder: Path, keep: int) -> list[Path]:
    """Remove scheduled backups beyond the newest ``keep``; backups taken by hand stay."""
    ours = [(m, p) for p, m in _complete(folder) if m.get("scheduled")]
    ours.sort(key=lambda item: (item[0].get("created_at", 0), item[1].name))
    old = [path for _, path in ours[: max(0, len(ours) - keep)]]
    return [path for path in old if _discard(path)]


def _discard(path: Path) -> bool:
    """Remove the backup at ``path``: first renamed to its .partial name, so that a crash
    halfway leaves a leftover that goes later, never a backup short of its files."""
    doomed = _partial(path)
    _remove_leftover(doomed)  # a leftover by that name would stop the rename
    try:
        path.rename(doomed)
    except OSError as exc:
        log.warning("cannot remove the old backup %s: %s", path, exc)
        return False
    (doomed / MANIFEST).unlink(missing_ok=True)  # first, for listings by manifest alone
    _remove_leftover(doomed)
    return True


def latest(data_dir: Path) -> Path | None:
    """The newest complete backup in the data dir's backups folder."""
    found = sorted(_complete(backups_dir(data_dir)), key=lambda i: i[1].get("created_at", 0))
    return found[-1][0] if found else None


def _complete(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The backups in ``folder`` with their manifests; a .partial folder is none, even with
    its manifest written (a crash before its rename, or while it was being removed)."""
    found = []
    for path in folder.glob("*/" + MANIFEST) if folder.is_dir() else []:
        if path.parent.name.endswith(PARTIAL):
            continue
        try:
            found.append((path.parent, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            continue  # not one of ours, or half-written by hand: never removed
    return found


# -- what a crash left ----------------------------------------------------------------------------
# Whether a backup still writes a .partial folder is told by a lock, never by the folder's
# age: a backup holds flock() on its folder from just after making it until it is renamed
# into place, and the kernel lets go when the process ends, however it ends (kill -9, a
# power cut). So a .partial folder no process holds is a leftover, removed by the next
# backup into the same folder and by the service's sweep; one held is a backup running
# now, in this process or another (the service's scheduled one, `momentry-edge backup`).
# No age, no clock: a backup of many results may take hours, and clocks jump. flock
# conflicts between two descriptors of one process too, so the sweep and a scheduled
# backup in the same service tell each other apart the same way. Where the filesystem
# cannot lock (some network ones), a backup goes on unlocked and nothing is removed there.


def _partial(folder: Path) -> Path:
    return folder.with_name(folder.name + PARTIAL)


def _claim(work: Path) -> int:
    """Make the folder ``work`` and lock it; returns its descriptor, whose close lets go.

    FileExistsError when the folder is there already (its parent must be). Between the
    mkdir and the lock, a removal (which locks first) may take the folder: the check after
    the lock finds that.
    """
    try:
        work.mkdir()
    except FileExistsError:
        raise
    except OSError as exc:
        raise BackupError(f"{work.parent} is not writable ({exc.strerror})") from None
    try:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        raise BackupError(f"{work} was removed as the backup began; try again") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError(f"{work} is being removed as the backup began; try again") from None
        except OSError as exc:
            log.warning("cannot lock %s (%s): if this backup is cut off, it stays", work, exc)
        if not _same_file(fd, work):
            raise BackupError(f"{work} was removed as the backup began; try again")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _claim_new(parent: Path) -> tuple[Path, int]:
    """A new folder named for the time in ``parent``, and its claimed .partial folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in itertools.count(1):
        folder = parent / (stamp if n == 1 else f"{stamp}-{n}")
        if folder.exists():
            continue
        try:
            handle = _claim(_partial(folder))
        except FileExistsError:
            continue  # another backup started in the same second
        if not folder.exists():
            return folder, handle
        _partial(folder).rmdir()  # one of the same name was placed just before: the next
        os.close(handle)
    raise AssertionError("unreachable")


def _claim_named(folder: Path) -> tuple[Path, Path, int, list[Path]]:
    """The folder a user gave, the claimed folder its backup is written in, the lock, and
    the parents made for it (for _remove_made).

    A new DEST: written beside it (DEST.partial) and renamed to it, in one step. An empty
    folder already there (a mounted drive, a link to a folder) cannot be renamed onto:
    written in it (STAGING) and moved out of that, the manifest last.
    """
    if folder.exists():
        if not folder.is_dir():
            raise BackupError(f"{folder} exists and is not an empty folder; give a new one")
        work = folder / STAGING
        # What a backup cut off there left (its staging folder, what it moved out of it).
        also = [] if (folder / MANIFEST).exists() else [folder / name for name in OURS]
        _remove_leftover(work, also)
        made: list[Path] = []
    else:
        if folder.is_symlink():
            raise BackupError(f"{folder} is a link to nothing; give a new folder")
        work = _partial(folder)
        _remove_leftover(work)
        made = _make_folders(folder.parent)
    try:
        if work.parent == folder and any(p != work for p in folder.iterdir()):
            raise BackupError(f"{folder} exists and is not an empty folder; give a new one")
        try:
            handle = _claim(work)
        except FileExistsError:
            raise BackupError(
                f"a backup into {folder} is under way ({work} is held); wait for it or give "
                "another DEST"
            ) from None
    except BaseException:
        _remove_made(made)
        raise
    return folder, work, handle, made


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove the .partial folders in ``folder`` that no backup holds; returns them."""
    try:
        found = sorted(folder.glob("*" + PARTIAL))
    except OSError:
        return []
    return [path for path in found if _remove_leftover(path)]


def _remove_leftover(path: Path, also: Collection[Path] = ()) -> bool:
    """Remove the folder ``path`` unless a process holds it locked; True when removed.
    ``also``: paths removed first, under the lock (what a backup moved out of it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False  # gone, or not a folder (a file, a link): not ours
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a backup is writing it
        except OSError as exc:
            log.warning("cannot tell whether a backup is writing %s (%s): kept", path, exc)
            return False
        if not _same_file(fd, path):
            return False  # removed and made again meanwhile: that one is someone else's
        for other in also:
            _remove_path(other)
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)
    if path.exists():
        log.warning("cannot remove %s, left by a backup that was cut off", path)
        return False
    log.info("removed %s, left by a backup that was cut off", path)
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = path.lstat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _sync(path: str | Path) -> None:
    """Flush a folder's entries (a rename in it) to disk; best effort, as not every
    filesystem can."""
    with contextlib.suppress(OSError):
        durable.flush_folder(path)


def _sync_file(path: str | Path) -> None:
    try:
        durable.flush_file(path)
    except OSError as exc:
        raise BackupError(f"cannot write {path} to disk: {exc}") from None


def _sync_tree(root: Path) -> None:
    """Flush every file under ``root`` (links are not followed), then each folder."""
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                _sync_file(path)
        _sync(folder)


def _copy_tree(
    source: Path, target: Path, skipped: list[str], modes: tuple[int, int] | None = None
) -> None:
    """Copy the folder ``source`` (followed if a link) to the new folder ``target``: its
    folders and regular files. Links in it are neither copied nor followed, only listed in
    ``skipped``: the service writes none (duplicates are hard links), and one followed
    would bring in what it points at (/etc/shadow, another whole folder). ``modes``: the
    (file, folder) modes to give, else each keeps its own. An OSError names the path."""
    try:
        os.mkdir(target)
        with os.scandir(source) as entries:
            found = sorted(entries, key=lambda e: e.name)
    except OSError as exc:
        raise _failed(f"cannot copy {source}", exc) from None
    for entry in found:
        there = target / entry.name
        if entry.is_dir(follow_symlinks=False):
            _copy_tree(Path(entry.path), there, skipped, modes)
            continue
        if not entry.is_file(follow_symlinks=False):
            skipped.append(entry.path)  # a link, a socket, a device...
            continue
        try:
            shutil.copy2(entry.path, there, follow_symlinks=False)
            if modes:
                os.chmod(there, modes[0])
        except OSError as exc:
            raise BackupError(f"cannot copy {entry.path} to {there}: {exc.strerror}") from None
    try:
        if modes:
            os.chmod(target, modes[1])
        else:
            shutil.copystat(source, target)
    except OSError as exc:
        raise _failed(f"cannot copy {source}", exc) from None


def sqlite_path(cfg: Config) -> Path | None:
    """The SQLite file the service uses, or None on PostgreSQL; nothing is made."""
    return db.sqlite_file(cfg.service.database_url, cfg.data_dir)


def _copy_sqlite(source: Path, target: Path) -> int | None:
    if not source.is_file():
        raise BackupError(f"there is no database at {source} yet")
    src = sqlite3.connect(source, timeout=15)
    try:
        # One read transaction across every step: each step copies from the same
        # snapshot, so the copy is consistent and writes made meanwhile do not restart
        # it. In WAL mode the service's writers never wait for this reader.
        src.execute("BEGIN")
        src.execute("SELECT count(*) FROM sqlite_master").fetchone()
        dst = sqlite3.connect(target)
        try:
            src.backup(dst, pages=STEP_PAGES)
            problems = _problems(dst, "quick_check")
            if problems:
                raise BackupError(f"the copy of {source} fails its check: {problems}")
            return _job_count(dst)
        finally:
            dst.close()
    except sqlite3.DatabaseError as exc:
        raise BackupError(f"cannot copy {source}: {exc}") from None
    finally:
        src.close()


def _pg_command(tool: str, url: str) -> tuple[list[str], dict[str, str]]:
    """The tool's path and a URL without its password (passed in the environment instead)."""
    path = shutil.which(tool)
    if path is None:
        raise BackupError(
            f"{tool} is not installed; PostgreSQL backups need PostgreSQL's client tools "
            "(Debian: apt install postgresql-client; macOS: brew install libpq) "
            "matching the server's major version"
        )
    parts = urlparse(url)
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = unquote(parts.password)
        netloc = parts.netloc.replace(f":{parts.password}@", "@", 1)
        url = urlunparse(parts._replace(netloc=netloc))
    return [path, "--dbname", url], env


def _dump_postgres(url: str, target: Path) -> None:
    command, env = _pg_command("pg_dump", url)
    # pg_dump reads in one repeatable-read snapshot; writers go on meanwhile.
    command += ["--format=custom", "--no-owner", "--file", str(target)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise BackupError(f"pg_dump failed: {done.stderr.strip()}")


# -- restore --------------------------------------------------------------------------------------


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
    refuse_if_running(cfg)
    target = sqlite_path(cfg)
    if target is not None and copy.name.endswith(".pgdump"):
        raise BackupError(f"{copy} is a PostgreSQL dump; this service uses SQLite ({target})")
    if target is None and not copy.name.endswith(".pgdump"):
        raise BackupError(f"{copy} is a SQLite database; this service uses PostgreSQL")
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
    if target is not None:
        made += _make_folders(target.parent)
    try:
        with _restore_lock(cfg.data_dir):
            _check_restore_room(copy if target is not None else None, target, results, cfg.data_dir)
            staged = []
            try:
                if target is not None:
                    staged.append(_stage_sqlite(copy, target))
                else:
                    _check_dump(copy)
                if results is not None:
                    staged.append(_stage_results(results, cfg.data_dir, skipped))
                # Nothing was changed up to here.
                if target is not None:
                    aside = _swap_sqlite(staged[0], target, stamp)
                    jobs, where = _count_jobs(target), str(target)
                else:
                    aside, jobs = _restore_postgres(copy, cfg.service.database_url, stamp)
                    where = _safe_url(cfg.service.database_url)
            except BaseException:
                for path in staged:
                    _remove_staged(path)
                raise
            results_aside = None
            if staged and staged[-1].name == f"results{RESTORING}":
                results_aside = _swap_results(staged[-1], cfg.data_dir, stamp)
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


def _check_restore_room(
    copy: Path | None, target: Path | None, results: Path | None, data_dir: Path
) -> None:
    """Room for the copies a restore makes (the database beside its place, the results in
    the data dir) on each disk they go to, before any is made: the databases and results
    they replace are renamed, which takes none."""
    wants = []
    if copy is not None and target is not None:
        wants.append((target.parent, copy))
    if results is not None:
        wants.append((data_dir, results))
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
        raise BackupError(f"cannot reach the database {_safe_url(url)}: {exc}") from None
    with conn:
        yield conn


@contextlib.contextmanager
def _restore_lock(data_dir: Path) -> Iterator[None]:
    """Held for a whole restore: a second one is refused, and the service's start leaves
    the copies a restore is making alone (remove_restore_leftovers)."""
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError(f"another restore into {data_dir} is running; wait for it") from None
        except OSError:
            pass  # a filesystem that cannot lock: the start then removes no copy either
        yield
    finally:
        os.close(fd)


def remove_restore_leftovers(cfg: Config) -> list[Path]:
    """Remove the copies a restore that was cut off left (the database copy, the results
    copy), unless a restore holds the data dir now; returns what was removed."""
    target = sqlite_path(cfg)
    found = [cfg.data_dir / f"results{RESTORING}"]
    if target is not None:
        staging = target.with_name(target.name + RESTORING)
        found += [Path(f"{staging}{suffix}") for suffix in ("", *SIDECARS)]
    found = [path for path in found if path.exists() or path.is_symlink()]
    if not found:
        return []
    fd = os.open(cfg.data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return []  # a restore is running (or the filesystem cannot tell)
    else:
        for path in found:
            _remove_staged(path)
            log.info("removed %s, left by a restore that was cut off", path)
        return found
    finally:
        os.close(fd)


def _remove_staged(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        _remove_sqlite(path)


def _stage_sqlite(copy: Path, target: Path) -> Path:
    """The backup's database copied beside ``target`` and checked there."""
    staging = target.with_name(target.name + RESTORING)
    _remove_sqlite(staging)  # what an interrupted restore left
    try:
        shutil.copyfile(copy, staging)
        _sync_file(staging)
        conn = sqlite3.connect(staging)
        try:
            problems = _problems(conn, "integrity_check") or _sqlite_not_a_queue(conn)
        finally:
            conn.close()
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


def _stage_results(source: Path, data_dir: Path, skipped: list[str]) -> Path:
    """The backup's results copied beside the results folder, with the modes the service
    gives results (outputs.py), whatever modes the backup's files have."""
    staged = data_dir / f"results{RESTORING}"
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


def _swap_results(staged: Path, data_dir: Path, stamp: str) -> str | None:
    current = data_dir / "results"
    aside = None
    if current.exists() or current.is_symlink():
        aside = _free_name(data_dir / f"results.before-restore-{stamp}")
        current.rename(aside)
    staged.rename(current)
    _sync(data_dir)
    return str(aside) if aside else None


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", *SIDECARS):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


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
            [script_command[0], "--no-owner", "--file=-", str(dump)],
            stdout=subprocess.PIPE,
            stderr=script_err,
        )
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
    jobs = ask("SELECT count(*) FROM public.job")
    return "", int(jobs) if jobs else None


# The tables a queue has from its first schema version on, and where the version is kept.
VERSION_TABLE = db.SchemaVersion._meta.table_name
QUEUE_TABLES = (
    VERSION_TABLE,
    *(model._meta.table_name for model in (db.QueueState, db.MediaFile, db.Job, db.ProcessorRun)),
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
    if number > len(db.MIGRATIONS):
        return (
            f"its schema version is {number}, newer than this momentry-edge's "
            f"{len(db.MIGRATIONS)}: upgrade momentry-edge to restore it"
        )
    return ""


def _sqlite_not_a_queue(conn: sqlite3.Connection) -> str:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    version = None
    if VERSION_TABLE in tables:
        version = conn.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()[0]
    return _not_a_queue(tables, version)


def _safe_url(url: str) -> str:
    parts = urlparse(url)
    if parts.password:
        return urlunparse(parts._replace(netloc=parts.netloc.replace(parts.password, "***", 1)))
    return url


# -- the check at start-up ------------------------------------------------------------------------


def connect_checked(cfg: Config) -> pw.Database:
    """Check the SQLite file, then open and migrate the database, as db.connect does.

    A damaged file raises DatabaseDamaged (never a traceback or a half-started
    service), whether the check finds it or SQLite says so while migrating.
    """
    path = sqlite_path(cfg)
    # What a restore that was cut off left; a restore running now holds the data dir.
    remove_restore_leftovers(cfg)
    if path is not None:
        check(path, cfg)
    try:
        return db.connect(cfg.service.database_url, cfg.data_dir, cfg.service.database_timeout)
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


def _problems(conn: sqlite3.Connection, pragma: str) -> str:
    rows = [row[0] for row in conn.execute(f"PRAGMA {pragma}").fetchall()]
    return "" if rows == ["ok"] else "; ".join(rows[:3])


def _job_count(conn: sqlite3.Connection) -> int | None:
    try:
        return conn.execute("SELECT count(*) FROM job").fetchone()[0]
    except sqlite3.OperationalError:
        return None  # no job table: a database the service never migrated
