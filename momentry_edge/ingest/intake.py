"""The intake: registering files (admit, register) and reconciling folders with the table."""

# One piece (~640 lines): the Intake class and the batching it owns (see its reason).

# A file arrives in one of three ways, and all of them go through ``Intake.admit``:
#
# - the watcher (watcher.py) hands over a path once its size and mtime have settled;
# - an upload hook calls ``POST /api/v1/files/register`` (``Intake.register``);
# - a rescan (at start-up, every ``rescan_interval``, or on demand) walks the folders.
#
# ``admit`` stats the file first: a known file whose size, mtime, inode and ctime are
# unchanged is recognised without reading it (``store.unchanged``). Otherwise it is probed
# and fingerprinted outside any lock; then the record and, when the content is new, its
# job are written in one transaction holding a per-path lock (SQLite: the write lock;
# PostgreSQL: an advisory lock). So the hook, the watcher, a rescan and other nodes
# racing on one file give one record and one job, and a crash never leaves a registered
# file without its job.
#
# Files known to be whole are taken many at a time: those whose writers closed them
# or that were renamed into place (inotify's close and move events; the watcher hands
# them over together to ``settled_closed``) and those a rescan finds last written more
# than WRITING_GRACE ago. They are
# fingerprinted but not probed, and recorded with their jobs ``BATCH`` to a
# transaction. The probe (about 10 ms of a file, holding the GIL) would cap a bulk
# drop at ~50 files/s; it runs instead when the job starts (``unusable``), which fills
# in the file's metadata, or marks it ``rejected`` and fails the job with the reason
# before any processor runs. Any other file goes through ``admit`` and its probe, which
# tells an upload still under way (``Settling``) from a broken file; so does a file
# registered through the API, whose answer gives the probe's verdict.

from __future__ import annotations

import contextlib
import logging
import os
import stat as stat_module
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, cast

import peewee as pw

from .. import jobs, store
from ..errors import Invalid
from ..events import bus
from ..store import FileState, Job, JobStatus, MediaFile
from ..trees import lstat_regular
from .guard import needs_probe, probe_pending
from .paths import NOT_FOLLOWED, ignored_reason, normalize_extensions, shown_ignored
from .recording import (
    GONE,
    WRITING_GRACE,
    Gone,
    _fields,
    _glance,
    _judged,
    _maybe_unfinished,
    _newest_job,
    _observe,
    _Observed,
    _recognised,
    _recognised_record,
    _stamp,
    _stat_file,
    _upload_failed,
    _write,
)
from .records import Outcome, lock_path, lock_paths

log = logging.getLogger(__name__)

# Closed files recorded (with their jobs) per transaction: few commits, and the write
# lock is held a fraction of a second (SQLite: ~0.2 s for 200 on 2 busy cores).
BATCH = 200


# The rescan's count each outcome adds to.
_COUNTED = {
    Outcome.NEW: "new",
    Outcome.CHANGED: "changed",
    Outcome.RESTORED: "changed",
    Outcome.TOUCHED: "unchanged",
    Outcome.UNCHANGED: "unchanged",
}


class Settling(Exception):
    """The file does not probe yet but was written to recently: look again later."""


@dataclass(frozen=True)
class Scan:
    """The deep scan to queue for an admitted file."""

    processors: tuple[str, ...]
    priority: int = store.PRIORITIES["normal"]
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


# -- identity ----------------------------------------------------------------------------------


# -- names and paths ---------------------------------------------------------------------------


# -- the intake ----------------------------------------------------------------------------------


