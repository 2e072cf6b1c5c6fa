"""Backups of the queue database (and results): taken, kept in crash-safe folders, pruned."""

# One piece (~780 lines): taking a backup, its crash-safe folders and the copy and
# sync helpers restore uses too.

# A backup is a folder (``<data_dir>/backups/<UTC time>/`` unless given) holding
# ``momentry.db`` (SQLite, copied with SQLite's online backup API while the service
# runs) or ``momentry.pgdump`` (PostgreSQL, ``pg_dump`` custom format), the settings
# file in use (``momentry.toml``), ``results/`` when asked, and ``manifest.json``,
# written last: a folder without it is not a backup. A folder rather than a .tar.gz:
# the copy is written straight into it with no second pass to pack it, restore checks
# the database where it lies, and rsync or Time Machine copy only what changed.
#
# A backup is written into ``<folder>.partial`` and renamed into place once it is whole
# and on disk (into an empty folder already there, which cannot be renamed onto, through
# ``STAGING`` inside it: see _claim_named), and a restore copies into ``<name>.restoring``
# first: a crash at any step leaves either what was there before or the finished result,
# and a leftover with one of these names, which is never taken for a backup and is
# removed later ("what a crash left", below, says when).

from __future__ import annotations

import contextlib
import fcntl  # POSIX (macOS, Linux): the platforms this service runs on
import itertools
import json
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import peewee as pw

from .. import __version__, durable, redact, store, trees
from ..clock import iso
from ..config import Config
from ..events import bus

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
# Seconds a scheduled backup's pg_dump waits for a table another session has locked: then
# it is skipped with an alert, rather than waiting unseen with the next ones held back.
SCHEDULED_LOCK_WAIT = 10.0
# Seconds pg_dump is given to end on SIGTERM (it cancels its query on the server) when a
# stop cuts its backup short, before SIGKILL.
STOP_GRACE = 5.0
MB = 2**20


class BackupError(Exception):
    """A backup or restore that cannot be done; the message says why and what to do."""


class BackupStopped(BackupError):
    """A backup cut short by ``stop`` (the service stopping); its unfinished folder is gone."""


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


def backups_dir(data_dir: Path) -> Path:
    return data_dir / "backups"


# -- backup ---------------------------------------------------------------------------------------


def take(
    cfg: Config,
    dest: Path | None = None,
    *,
    results: bool = False,
    scheduled: bool = False,
    stop: threading.Event | None = None,
) -> Backup:
    """Copy the database (consistently, while the service runs), the settings, and results.
    Once ``stop`` is set, the copy ends (BackupStopped) and leaves nothing behind."""
    try:
        return _take(cfg, dest, results, scheduled, stop)
    except OSError as exc:  # one no step below expected (a folder on the way unreadable...)
        raise _failed("cannot take the backup", exc) from None


def _take(
    cfg: Config, dest: Path | None, results: bool, scheduled: bool, stop: threading.Event | None
) -> Backup:
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
            # A scheduled one does not wait for long: no one watches it.
            lock_wait = SCHEDULED_LOCK_WAIT if scheduled else None
            _dump_postgres(cfg.service.database_url, copy, lock_wait, stop)
        else:
            kind, copy = "sqlite", work / SQLITE_NAME
            jobs = _copy_sqlite(sqlite_file, copy, stop)
        if cfg.source is not None:
            shutil.copy2(cfg.source, work / SETTINGS_NAME)
            os.chmod(work / SETTINGS_NAME, 0o600)  # it may hold a database's password
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
    return BackupError(f"{what}: {exc.strerror or exc}" + (f" ({_short(path)})" if path else ""))


def _short(path: object, keep: int = 100) -> str:
    """A path for a message: one nested thousands of folders deep, cut in its middle."""
    text = os.fsdecode(path) if isinstance(path, str | bytes | os.PathLike) else str(path)
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


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
    trees.remove(work)


def _remove_path(path: Path) -> None:
    trees.remove(path)


