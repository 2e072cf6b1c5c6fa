"""Ingest: which names are taken, registering files, and reconciling folders with the table.

A file arrives in one of three ways, and all of them go through ``Intake.admit``:

- the watcher (watcher.py) hands over a path once its size and mtime have settled;
- an upload hook calls ``POST /api/v1/files/register`` (``Intake.register``);
- a rescan (at start-up, every ``rescan_interval``, or on demand) walks the folders.

``admit`` stats the file first: a known file whose size, mtime, inode and ctime are
unchanged is recognised without reading it (``db.unchanged``). Otherwise it is probed
and fingerprinted outside any lock; then the record and, when the content is new, its
job are written in one transaction holding a per-path lock (SQLite: the write lock;
PostgreSQL: an advisory lock). So the hook, the watcher, a rescan and other nodes
racing on one file give one record and one job, and a crash never leaves a registered
file without its job.

Files known to be whole are taken many at a time: those whose writers closed them
or that were renamed into place (inotify's close and move events; the watcher hands
them over together to ``settled_closed``) and those a rescan finds last written more
than WRITING_GRACE ago. They are
fingerprinted but not probed, and recorded with their jobs ``BATCH`` to a
transaction. The probe (about 10 ms of a file, holding the GIL) would cap a bulk
drop at ~50 files/s; it runs instead when the job starts (``unusable``), which fills
in the file's metadata, or marks it ``rejected`` and fails the job with the reason
before any processor runs. Any other file goes through ``admit`` and its probe, which
tells an upload still under way (``Settling``) from a broken file; so does a file
registered through the API, whose answer gives the probe's verdict.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import stat as stat_module
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

import peewee as pw

from . import db, jobs
from .db import FileState, Job, JobStatus, MediaFile, fingerprint
from .errors import Conflict, Invalid
from .events import bus
from .media import EMPTY, MediaError, MediaInfo, MediaNotFoundError, is_transient, probe

log = logging.getLogger(__name__)

_NAMESPACE = uuid.UUID("5d1f6a63-8a3e-4f0e-9d9b-2f0c6f1e7a11")
# A path longer than this, or a component longer than NAME_MAX bytes, cannot name a file.
PATH_MAX, NAME_MAX = 4096, 255
# A file that does not probe yet and was written to less than this many seconds ago,
# by a writer not known to have closed it, is taken to be still arriving, not broken.
WRITING_GRACE = 60.0
# Closed files recorded (with their jobs) per transaction: few commits, and the write
# lock is held a fraction of a second (SQLite: ~0.2 s for 200 on 2 busy cores).
BATCH = 200

# Names upload clients give a file while it is still being written.
TEMP_SUFFIXES = (".part", ".filepart", ".tmp", ".crdownload", ".partial")
ABORTED = "upload did not finish (the upload hook sent upload_status other than 1)"
GONE = "gone from disk"
NOT_FOLLOWED = "a symlink, not followed (symlinks could lead out of the watched folder)"


class Outcome(enum.Enum):
    NEW = "new"  # first time this path is seen
    CHANGED = "changed"  # different content (or state) than the record had
    RESTORED = "restored"  # was missing or rejected, is back with the same content
    TOUCHED = "touched"  # its stat changed, its content (fingerprint) did not
    UNCHANGED = "unchanged"  # recognised by its stat (db.unchanged), not read at all


# The rescan's count each outcome adds to.
_COUNTED = {
    Outcome.NEW: "new",
    Outcome.CHANGED: "changed",
    Outcome.RESTORED: "changed",
    Outcome.TOUCHED: "unchanged",
    Outcome.UNCHANGED: "unchanged",
}


class Gone(Exception):
    """The file vanished (or turned into something else) before it could be registered."""


class Settling(Exception):
    """The file does not probe yet but was written to recently: look again later."""


@dataclass(frozen=True)
class Scan:
    """The deep scan to queue for an admitted file."""

    processors: tuple[str, ...]
    priority: int = db.PRIORITIES["normal"]
    options: dict[str, Any] = field(default_factory=dict)
    # Named by the caller: only an earlier job of exactly these processors counts as "done".
    explicit: bool = False


@dataclass(frozen=True)
class Admission:
    record: MediaFile
    outcome: Outcome
    job: Job | None
    job_created: bool

    @property
    def created(self) -> bool:
        """Something new was recorded or queued (HTTP 201 rather than 200)."""
        return self.job_created or self.outcome not in (Outcome.UNCHANGED, Outcome.TOUCHED)


@dataclass(frozen=True)
class _Observed:
    state: str
    reason: str | None
    info: MediaInfo | None
    fingerprint: str | None
    transient: bool = False  # rejected for a cause that can pass (see MediaFile.transient)


# -- identity ----------------------------------------------------------------------------------


def file_uuid_for(path: Path) -> str:
    """Stable per absolute path: the same path always names the same file."""
    return uuid.uuid5(_NAMESPACE, str(path)).hex


# -- names and paths ---------------------------------------------------------------------------


def normalize_extensions(extensions: Sequence[str]) -> tuple[str, ...]:
    """Lower case with a leading dot, so "MP4", "mp4" and ".mp4" all mean the same."""
    return tuple("." + e.lower().lstrip(".") for e in extensions if e.strip("."))


def ignored_reason(rel_path: PurePath, extensions: Sequence[str]) -> str | None:
    """Why a file at ``rel_path`` (relative to its watched folder) is not taken, or None."""
    hidden = [part for part in rel_path.parts[:-1] if part.startswith(".")]
    if hidden:
        return f"it is inside the hidden folder {hidden[0]!r}"
    name = rel_path.name
    if name.startswith("."):
        return "hidden files (dotfiles) are not taken"
    if name.startswith("~$"):
        return "temporary files (~$ prefix) are not taken"
    lower = name.lower()
    for suffix in TEMP_SUFFIXES:
        if lower.endswith(suffix):
            return f"{suffix} is a temporary or partial upload name; it is taken once renamed"
    if not lower.endswith(tuple(extensions)):
        return f"extension {PurePath(lower).suffix or '(none)'!r} is not in [ingest].extensions"
    try:
        str(rel_path).encode("utf-8")  # the folders on the way too: every path is stored
    except UnicodeEncodeError:
        return "the name is not valid UTF-8; rename the file"
    return None


def check_path(raw: str) -> None:
    """Invalid unless ``raw`` could name a file: no NUL, valid UTF-8, within the OS limits."""
    if not raw:
        raise Invalid("path is empty")
    if "\0" in raw:
        raise Invalid("path contains a NUL byte")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid("path is not valid UTF-8 (it contains a lone surrogate)") from None
    if len(encoded) >= PATH_MAX:
        raise Invalid(f"path is too long ({len(encoded)} bytes; the limit is {PATH_MAX - 1})")
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > NAME_MAX:
        raise Invalid(f"a name in the path is too long ({longest} bytes; the limit is {NAME_MAX})")


def resolve_in_watch(raw: str, watch_dirs: Sequence[Path]) -> tuple[Path, Path]:
    """The real path of ``raw`` and the watched folder that holds it, or Invalid."""
    check_path(raw)
    roots = [Path(os.path.realpath(w)) for w in watch_dirs]
    candidates = [Path(raw)] if os.path.isabs(raw) else [root / raw for root in roots]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        for root in roots:
            if real.is_relative_to(root) and real != root:
                return real, root
    raise Invalid(f"path {raw!r} is not inside a watched folder (after resolving symlinks)")


# -- the intake ----------------------------------------------------------------------------------


class Intake:
    """Turns paths in the watched folders into file records and, where due, jobs."""

    def __init__(
        self,
        watch: Sequence[Path],
        extensions: Sequence[str],
        settle_seconds: float,
        processors: Sequence[str],
        max_retries: int,
    ) -> None:
        self.watch = tuple(watch)
        self.extensions = normalize_extensions(extensions)
        self.settle_seconds = settle_seconds
        # An empty [ingest].processors list means: register files, queue nothing.
        self.default_scan = Scan(tuple(processors)) if processors else None
        self.max_retries = max_retries
        self._warned: set[str] = set()
        # Folders found that could not be listed (no permission): the watcher watches
        # them again once they can be.
        self.unreadable: set[str] = set()
        self._roots = self.roots()

    def roots(self) -> list[Path]:
        """The watched folders' real paths, resolved again (a folder may be mounted later)."""
        self._roots = [Path(os.path.realpath(w)) for w in self.watch]
        return self._roots

    def locate(self, path: str) -> tuple[Path, Path] | None:
        """(path, root) when ``path`` is a real path inside a watched folder with a taken name."""
        real = Path(path)
        for root in self._roots:
            if real.is_relative_to(root) and real != root:
                return (real, root) if self._taken(path, real.relative_to(root)) else None
        return None

    def _taken(self, path: str, rel: PurePath) -> bool:
        reason = ignored_reason(rel, self.extensions)
        if reason is not None and "UTF-8" in reason:
            self.warn_once(path, reason)
        return reason is None

    # -- the three ways in -------------------------------------------------------------------

    def register(
        self,
        path: Path,
        root: Path,
        *,
        upload_ok: bool = True,
        scan: bool = True,
        processors: list[str] | None = None,
        priority: int = db.PRIORITIES["normal"],
        options: dict[str, Any] | None = None,
    ) -> Admission:
        """The upload hook's way in: a name that is not taken, or no file, is a client error."""
        reason = ignored_reason(path.relative_to(root), self.extensions)
        if reason is not None:
            raise Invalid(f"{path.name}: not taken: {reason}")
        wanted = processors or (self.default_scan.processors if self.default_scan else ())
        request = None
        if scan and wanted:
            request = Scan(tuple(wanted), priority, options or {}, explicit=processors is not None)
        try:
            return self.admit(path, root, scan=request, explicit=True, upload_ok=upload_ok)
        except Gone as exc:
            raise Invalid(str(exc)) from None

    def settled(self, path: str, closed: bool = False) -> Admission | None:
        """The watcher's way in: ``path`` has kept its size and mtime for settle_seconds,
        or (``closed``) its writer has closed it.

        Raises Settling when it does not probe yet and may still be being written.
        """
        located = self.locate(path)
        if located is None or os.path.realpath(path) != path:
            return None  # a symlinked folder on the way: not followed
        try:
            return self.admit(
                *located, scan=self.default_scan, explicit=False, wait_if_young=not closed
            )
        except (Gone, Invalid):
            return None

    def settled_closed(
        self, paths: Sequence[str], now: float | None = None, written: Collection[str] = ()
    ) -> list[str]:
        """The watcher's way in for files known to be whole (closed by their writers, or
        renamed into place), taken together.

        Each is stat'ed and fingerprinted (not probed: see the module docstring); the
        records and their jobs are written ``BATCH`` to a transaction, and their events
        published after each commit. Returns the paths written to again meanwhile, for
        the watcher to wait for again. The jobs of those ``written`` (closed by a writer,
        not moved into place) start once the file has been quiet for settle_seconds: a
        resumed upload closes the file after each part, and some containers (MPEG-TS)
        read whole at every part.
        """
        now = time.time() if now is None else now
        found = []
        for path in paths:
            located = self.locate(path)
            if located is None or os.path.realpath(path) != path:
                continue  # a symlinked folder on the way: not followed
            try:
                found.append((*located, _stat_file(located[0])))
            except (Gone, Invalid):
                continue
        hold = {
            str(path): self.hold_until(st.st_mtime, now)
            for path, _, st in found
            if str(path) in written
        }
        again: list[str] = []
        for chunk in pw.chunked(found, BATCH):
            again += self._admit_whole(chunk, now, hold)[1]
        return again

    def hold_until(self, mtime: float, now: float) -> float:
        """When a file its writer closed has been quiet settle_seconds: counted from its
        last write, no later than now (a share's clock may run ahead)."""
        return min(mtime, now) + self.settle_seconds

    def _admit_whole(
        self,
        chunk: Sequence[tuple[Path, Path, os.stat_result]],
        now: float,
        hold: Mapping[str, float] | None = None,
    ) -> tuple[list[Admission], list[str]]:
        """Files known to be whole, one transaction's worth: (what was recorded, the
        paths written to meanwhile). Not probed; see the module docstring. A job of a
        path in ``hold`` starts no sooner than its time there."""
        hold = {name: until for name, until in (hold or {}).items() if until > now}
        database = MediaFile._meta.database
        names = [str(path) for path, _, _ in chunk]
        known = {r.path: r for r in MediaFile.select().where(MediaFile.path.in_(names))}
        looked = {}  # what the slow part (reading the samples) saw, outside the lock
        again, admissions, new = [], [], []
        for path, root, st in chunk:
            record = known.get(str(path))
            if _recognised_record(record, st, True, False):
                # Taken by another way in since the caller looked (a rescan counts it).
                admissions.append(Admission(record, Outcome.UNCHANGED, None, False))
                continue
            with contextlib.suppress(Gone):
                looked[str(path)] = (path, root, st, _glance(path, st))
        with bus.held(), db.write_transaction(database):
            _lock_paths(database, list(looked))
            current = {r.path: r for r in MediaFile.select().where(MediaFile.path.in_(names))}
            for name, (path, root, st, observed) in looked.items():
                fresh = _lstat(path)
                if fresh is None:
                    continue  # gone meanwhile
                if db.written(st, fresh):
                    again.append(name)  # written to while we looked
                    continue
                record = current.get(name)
                if record is None:
                    new.append(_fields(path, root, st, observed, now))
                    continue
                if _recognised_record(record, st, True, False):
                    # Taken by another way in meanwhile.
                    admissions.append(Admission(record, Outcome.UNCHANGED, None, False))
                    continue
                record, outcome = _write(record, path, root, st, _judged(record, observed), now)
                job, job_created = self._job_for(record, outcome, self.default_scan, False)
                if job is not None and name in hold:
                    jobs.hold(job, hold[name])  # a part more: quiet from this one
                admissions.append(Admission(record, outcome, job, job_created))
            admissions += self._insert_new(new, hold)
        for admission in admissions:  # once committed: a rollback would make them untrue
            self._announce(admission)
        for admission in admissions:
            changed = admission.outcome is not Outcome.UNCHANGED
            if changed and admission.job is None and needs_probe(admission.record):
                probe_pending(admission.record)  # no job to do it (e.g. restored, done before)
        return admissions, again

    def _insert_new(self, rows: list[dict[str, Any]], hold: Mapping[str, float]) -> list[Admission]:
        """Record files seen for the first time, and queue the default scan of those
        present (to start no sooner than their time in ``hold``): a few statements for
        all of them (inside the caller's transaction)."""
        if not rows:
            return []
        records = [MediaFile(**row) for row in rows]
        db.insert_many(records, key="path")  # written out: see db.insert_many
        queued: dict[int, Job] = {}
        scan = self.default_scan
        if scan is not None:
            present = [r for r in records if r.state == FileState.PRESENT]
            jobs_made = jobs.submit_new(
                present,
                scan.processors,
                priority=scan.priority,
                max_retries=self.max_retries,
                not_before=hold,
            )
            queued = {job.file_id: job for job in jobs_made}
        return [Admission(r, Outcome.NEW, queued.get(r.id), r.id in queued) for r in records]

    def reconcile(
        self, defer: Callable[[Path], None] | None = None, now: float | None = None
    ) -> dict[str, int]:
        """Bring the table in line with the folders: new files, changed files, missing files.

        Known files with unchanged size, mtime, inode and ctime are counted without being
        read; records older than the inode and ctime columns get them here.
        A new or changed file written less than settle_seconds ago goes to ``defer``
        (the watcher's settle tracker) instead of being registered half-written; one
        written more than WRITING_GRACE ago is taken in batches, without the probe.
        """
        now = time.time() if now is None else now
        counts = dict.fromkeys(("new", "changed", "missing", "unchanged", "settling"), 0)
        roots = self.roots()
        mounted = [r for r in roots if r.is_dir()]
        for root in roots:
            if root not in mounted:
                # Never mark a whole folder's files missing because a volume is not mounted.
                log.warning("watched folder %s is not there; its files are left as they were", root)
        known = {
            row[0]: row[1:]
            for row in MediaFile.select(
                MediaFile.path,
                MediaFile.size,
                MediaFile.mtime,
                MediaFile.inode,
                MediaFile.ctime,
                MediaFile.state,
                MediaFile.transient,
            )
            .where(MediaFile.watch_root.in_([str(r) for r in mounted]))
            .tuples()
            .iterator()
        }
        seen: set[str] = set()
        whole: list[tuple[Path, Path, os.stat_result]] = []
        unstamped: list[tuple[str, os.stat_result]] = []
        for root in mounted:
            for path, st in self._walk(root):
                if path in seen:
                    continue  # nested watched folders
                seen.add(path)
                row = known.get(path)
                if row is not None and _recognised(*row, st):
                    counts["unchanged"] += 1
                    if None in row[2:4]:
                        unstamped.append((path, st))
                elif defer is not None and now - st.st_mtime < self.settle_seconds:
                    defer(Path(path))
                    counts["settling"] += 1
                elif defer is None or abs(now - st.st_mtime) >= WRITING_GRACE:
                    whole.append((Path(path), root, st))
                elif key := self._admit_found(path, mounted, defer):
                    counts[key] += 1
        for chunk in pw.chunked(whole, BATCH):
            try:
                admissions, again = self._admit_whole(chunk, now)
            except Exception:
                # Files that cannot be recorded never stop the rescan; the next one retries.
                log.exception("could not register %d file(s)", len(chunk))
                continue
            for admission in admissions:
                counts[_COUNTED[admission.outcome]] += 1
            for path in again:
                if defer is not None:
                    defer(Path(path))
                counts["settling"] += 1
        _stamp(unstamped)
        gone = [
            path
            for path, row in known.items()
            if path not in seen and row[4] != FileState.MISSING and _lstat(Path(path)) is None
        ]
        counts["missing"] = self.mark_missing(gone, now)
        return counts

    def gone(self, path: str, now: float | None = None) -> int:
        """The watcher saw ``path`` deleted or moved away: mark it missing if it is known."""
        return self.mark_missing([path], time.time() if now is None else now)

    def mark_missing(self, paths: Sequence[str], now: float) -> int:
        # A symlink or special file in its place counts as gone: neither is followed.
        paths = [p for p in paths if _lstat(Path(p)) is None]
        marked = 0
        for chunk in pw.chunked(paths, 500):
            marked += (
                MediaFile.update(state=FileState.MISSING, reason=GONE, updated_at=now)
                .where(MediaFile.path.in_(chunk), MediaFile.state != FileState.MISSING)
                .execute()
            )
        if marked:
            log.info("%d file(s) gone from disk, marked missing", marked)
            bus.publish("file.missing", count=marked)
        return marked

    # -- admission ---------------------------------------------------------------------------

    def admit(
        self,
        path: Path,
        root: Path,
        *,
        scan: Scan | None,
        explicit: bool,
        upload_ok: bool = True,
        wait_if_young: bool = False,
        now: float | None = None,
    ) -> Admission:
        """Record the file at ``path`` and queue ``scan`` when its content is new.

        ``explicit`` (the register API): an unchanged file answers with its existing
        job, or gets one if it has none. Otherwise (watcher, rescan) an unchanged file
        queues nothing. ``wait_if_young``: a file that does not probe but was written
        to within WRITING_GRACE is not rejected; Settling is raised instead.
        """
        now = time.time() if now is None else now
        database = MediaFile._meta.database
        for attempt in range(3):
            st = _stat_file(path)
            known = MediaFile.get_or_none(MediaFile.path == str(path))
            # The slow part (probe, hash) happens before taking the lock.
            observed = None
            if not _recognised_record(known, st, upload_ok, explicit):
                observed = _observe(path, st, upload_ok)
                if wait_if_young and _maybe_unfinished(observed, st, now):
                    raise Settling(f"{path} does not probe yet: {observed.reason}")
            with bus.held(), db.write_transaction(database):
                _lock_path(database, str(path))
                fresh = _stat_file(path)
                if db.written(st, fresh) and attempt < 2:
                    continue  # written to while we looked: look again
                current = MediaFile.get_or_none(MediaFile.path == str(path))
                if not upload_ok and current is not None:
                    _upload_failed(current, fresh)
                if observed is None and not _recognised_record(current, st, upload_ok, explicit):
                    observed = _observe(path, st, upload_ok)  # rare: the record moved under us
                if observed is None:
                    record, outcome = current, Outcome.UNCHANGED
                else:
                    record, outcome = _write(current, path, root, st, observed, now)
                job, job_created = self._job_for(record, outcome, scan, explicit)
                if explicit and upload_ok and job is not None:
                    # The upload hook says the upload is done: no part more to wait for.
                    jobs.release_hold(job, self.hold_until(record.mtime, record.mtime))
            break
        if job is not None and not job_created and scan is not None:
            # Answered with an existing job: it gets the request's callbacks and priority
            # (after the commit above, so a callback now owed is seen at once).
            job = jobs.join(job, scan.priority, scan.options)
        admission = Admission(record, outcome, job, job_created)
        self._announce(admission)
        return admission

    def _job_for(
        self, record: MediaFile, outcome: Outcome, scan: Scan | None, explicit: bool
    ) -> tuple[Job | None, bool]:
        if scan is None or record.state != FileState.PRESENT:
            return None, False
        if outcome in (Outcome.NEW, Outcome.CHANGED) or scan.options.get("force"):
            return self._submit(record, scan)
        newest = _newest_job(record, scan.processors if scan.explicit else None)
        if outcome is Outcome.RESTORED:
            # Back with the same content: done already unless its last job did not finish.
            if newest is not None and newest.status in (JobStatus.COMPLETED, *db.ACTIVE_STATES):
                return newest, False
            return self._submit(record, scan)
        if not explicit:
            return None, False
        return (newest, False) if newest is not None else self._submit(record, scan)

    def _submit(self, record: MediaFile, scan: Scan) -> tuple[Job, bool]:
        return jobs.submit(
            record,
            list(scan.processors),
            priority=scan.priority,
            max_retries=self.max_retries,
            options=scan.options,
        )

    def _announce(self, admission: Admission) -> None:
        record, outcome = admission.record, admission.outcome
        if outcome in (Outcome.UNCHANGED, Outcome.TOUCHED):
            return
        bus.publish(
            "file.registered",
            file_uuid=record.file_uuid,
            state=record.state,
            outcome=outcome.value,
        )
        if record.state == FileState.REJECTED:
            log.warning("rejected %s: %s", record.rel_path, record.reason)
        else:
            task = admission.job.task_id if admission.job_created else "no new job"
            log.info("registered %s (%s): %s", record.rel_path, outcome.value, task)

    def _admit_found(
        self, path: str, roots: list[Path], defer: Callable[[Path], None] | None
    ) -> str:
        """A rescan's new or changed file; returns the count it adds to."""
        root = next(r for r in roots if Path(path).is_relative_to(r))
        try:
            admission = self.admit(
                Path(path),
                root,
                scan=self.default_scan,
                explicit=False,
                wait_if_young=defer is not None,
            )
        except Settling:
            defer(Path(path))  # may still be being written: the watcher looks again
            return "settling"
        except (Gone, Invalid):
            return ""
        except Exception:
            # One file that cannot be recorded never stops the rescan.
            log.exception("could not register %s", path)
            return ""
        return _COUNTED[admission.outcome]

    def _walk(self, root: Path) -> Iterator[tuple[str, os.stat_result]]:
        """Every taken file under ``root``; symlinks and hidden folders are not followed."""
        skip = len(str(root)) + 1
        stack = [str(root)]
        while stack:
            folder = stack.pop()
            try:
                entries = os.scandir(folder)
            except OSError as exc:
                log.warning("cannot list %s: %s", folder, exc.strerror or exc)
                if isinstance(exc, PermissionError):
                    self.unreadable.add(folder)
                continue
            with entries:
                for entry in entries:
                    try:
                        if entry.name.startswith("."):
                            continue
                        if entry.is_symlink():
                            if self._taken(entry.path, PurePath(entry.path[skip:])):
                                self.warn_once(entry.path, NOT_FOLLOWED)
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                            continue
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        if not self._taken(entry.path, PurePath(entry.path[skip:])):
                            continue
                        yield entry.path, entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # vanished while we looked
                    except OSError as exc:  # e.g. a path longer than the system allows
                        self.warn_once(entry.path, f"cannot look at it: {exc.strerror or exc}")

    def warn_once(self, path: str, reason: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("not taking %r: %s", path, reason)


# -- helpers -----------------------------------------------------------------------------------


def _stat_file(path: Path) -> os.stat_result:
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        raise Gone(f"no file at {path}") from None
    except OSError as exc:  # e.g. a folder on the way that cannot be searched
        raise Invalid(f"cannot look at {path}: {exc.strerror or exc}") from None
    if not stat_module.S_ISREG(st.st_mode):
        raise Invalid(f"{path} is not a regular file")
    return st


def _recognised(
    size: int,
    mtime: float,
    inode: int | None,
    ctime: float | None,
    state: str,
    transient: bool,
    st: os.stat_result,
) -> bool:
    """Known, and its stat unchanged since it was read (``db.unchanged``): no need to read
    it again.

    A file that is missing, or rejected for a cause that can pass without the file
    changing, is always looked at again.
    """
    if state == FileState.MISSING or (state == FileState.REJECTED and transient):
        return False
    return db.unchanged((size, mtime, inode, ctime), st)


def _stamp(found: Sequence[tuple[str, os.stat_result]]) -> None:
    """Give records made before the inode and ctime columns existed their file's, as the
    rescan finds it unchanged otherwise (never read again for that)."""
    database = MediaFile._meta.database
    for chunk in pw.chunked(found, 500):
        with db.write_transaction(database):
            for path, st in chunk:
                fields = db.stamp(st)
                MediaFile.update(inode=fields["inode"], ctime=fields["ctime"]).where(
                    MediaFile.path == path,
                    MediaFile.size == fields["size"],
                    MediaFile.mtime == fields["mtime"],
                    MediaFile.inode.is_null() | MediaFile.ctime.is_null(),
                ).execute()


def _recognised_record(
    record: MediaFile | None, st: os.stat_result, upload_ok: bool, explicit: bool
) -> bool:
    if record is None or not upload_ok:
        return False
    if explicit and record.reason == ABORTED:
        return False  # the hook said the upload failed and now says it finished: look again
    if explicit and needs_probe(record):
        return False  # the register API answers with the probe's verdict
    # (The watcher and the rescan keep the hook's "aborted" until the file changes.)
    return _recognised(
        record.size, record.mtime, record.inode, record.ctime, record.state, record.transient, st
    )


def _observe(path: Path, st: os.stat_result, upload_ok: bool) -> _Observed:
    if not upload_ok:
        return _Observed(FileState.REJECTED, ABORTED, None, None)
    transient = False
    try:
        info = probe(path)
        state, reason = FileState.PRESENT, None
    except MediaNotFoundError:
        raise Gone(f"no file at {path}") from None
    except MediaError as exc:
        info, state, reason, transient = None, FileState.REJECTED, exc.reason, exc.transient
    try:
        digest = fingerprint(path, st.st_size) if st.st_size else None
    except FileNotFoundError:
        raise Gone(f"no file at {path}") from None
    except OSError as exc:
        digest, state, reason = None, FileState.REJECTED, f"cannot read file: {exc.strerror or exc}"
        transient = is_transient(exc)
    return _Observed(state, reason, info, digest, transient)


def _glance(path: Path, st: os.stat_result) -> _Observed:
    """What is known without the probe: empty, unreadable, or there with its fingerprint."""
    if st.st_size == 0:
        return _Observed(FileState.REJECTED, EMPTY, None, None)
    try:
        digest = fingerprint(path, st.st_size)
    except FileNotFoundError:
        raise Gone(f"no file at {path}") from None
    except OSError as exc:
        reason = f"cannot read file: {exc.strerror or exc}"
        return _Observed(FileState.REJECTED, reason, None, None, is_transient(exc))
    return _Observed(FileState.PRESENT, None, None, digest)


def _judged(record: MediaFile | None, observed: _Observed) -> _Observed:
    """A glance at content whose probe rejected it before (touched since) keeps that verdict."""
    if (
        record is not None
        and record.state == FileState.REJECTED
        and not record.transient
        and record.reason != ABORTED
        and observed.state == FileState.PRESENT
        and observed.fingerprint == record.fingerprint
    ):
        return _Observed(FileState.REJECTED, record.reason, None, observed.fingerprint)
    return observed


def _maybe_unfinished(observed: _Observed, st: os.stat_result, now: float) -> bool:
    """Rejected for its content while written to only moments ago: maybe not all there yet."""
    unfinished = observed.state == FileState.REJECTED and not observed.transient
    return unfinished and abs(now - st.st_mtime) < WRITING_GRACE  # abs: clocks of shares drift


def _write(
    current: MediaFile | None,
    path: Path,
    root: Path,
    st: os.stat_result,
    observed: _Observed,
    now: float,
) -> tuple[MediaFile, Outcome]:
    if current is None:
        record = MediaFile.create(**_fields(path, root, st, observed, now))
        return record, Outcome.NEW
    unread = observed.transient and observed.fingerprint is None
    if unread:
        # Cannot be read for now (locked a while): its content is not known to differ, so
        # what was known of it stays, and readable again with that content it is restored.
        observed = replace(observed, fingerprint=current.fingerprint)
    fields: dict[str, Any] = {
        "watch_root": str(root),
        "rel_path": str(path.relative_to(root)),
        "name": path.name,
        **db.stamp(st),
        "updated_at": now,
        "state": observed.state,
        "reason": observed.reason,
        "fingerprint": observed.fingerprint,
        "transient": observed.transient,
        "content_hash": None,  # of what was there before; computed again when needed
    }
    same = observed.fingerprint is not None and observed.fingerprint == current.fingerprint
    # Taken without the probe (_admit_whole): the same content keeps what its probe found.
    if (
        observed.info is not None
        or not same
        or (observed.state != FileState.PRESENT and not unread)
    ):
        fields |= _metadata(observed.info)
    # Looked at again (a transient rejection) and no different: nothing new to tell.
    still = (observed.state, observed.reason, observed.fingerprint) == (
        current.state,
        current.reason,
        current.fingerprint,
    )
    if (same or still) and observed.state == current.state:
        outcome = Outcome.TOUCHED
    elif same and observed.state == FileState.PRESENT:
        outcome = Outcome.RESTORED
    else:
        outcome = Outcome.CHANGED
    MediaFile.update(fields).where(MediaFile.id == current.id).execute()
    return MediaFile.get_by_id(current.id), outcome


def _fields(
    path: Path, root: Path, st: os.stat_result, observed: _Observed, now: float
) -> dict[str, Any]:
    """A new file's record."""
    return {
        "file_uuid": file_uuid_for(path),
        "path": str(path),
        "watch_root": str(root),
        "rel_path": str(path.relative_to(root)),
        "name": path.name,
        **db.stamp(st),
        "state": observed.state,
        "reason": observed.reason,
        "fingerprint": observed.fingerprint,
        "transient": observed.transient,
        "registered_at": now,
        "updated_at": now,
        **_metadata(observed.info),
    }


def _metadata(info: MediaInfo | None) -> dict[str, Any]:
    """The probe's findings as MediaFile fields; all None when there are none (yet)."""
    return {
        "duration": info.duration if info else None,
        "width": info.width if info else None,
        "height": info.height if info else None,
        "fps": info.fps if info else None,
        "video_codec": info.video_codec if info else None,
        "audio_codec": info.audio_codec if info else None,
    }


def _lock_path(database: pw.Database, path: str) -> None:
    """Serialise admissions of one path across threads and nodes, until the commit."""
    _lock_paths(database, [path])


def _lock_paths(database: pw.Database, paths: Sequence[str]) -> None:
    """``_lock_path`` for many paths in one statement; in one order (the keys sorted),
    so two batches never wait on each other."""
    if db.is_postgres(database) and paths:
        keys = sorted(
            int.from_bytes(hashlib.blake2b(p.encode(), digest_size=8).digest(), "big", signed=True)
            for p in paths
        )
        database.execute_sql("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) k", (keys,))
    # SQLite: write_transaction already holds the database's write lock.


def _upload_failed(record: MediaFile, st: os.stat_result) -> None:
    """The hook reports a failed upload of a known file. Its waiting jobs are cancelled (a
    failed upload is never processed). A job already running on the very content the file
    still holds is not pulled from under it: Conflict. Changed content is rejected as
    usual, and the running job notices the replaced file itself (FileGuard)."""
    active = list(Job.select().where(Job.file == record.id, Job.status.in_(db.ACTIVE_STATES)))
    unchanged = _recognised_record(record, st, True, False)
    running = [job for job in active if job.status == JobStatus.PROCESSING]
    if running and unchanged:
        raise Conflict(
            f"{record.name} has job {running[0].task_id} running on this very content; "
            "cancel it first if the upload really failed"
        )
    for job in active:
        if job.status != JobStatus.PROCESSING:
            jobs.cancel(job, reason=ABORTED)


def _newest_job(record: MediaFile, processors: Sequence[str] | None) -> Job | None:
    for job in Job.select().where(Job.file == record.id).order_by(Job.id.desc()):
        if processors is None or sorted(job.processors) == sorted(processors):
            return job
    return None


# -- what the worker asks ----------------------------------------------------------------------


def needs_probe(record: MediaFile) -> bool:
    """Present but not probed yet (taken whole, see ``_admit_whole``): a probed file
    always has a video codec."""
    return record.state == FileState.PRESENT and record.video_codec is None


class StillArriving(Exception):
    """A file that does not probe yet, written to moments ago (a writer that closes it
    after each part, as a resumed upload does): its job waits until ``until``."""

    def __init__(self, reason: str, until: float) -> None:
        super().__init__(reason)
        self.reason, self.until = reason, until


def check_arriving(record: MediaFile, quiet: float, reason: str, now: float | None = None) -> None:
    """StillArriving if the file was written to less than ``quiet`` seconds ago."""
    written = _lstat(Path(record.path))
    now = time.time() if now is None else now
    if written is not None and abs(now - written.st_mtime) < quiet:  # abs: shares' clocks
        raise StillArriving(reason, written.st_mtime + quiet)


def unusable(record: MediaFile, now: float | None = None, quiet: float = 0.0) -> str | None:
    """At a job's start: why its file cannot be processed, else None.

    A ``rejected`` file gives its reason. One recorded without its probe (see the
    module docstring) is probed now: what the API shows (duration, size, codecs) is
    filled in, or the file is marked ``rejected`` and the reason returned. A file not
    there is left alone (the job's processors meet it, and FileGuard says so); one that
    cannot be read for a cause that may pass is rejected as transient, so the rescan,
    the watcher and the hook look at it again. The record is only changed while it
    still holds the content that was probed. One whose content does not probe and that
    was written to less than ``quiet`` seconds ago may be still arriving: StillArriving,
    and the record is left as it is.
    """
    if record.state == FileState.REJECTED:
        return record.reason
    return probe_pending(record, now, quiet)


def probe_pending(record: MediaFile, now: float | None = None, quiet: float = 0.0) -> str | None:
    """Probe a file recorded without its probe; see ``unusable``."""
    if not needs_probe(record):
        return None
    now = time.time() if now is None else now
    try:
        info = probe(record.path)
    except MediaNotFoundError:
        return None
    except MediaError as exc:
        if not exc.transient:
            check_arriving(record, quiet, exc.reason, now)
        fields = {"state": FileState.REJECTED, "reason": exc.reason, "transient": exc.transient}
        if MediaFile.update(fields, updated_at=now).where(_unchanged(record)).execute():
            bus.publish(
                "file.registered",
                file_uuid=record.file_uuid,
                state=FileState.REJECTED,
                outcome=Outcome.CHANGED.value,
            )
            log.warning("rejected %s: %s", record.rel_path, exc.reason)
        return exc.reason
    MediaFile.update(_metadata(info), updated_at=now).where(_unchanged(record)).execute()
    return None


def _unchanged(record: MediaFile) -> pw.Expression:
    """The record's row while it still holds the content ``record`` describes."""
    return (
        (MediaFile.id == record.id)
        & (MediaFile.fingerprint == record.fingerprint)
        & (MediaFile.state == FileState.PRESENT)
    )


class FileGuard:
    """Notices when a job's file is deleted or replaced while the job runs.

    A file missing when the job starts is left to the processors (network storage
    can hide a file for a moment, and that is worth a retry); one that was there
    and then vanished or changed content fails the job with a reason saying so.
    """

    def __init__(self, record: MediaFile) -> None:
        self.path = Path(record.path)
        self.fingerprint = record.fingerprint
        self.replaced = False
        self._replaced_why = ""  # once replaced: when it was noticed, in words
        try:
            st: os.stat_result | None = self.path.lstat()
        except OSError:
            st = None
        # A symlink (or special file) put in its place: never followed out of the folder.
        self.unfollowed = st is not None and not stat_module.S_ISREG(st.st_mode)
        if self.unfollowed:
            st = None
        self._seen = st if st and record.fingerprint else None
        # Changed between registration and now: is it still the content that was registered?
        if self._seen and not record.holds(st):
            now = db.stamp(st)
            moved = (record.size, record.mtime) != (now["size"], now["mtime"])
            if self._content_changed(st, moved or record.inode not in (None, now["inode"])):
                self._seen = None
                self.replaced = True
                self._replaced_why = (
                    "the file changed after it was registered (replaced or still being "
                    "written); its new content is registered once it has settled"
                )

    def problem(self) -> str | None:
        """None while the file is the one the job was queued for, else why not."""
        if self.unfollowed:
            return (
                "the file was replaced by a symlink or something else that is not a "
                "regular file; it is not followed"
            )
        if self.replaced:
            return self._replaced_why
        if self._seen is None:
            return None
        st = _lstat(self.path)
        if st is None:
            return "the file was deleted or moved away during processing"
        if db.written(self._seen, st):
            seen = self._seen
            moved = (st.st_size, st.st_mtime_ns, st.st_ino) != (
                seen.st_size,
                seen.st_mtime_ns,
                seen.st_ino,
            )
            if self._content_changed(st, moved):
                self.replaced = True
                self._replaced_why = (
                    "the file was replaced or changed during processing; its new "
                    "content is registered as a new job once it has settled"
                )
                return self._replaced_why
            self._seen = st  # touched, same content
        return None

    def _content_changed(self, st: os.stat_result, moved: bool) -> bool:
        """Read to tell. One that cannot be read is taken for replaced when its size, mtime
        or inode ``moved``; with only its ctime moved (a chmod) the probe and the
        processors meet it and say why."""
        try:
            return fingerprint(self.path, st.st_size) != self.fingerprint
        except OSError:
            return moved


def _lstat(path: Path) -> os.stat_result | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st if stat_module.S_ISREG(st.st_mode) else None


def requeue_replaced(job: Job, snapshot: MediaFile) -> Job | None:
    """After ``job`` ended on content its file no longer holds: queue the new content if
    it was registered meanwhile (that registration found ``job`` still active and joined
    it). Otherwise the watcher registers it, and queues it, once it has settled.

    Under the path's lock, as registrations are: one in progress has read ``job`` as
    active but not committed yet, and is waited for (PostgreSQL would otherwise show
    the record as it was, and neither would queue the new content).
    """
    database = MediaFile._meta.database
    with bus.held(), db.write_transaction(database):  # the job announced once committed
        _lock_path(database, snapshot.path)
        record = MediaFile.get_by_id(snapshot.id)
        same = (record.size, record.mtime, record.fingerprint) == (
            snapshot.size,
            snapshot.mtime,
            snapshot.fingerprint,
        )
        if same or record.state != FileState.PRESENT:
            return None
        settings = {"task_timeout": job.task_timeout, "not_before": job.not_before}
        job, created = jobs.submit(
            record,
            job.processors,
            priority=job.priority,
            max_retries=job.max_retries,
            options=job.options | {k: v for k, v in settings.items() if v is not None},
        )
    return job if created else None