class Intake:
    """Turns paths in the watched folders into file records and, where due, jobs."""

    # One piece (~510 lines): admit, register and rescan share the path locks, the
    # batched writes and the settle bookkeeping of one intake.

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
        # How many folders deep each watched folder's tree went at its last rescan: the
        # watcher does not try again to watch one nested deeper than it can follow.
        self.depth: dict[Path, int] = {}
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
        priority: int = store.PRIORITIES["normal"],
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
                admissions.append(Admission(record, Outcome.UNCHANGED, None, False))  # type: ignore[arg-type]
                continue
            with contextlib.suppress(Gone):
                looked[str(path)] = (path, root, st, _glance(path, st))
        with bus.held(), store.write_transaction(database):
            lock_paths(database, list(looked))
            current = {r.path: r for r in MediaFile.select().where(MediaFile.path.in_(names))}
            for name, (path, root, st, observed) in looked.items():
                fresh = lstat_regular(path)
                if fresh is None:
                    continue  # gone meanwhile
                if store.written(st, fresh):
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
        store.insert_many(records, key="path")  # written out: see store.insert_many
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
        known: dict[str, tuple[Any, ...]] = {
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
        ignored: list[tuple[str, Path, os.stat_result]] = []
        for root in mounted:
            for path, st in self._walk(root, ignored):
                if path in seen:
                    continue  # nested watched folders
                seen.add(path)
                row = known.get(path)
                if row is not None and _recognised(*row, st):  # type: ignore[call-arg]  # 6 columns
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
        counts["ignored"] = 0
        for path, root, st in ignored:
            if path not in seen:
                seen.add(path)
                counts["ignored"] += 1
                if path not in known:
                    self.note_ignored(path, root, st, now)
        gone = [
            path
            for path, row in known.items()
            if path not in seen
            and row[4] != FileState.MISSING
            and lstat_regular(Path(path)) is None
        ]
        counts["missing"] = self.mark_missing(gone, now)
        return counts

    def gone(self, path: str, now: float | None = None) -> int:
        """The watcher saw ``path`` deleted or moved away: mark it missing if it is known."""
        return self.mark_missing([path], time.time() if now is None else now)

    def mark_missing(self, paths: Sequence[str], now: float) -> int:
        # A symlink or special file in its place counts as gone: neither is followed.
        paths = [p for p in paths if lstat_regular(Path(p)) is None]
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
            with bus.held(), store.write_transaction(database):
                lock_path(database, str(path))
                fresh = _stat_file(path)
                if store.written(st, fresh) and attempt < 2:
                    continue  # written to while we looked: look again
                current = MediaFile.get_or_none(MediaFile.path == str(path))
                if not upload_ok and current is not None:
                    _upload_failed(current, fresh)
                if observed is None and not _recognised_record(current, st, upload_ok, explicit):
                    observed = _observe(path, st, upload_ok)  # rare: the record moved under us
                if observed is None:  # recognised: current is a record
                    record, outcome = cast(MediaFile, current), Outcome.UNCHANGED
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
            job = jobs.answer_with_existing(job, scan.priority, scan.options)
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
            if newest is not None and newest.status in (JobStatus.COMPLETED, *store.ACTIVE_STATES):
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
            job = admission.job
            task = job.task_id if job is not None and admission.job_created else "no new job"
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
            assert defer is not None  # Settling is raised only when wait_if_young
            defer(Path(path))  # may still be being written: the watcher looks again
            return "settling"
        except (Gone, Invalid):
            return ""
        except Exception:
            # One file that cannot be recorded never stops the rescan.
            log.exception("could not register %s", path)
            return ""
        return _COUNTED[admission.outcome]

    def note_ignored(
        self, path: str, root: Path, st: os.stat_result | None = None, now: float | None = None
    ) -> None:
        """Record a file of a kind not taken as ``ignored``, with the reason, and log it once:
        it shows in the file list rather than being passed over in silence."""
        reason = ignored_reason(Path(path).relative_to(root), self.extensions)
        if not shown_ignored(reason):
            return
        try:
            st = st or os.lstat(path)
        except OSError:
            return
        if not stat_module.S_ISREG(st.st_mode):
            return
        database = MediaFile._meta.database
        seen = _Observed(FileState.IGNORED, reason, None, None)
        with store.write_transaction(database):
            lock_path(database, path)
            if MediaFile.get_or_none(MediaFile.path == path) is None:
                MediaFile.create(**_fields(Path(path), root, st, seen, now or time.time()))
        self.warn_once(path, str(reason))

    def root_of(self, path: str) -> Path | None:
        """The watched folder ``path`` (a real path) is inside, if any."""
        real = Path(path)
        return next((r for r in self._roots if real.is_relative_to(r) and real != r), None)

    def _walk(
        self, root: Path, ignored: list[tuple[str, Path, os.stat_result]] | None = None
    ) -> Iterator[tuple[str, os.stat_result]]:
        """Every taken file under ``root``; symlinks and hidden folders are not followed.
        Files of a kind not taken go to ``ignored``."""
        skip = len(str(root)) + 1
        stack = [(str(root), 0)]
        deepest = 0
        while stack:
            folder, depth = stack.pop()
            deepest = max(deepest, depth)
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
                            stack.append((entry.path, depth + 1))
                            continue
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        if not self._taken(entry.path, PurePath(entry.path[skip:])):
                            reason = ignored_reason(PurePath(entry.path[skip:]), self.extensions)
                            if ignored is not None and shown_ignored(reason):
                                ignored.append(
                                    (entry.path, root, entry.stat(follow_symlinks=False))
                                )
                            continue
                        yield entry.path, entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # vanished while we looked
                    except OSError as exc:  # e.g. a path longer than the system allows
                        self.warn_once(entry.path, f"cannot look at it: {exc.strerror or exc}")
        self.depth[root] = deepest

    def warn_once(self, path: str, reason: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning("not taking %r: %s", path, reason)


# -- helpers -----------------------------------------------------------------------------------


# SQLite: write_transaction already holds the database's write lock.