def _unfinished(folder: Path) -> bool:
    """A backup cut off before it was whole: its .partial folder, or a folder it was being
    written into (STAGING there, and no manifest yet)."""
    if folder.name.endswith(PARTIAL):
        return True
    return (folder / STAGING).exists() and not (folder / MANIFEST).exists()


def scheduled(cfg: Config, stop: threading.Event | None = None) -> Backup | None:
    """The periodic backup: take one, then keep only the newest ``backup_keep`` scheduled ones.
    ``stop``: the service's stop, which cuts it short."""
    try:
        backup = take(cfg, scheduled=True, stop=stop)
    except BackupStopped as exc:
        # No alert: the stop was asked for.
        log.warning("scheduled backup cut short by the stop (%s); its folder is removed", exc)
        return None
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
    for top, _, names in trees.walk(path):
        total += block
        for name in names:
            with contextlib.suppress(OSError):
                entry = os.lstat(os.path.join(top, name))
                if stat.S_ISREG(entry.st_mode):
                    total += _blocks(entry.st_size, block)
    return total


def _postgres_size(cfg: Config) -> int:
    database = store.open_database(cfg.service.database_url, cfg.data_dir)
    try:
        with database.connection_context():
            row = database.execute_sql("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0])
    except pw.DatabaseError as exc:
        raise BackupError(f"cannot reach the database: {exc}") from None
    finally:
        database.close_all()  # type: ignore[attr-defined]


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


def last_backup(data_dir: Path) -> dict[str, Any] | None:
    """The newest complete backup in the data dir's backups folder, as the status shows it."""
    found = _complete(backups_dir(data_dir))
    if not found:
        return None
    folder, manifest = max(found, key=lambda i: i[1].get("created_at", 0))
    created = manifest.get("created_at")
    return {
        "folder": str(folder),
        "created_at": iso(created) if isinstance(created, int | float) else None,
        "scheduled": bool(manifest.get("scheduled")),
    }


def taken(data_dir: Path) -> list[Path]:
    """The backups in <data_dir>/backups, oldest first."""
    return sorted(path for path, _ in _complete(backups_dir(data_dir)))


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
        trees.remove(path)
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
    for folder, _, names in trees.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                _sync_file(path)
        _sync(folder)


def _copy_tree(
    source: Path, target: Path, skipped: list[str], modes: tuple[int, int] | None = None
) -> None:
    """Copy the folder ``source`` (followed if a link) to the new folder ``target``: its
    folders and regular files, at any depth (a loop, not recursion). Links in it are
    neither copied nor followed, only listed in ``skipped``: the service writes none
    (duplicates are hard links), and one followed would bring in what it points at
    (/etc/shadow, another whole folder). ``modes``: the (file, folder) modes to give, else
    each keeps its own. An OSError names the path."""
    folders = [(str(source), str(target))]  # each folder and its copy, in the order made
    try:
        os.mkdir(target)
    except OSError as exc:
        raise _failed(f"cannot copy {source}", exc) from None
    for here, there in folders:  # grows as folders are found
        try:
            with os.scandir(here) as entries:
                found = sorted(entries, key=lambda e: e.name)
        except OSError as exc:
            raise _failed(f"cannot copy {_short(here)}", exc) from None
        for entry in found:
            copy = os.path.join(there, entry.name)
            try:
                if entry.is_dir(follow_symlinks=False):
                    os.mkdir(copy)
                    folders.append((entry.path, copy))
                elif not entry.is_file(follow_symlinks=False):
                    skipped.append(entry.path)  # a link, a socket, a device...
                else:
                    shutil.copy2(entry.path, copy, follow_symlinks=False)
                    if modes:
                        os.chmod(copy, modes[0])
            except OSError as exc:
                raise BackupError(
                    f"cannot copy {_short(entry.path)} to {_short(copy)}: {exc.strerror}"
                ) from None
    for here, there in reversed(folders):  # a folder's times once nothing more goes in it
        try:
            if modes:
                os.chmod(there, modes[1])
            else:
                shutil.copystat(here, there)
        except OSError as exc:
            raise _failed(f"cannot copy {_short(here)}", exc) from None


def sqlite_path(cfg: Config) -> Path | None:
    """The SQLite file the service uses, or None on PostgreSQL; nothing is made."""
    return store.sqlite_file(cfg.service.database_url, cfg.data_dir)


def _copy_sqlite(source: Path, target: Path, stop: threading.Event | None = None) -> int | None:
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

        def each_step(status: int, remaining: int, total: int) -> None:
            # Raised here, it ends the copy between two steps (sqlite3 passes it on).
            if stop is not None and stop.is_set():
                raise BackupStopped(f"the copy of {source} was stopped, {remaining} pages short")

        try:
            src.backup(dst, pages=STEP_PAGES, progress=each_step)
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
    """The tool's command line and environment: the URL without its password, which goes
    in the environment (PGPASSWORD), readable by this account alone, not by ps."""
    path = shutil.which(tool)
    if path is None:
        raise BackupError(
            f"{tool} is not installed; PostgreSQL backups need PostgreSQL's client tools "
            "(Debian: apt install postgresql-client; macOS: brew install libpq) "
            "matching the server's major version"
        )
    url, password = redact.pg_password(url)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    return [path, "--dbname", url], env


def _dump_postgres(
    url: str, target: Path, lock_wait: float | None = None, stop: threading.Event | None = None
) -> None:
    """``lock_wait``: seconds pg_dump waits for the share lock of each table it copies
    (another session's ALTER, TRUNCATE or VACUUM FULL holds it) before it gives up.
    ``stop``: once set, pg_dump is ended (BackupStopped)."""
    command, env = _pg_command("pg_dump", url)
    # pg_dump reads in one repeatable-read snapshot; writers go on meanwhile. The queue
    # alone: not the schemas earlier restores set aside, which a restore would make again.
    command += ["--format=custom", "--no-owner", "--schema=public", "--file", str(target)]
    if lock_wait is not None:
        command.append(f"--lock-wait-timeout={round(lock_wait * 1000)}")
    returncode, stderr = _run(command, env, stop)
    if returncode != 0:
        said = "; ".join(stderr.split("\n")).strip("; ")
        if lock_wait is not None and "LOCK TABLE" in said:
            raise BackupError(
                f"pg_dump could not lock a table to copy within {lock_wait:g} s, another "
                f"session holds it ({said}); the next scheduled backup tries again"
            )
        raise BackupError(f"pg_dump failed: {said}")


def _run(command: list[str], env: dict[str, str], stop: threading.Event | None) -> tuple[int, str]:
    """Run ``command`` to its end, or until ``stop`` is set: then end it (SIGTERM, SIGKILL
    after STOP_GRACE) and raise BackupStopped. Returns its exit code and stderr."""
    # stderr into a file: a pipe nobody reads while we wait could fill and hold it up.
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            while proc.poll() is None:
                if stop is None:
                    proc.wait()
                elif stop.wait(0.1):
                    raise BackupStopped(f"{Path(command[0]).name} was ended")
        finally:
            if proc.poll() is None:  # stopped, or an error here (KeyboardInterrupt...)
                proc.terminate()
                try:
                    proc.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        err.seek(0)
        return proc.returncode, err.read().decode(errors="replace")


# -- restore --------------------------------------------------------------------------------------


# -- the check at start-up ------------------------------------------------------------------------


def _problems(conn: sqlite3.Connection, pragma: str) -> str:
    rows = [row[0] for row in conn.execute(f"PRAGMA {pragma}").fetchall()]
    return "" if rows == ["ok"] else "; ".join(rows[:3])


def _job_count(conn: sqlite3.Connection) -> int | None:
    try:
        return conn.execute("SELECT count(*) FROM job").fetchone()[0]
    except sqlite3.OperationalError:
        return None  # no job table: a database the service never migrated
