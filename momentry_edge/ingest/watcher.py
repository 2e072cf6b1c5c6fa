"""The drop-folder watcher: watchdog events feed a settle tracker; settled paths are registered."""

# One piece (~660 lines): the Watcher class (see its reason) and the watchdog handler
# and observer checks only it uses.

# The watchdog handler only puts ``(event type, path, destination, is_directory, when)``
# on a queue. One "ingest" thread drains it into the ``SettleTracker``, hands the paths
# that have settled to a small pool of "register" threads, and runs the periodic
# rescans; nothing is ever registered on the observer's thread. Files known to be whole
# (their writers closed them, or they were renamed into place) go together to
# ``Intake.settled_closed`` (not probed; recorded and queued in batches) by one task at a
# time, which takes all that are waiting, so the batches grow under a flood; each other
# file goes to ``Intake.settled``. Two registrations of
# one path may overlap; the intake serialises them.
#
# Events only say "look at this path": the tracker decides from ``stat()``, so a
# coalesced or lost event costs nothing, and the periodic rescan (``Intake.reconcile``)
# catches any file no event announced (service down, network share, inotify limit).
#
# Which events fire, watchdog 7.1 on Linux (inotify, with ``generate_full_events``, so a
# move from or to outside the watch is reported as a move), measured with a script
# writing into a watched folder; every change in a folder also fires ``modified`` on the
# folder itself, and those are ignored:
#
# =================================  ===============================================
# filesystem operation               events (file events unless noted)
# =================================  ===============================================
# write a new file, any number of    created, opened, modified (repeats of the same
# chunks                             event in a row are coalesced), closed
# append or rewrite in place         opened, modified, closed
# write ``x.mp4.part``, rename to    created/modified/closed ``x.mp4.part``, then
# ``x.mp4``                          moved ``x.mp4.part`` -> ``x.mp4``
# rename over an existing file       moved ``tmp`` -> ``x.mp4`` (no deleted for x.mp4)
# move in from outside the watch     moved ``""`` -> ``x.mp4``
# move out of the watch              moved ``x.mp4`` -> ``""`` (late: ~0.5 s, watchdog
#                                    waits for the other half)
# delete                             deleted
# touch, utime, chmod                attrib
# read (our own probe and hash)      opened, closed_no_write  -- ignored, or probing
#                                    a file would set its settle timer going again
# mkdir, then a file in it           created (dir), then the file's events
# move a folder in                   moved ``""`` -> folder (dir), created for each
#                                    file in it
# rename a folder inside the watch   moved (dir), moved for each file in it
# symlink or hard link               created (a symlink is never taken)
# copy keeping times (``cp -p``)     created, opened, modified, closed, attrib
# delete the watched folder          deleted (dir) for each file and folder, itself last
# rename the watched folder away     nothing: its watch follows it to the new name
# =================================  ===============================================
#
# So the ingest thread looks every LOST_POLL whether each watched folder is still the
# one it watches (``_identity``).
#
# ``closed`` is inotify's IN_CLOSE_WRITE: the writer has closed the file. Where the
# platform reports it (inotify), a file written and closed is taken at once, and a
# file modified and not closed yet (an upload in progress, however slow) waits for
# its close rather than for settle_seconds of quiet, up to ``ingest.WRITING_GRACE``
# of quiet (a close event may be lost when the kernel's queue overflows).
#
# A file renamed or moved to a taken name (IN_MOVED_TO) is whole too, and taken at once
# like a closed one: SFTPGo's atomic uploads and rsync write under a temporary name and
# rename the file into place after closing it. Not when a writer still had it open
# under its old name (modified, not closed: whatever the name, hidden and temporary
# ones too, whose events are otherwise ignored): then it waits for its close under its
# new name. A move to a name that is not taken (a temporary name, a hidden folder) is
# ignored, as a write there is. The files of a folder moved in from outside are whole
# too (their ``created`` events that follow do not undo that).
#
# A file that fails the probe while it may still be being written (not known to be
# closed, written to within WRITING_GRACE) is not rejected: ``Intake.settled`` raises
# ``Settling`` and the tracker waits for it again.
#
# On macOS (FSEvents) events are coalesced per path and arrive in batches with a
# small delay and there is no close event; a rename there may come merged with the
# writes before it, so neither a close nor a move makes a file due: every file waits
# for settle_seconds of quiet, and the outcome is the same because the tracker watches
# size and mtime.

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from .. import store, trees
from .intake import Intake, Settling
from .paths import NOT_FOLLOWED
from .recording import WRITING_GRACE

log = logging.getLogger(__name__)

# What the queue carries: (event type, path, destination, is_directory, time.monotonic()
# when it was queued).
Event = tuple[str, str, str, str, float]

# How a file became due (SettleTracker.due).
QUIET, CLOSED, MOVED = "quiet", "closed", "moved"
# Events after which a file may have new content (or have just appeared).
_CHANGES = {"created", "modified", "closed", "attrib"}
# The observers that report a writer closing a file (inotify's IN_CLOSE_WRITE) and a
# rename as it happens, each event on its own (FSEvents coalesces them).
_REPORTS_CLOSE = {"InotifyObserver"}
# Settled files are registered this many tasks at a time. Reading and probing hold the
# GIL, so more threads only overlap database commits: 2 measured ~1.2x over 1, and 4
# no better than 2 (each thread holds a database connection).
REGISTER_THREADS = 2
# How often the ingest thread looks whether a watched folder is still the one watched
# (inotify says nothing when the folder itself is renamed away: its watch follows it to
# the new name) and whether one gone (deleted, renamed, its volume unmounted) is back,
# to watch it again.
LOST_POLL = 1.0
# watchdog adds the watches of a tree with os.walk, which on Python 3.11 recurses once a
# level: it fails (RecursionError) about 990 folders deep, and keeps the watches it had
# added until then. A watched folder it failed on is not tried again while its tree is
# at least this deep.
DEEPEST = 900


@dataclass
class _Watched:
    size: int
    mtime_ns: int
    since: float  # clock time of the last change seen
    writing: bool = False  # modified, and its writer has not closed it since
    closed: bool = False  # closed by its writer, or moved into place; unchanged since
    moved: bool = False  # closed as it was moved into place: nobody writes it any more


class SettleTracker:
    """Paths that are being written; ``due`` returns those that have held still long enough.

    A path is due once its size and mtime have been unchanged for ``settle_seconds``
    and no event has touched it in that time. With ``reports_close`` (the platform
    reports a writer closing a file, and renames as they happen), a path is due as
    soon as its writer closed it or it was moved into place (event "moved"), and one
    still open for writing waits for the close (or WRITING_GRACE of quiet).
    ``clock`` is injectable for tests. Not thread-safe: the ingest thread owns it.
    """

    def __init__(
        self,
        settle_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        reports_close: bool = False,
    ) -> None:
        self.settle_seconds = settle_seconds
        self.clock = clock
        self.reports_close = reports_close
        self._files: dict[str, _Watched] = {}

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, path: str) -> bool:
        return path in self._files

    def touch(self, path: str, now: float | None = None, event: str = "") -> None:
        """Something happened to ``path`` (``event``: watchdog's event type, if any):
        (re)start its settle timer."""
        st = _regular_stat(path)
        if st is None:
            self._files.pop(path, None)
            return
        now = self.clock() if now is None else now
        before = self._files.get(path)
        seen = _Watched(st.st_size, st.st_mtime_ns, now)
        if event == "modified":
            seen.writing = True
        elif event in ("closed", "moved"):  # moved: renamed into place, with no writer on it
            seen.closed = True
            seen.moved = event == "moved"
        elif before is not None:  # attrib, created, a rescan: the writer is where it was
            seen.writing = before.writing
            unchanged = (st.st_size, st.st_mtime_ns) == (before.size, before.mtime_ns)
            # cp -p sets times after the close; a folder moved in also says "created".
            seen.closed = before.closed and (event == "attrib" or unchanged)
            seen.moved = seen.closed and before.moved
        self._files[path] = seen

    def forget(self, path: str) -> None:
        self._files.pop(path, None)

    def due(self, now: float | None = None) -> list[tuple[str, str]]:
        """Paths that have settled, each with how (each returned once), in the order they
        settled: QUIET (unchanged for settle_seconds), CLOSED (its writer closed it: a
        resumed upload may add a part yet) or MOVED (renamed into place)."""
        now = self.clock() if now is None else now
        settled = []
        for path, seen in list(self._files.items()):
            st = _regular_stat(path)
            if st is None:
                del self._files[path]  # deleted, or replaced by something we do not take
            elif (st.st_size, st.st_mtime_ns) != (seen.size, seen.mtime_ns):
                # Written since (its events may still be on the way): not closed after all.
                self._files[path] = _Watched(st.st_size, st.st_mtime_ns, now, seen.writing)
            elif self._ready(seen, now):
                del self._files[path]
                settled.append((seen.since, path, self._how(seen)))
        return [(path, how) for _, path, how in sorted(settled)]

    def _how(self, seen: _Watched) -> str:
        if not (seen.closed and self.reports_close):
            return QUIET
        return MOVED if seen.moved else CLOSED

    def _ready(self, seen: _Watched, now: float) -> bool:
        if not self.reports_close:
            return now - seen.since >= self.settle_seconds
        if seen.closed:
            return True
        # Still open for writing: wait for the close; quiet this long, it was lost.
        wait = max(WRITING_GRACE, self.settle_seconds) if seen.writing else self.settle_seconds
        return now - seen.since >= wait


def _identity(folder: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a folder, or None when there is none: a folder removed and made
    again is another folder, with a watch of its own to make."""
    try:
        st = folder.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _why_not(exc: BaseException) -> str:
    """Why a folder cannot be watched, in words."""
    if isinstance(exc, RecursionError):
        return "folders in it are nested deeper than the watcher can follow"
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    return f"{type(exc).__name__}: {exc}"


def _regular_stat(path: str) -> os.stat_result | None:
    """lstat of a regular file; None for anything else (gone, symlink, folder)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if (st.st_mode & 0o170000) == 0o100000 else None


class _Enqueue(FileSystemEventHandler):
    """watchdog's callback: put the event on the queue, nothing else (it runs on the
    observer's thread, which must keep reading the kernel's events)."""

    def __init__(self, events: queue.SimpleQueue[Event]) -> None:
        self.events = events

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.events.put(
            (
                event.event_type,
                str(event.src_path),
                str(event.dest_path),
                str(event.is_directory),
                time.monotonic(),
            )
        )


class Watcher:
    """Observes the watched folders and drives the tracker, registration and rescans."""

    # One piece (~400 lines): the observer, the settle timers and the rescans it
    # schedules share one lock and one view of the folders.

    def __init__(
        self,
        intake: Intake,
        settle_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.intake = intake
        self.tracker = SettleTracker(settle_seconds, clock)
        # How often tracked files are looked at: latency beyond settle_seconds is about this.
        self.tick = min(max(settle_seconds / 5, 0.05), 0.5)
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        # (folder, how) -> when the walk that last looked into it began (_touch_tree).
        self._walked: dict[tuple[str, str], float] = {}
        self.observer: Any = None
        # Each watched folder's watch, with the folder's (st_dev, st_ino) when it was made.
        self._scheduled: dict[Path, tuple[Any, tuple[int, int] | None]] = {}
        self._lost: set[Path] = set()  # watched folders gone since: watched again when back
        # The watches of folders gone since, kept until their last events are delivered:
        # a deleted folder's ends with the folder's own deletion, after its files'.
        self._retiring: dict[Path, Any] = {}
        # Watched folders that cannot be watched (said once), with why: only rescanned.
        self._unwatchable: dict[Path, str] = {}
        # Of those, the ones that failed for folders nested too deep: tried again only
        # once a rescan finds their trees less deep than DEEPEST.
        self._too_deep: set[Path] = set()
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)
        self._register = ThreadPoolExecutor(REGISTER_THREADS, thread_name_prefix="register")
        self._rescan_lock = threading.Lock()
        self._closed: list[tuple[str, str]] = []  # closed files waiting for _take_closed, how
        self._closing = False  # a _take_closed task is on its way or running
        self._closed_lock = threading.Lock()
        # Paths modified and not closed since, whatever their names (only where closes
        # are reported): a file renamed while its writer still has it open is not whole.
        self._open_writes: set[str] = set()
        self._stopping = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Watch first, then scan: a file written during the start-up scan is not missed."""
        self.observer = self._new_observer()
        self.observer.start()
        self._schedule()
        self._thread.start()
        self.request_rescan()

    def _new_observer(self) -> Any:
        observer: Any = Observer  # watchdog's platform pick, typed as its base
        reports_close = observer.__name__ in _REPORTS_CLOSE
        self.tracker.reports_close = reports_close
        # Full events: a move from or to outside the watch is a move, not created/deleted.
        return observer(generate_full_events=True) if reports_close else observer()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.events.put(("stop", "", "", "", time.monotonic()))
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout)
        if self._thread.is_alive():
            self._thread.join(timeout)
        # Registrations in flight finish their transaction; those not started are dropped
        # (their files are found again by the next start-up rescan).
        self._register.shutdown(wait=True, cancel_futures=True)

    def request_rescan(self) -> None:
        """Reconcile on the ingest thread soon (the periodic rescan)."""
        self.events.put(("rescan", "", "", "", time.monotonic()))

    def rescan(self) -> dict[str, int]:
        """Reconcile now, in the calling thread (the rescan route); one rescan at a time."""
        with self._rescan_lock:
            self._schedule()  # a folder that was missing at start-up may be there now
            started = time.monotonic()
            counts = self.intake.reconcile(defer=self.found)
        log.info(
            "rescan in %.2f s: %s",
            time.monotonic() - started,
            ", ".join(f"{k} {v}" for k, v in counts.items()),
        )
        return counts

    def found(self, path: Path) -> None:
        """A rescan found a file still being written: let the tracker wait for it."""
        self.events.put(("found", str(path), "", "", time.monotonic()))

    # -- the ingest thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                # Block without a timeout while nothing is settling or watched.
                idle = LOST_POLL if self._lost or self._scheduled else None
                self._take(self.tick if len(self.tracker) else idle)
                if self._folders_changed():
                    # Watch what is there now; take what is in it already.
                    self._guarded(self.rescan)
                due = self.tracker.due()
                if whole := [(path, how) for path, how in due if how != QUIET]:
                    self._hand_closed(whole)
                for path, how in due:
                    if how == QUIET:
                        self._register.submit(self._guarded, self._settled, path, False)
            except Exception:
                # Whatever one odd file or event does, the drop folder stays watched.
                log.exception("ingest: unexpected error; carrying on")
                time.sleep(self.tick)

    def _folders_changed(self) -> bool:
        """A watched folder is gone or is another folder now (one stat each), or one gone
        is back."""
        if self._observer_died():
            return True
        watched = list(self._scheduled.items())
        if any(made is not None and _identity(root) != made for root, (_, made) in watched):
            return True
        return any(root.is_dir() for root in list(self._lost))

    def _settled(self, path: str, closed: bool) -> None:
        """On a register thread: take ``path``, or wait for it again if it is still arriving."""
        try:
            self.intake.settled(path, closed)
        except Settling as exc:
            log.debug("%s; waiting for it to settle again", exc)
            self.found(Path(path))
        except store.OUTAGE_ERRORS as exc:
            # The database busy or away: try this file again once it has settled again,
            # rather than leave it to the next periodic rescan.
            log.warning("could not register %s (%s); trying again", path, exc)
            store.release_connection()
            if not self._stopping.is_set():
                self.found(Path(path))

    def _hand_closed(self, whole: list[tuple[str, str]]) -> None:
        """Closed files (with how: CLOSED or MOVED) wait for the one task that takes them;
        started if none runs."""
        with self._closed_lock:
            self._closed += whole
            if self._closing:
                return
            self._closing = True
        self._register.submit(self._take_closed)

    def _take_closed(self) -> None:
        """On a register thread: take the closed files waiting, then those that arrived
        meanwhile, each time together."""
        while True:
            with self._closed_lock:
                whole, self._closed = self._closed, []
                if self._stopping.is_set():
                    whole = []  # found again by the next start-up rescan
                self._closing = bool(whole)
                if not whole:
                    return
            self._guarded(self._settled_closed, whole)

    def _settled_closed(self, whole: list[tuple[str, str]]) -> None:
        paths = [path for path, _ in whole]
        try:
            again = self.intake.settled_closed(
                paths, written={path for path, how in whole if how == CLOSED}
            )
        except store.OUTAGE_ERRORS as exc:
            log.warning("could not register %d file(s) (%s); trying again", len(paths), exc)
            store.release_connection()
            again = [] if self._stopping.is_set() else paths
        for path in again:
            self.found(Path(path))

    def _take(self, timeout: float | None) -> None:
        """Feed queued events to the tracker: the first within ``timeout``, then all waiting."""
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        rescan = False
        for _ in range(100_000):  # bounded, so due files are looked at during a flood
            rescan |= self._apply(*item)
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                break
        if self.events.empty():
            self._walked.clear()  # no event left that a walk could have covered
        if rescan and not self._stopping.is_set():
            self._guarded(self.rescan)

    def _apply(self, kind: str, path: str, dest: str, is_dir: str, when: float) -> bool:
        """One event; returns whether it asks for a rescan. A move from outside the
        watch has no ``path``, one to outside no ``dest``."""
        if kind == "rescan":
            self._open_writes = {p for p in self._open_writes if os.path.lexists(p)}
            return True
        if is_dir == "True":
            if kind == "attrib":
                return self._mode_changed(path)
            if kind == "created" or (kind == "moved" and dest):
                # Moved in from outside: its files are whole. Renamed inside the watch:
                # each file's own move follows, saying whether a writer still has it.
                how = "moved" if kind == "moved" and not path else ""
                self._touch_tree(dest or path, how, when)
            if kind == "deleted":
                self._retired(path)
            # A folder deleted or moved away: which known files went with it is a rescan's job.
            return kind == "deleted" or (kind == "moved" and bool(path))
        if self.tracker.reports_close:
            self._note_writer(kind, path, dest)
        if kind in _CHANGES or kind == "found":
            self._touch(path, kind)
        elif kind in ("moved", "deleted"):
            if path:
                self.tracker.forget(path)
                self._guarded(self.intake.gone, path)
            if dest:
                # Renamed into place whole, unless its writer still has it open.
                self._touch(dest, "modified" if dest in self._open_writes else "moved")
        return False

    def _note_writer(self, kind: str, path: str, dest: str) -> None:
        """Keep ``_open_writes`` up to date: any name, taken or not."""
        if kind == "modified":
            self._open_writes.add(path)
        elif kind in ("closed", "deleted", "moved"):
            still_open = path in self._open_writes
            self._open_writes.discard(path)
            if kind == "moved" and dest:
                # The name now holds what was moved there (a rename may replace a file).
                (self._open_writes.add if still_open else self._open_writes.discard)(dest)

    def _touch(self, path: str, kind: str = "") -> None:
        if self.intake.locate(path) is None:
            if kind in ("closed", "moved", "found") and (root := self.intake.root_of(path)):
                self._guarded(self.intake.note_ignored, path, root)  # whole: shown as ignored
            return
        try:
            st = os.lstat(path)
        except PermissionError as exc:
            # Its folder cannot be searched: looked at again when the folder's mode changes.
            self.intake.warn_once(path, f"cannot look at it: {exc.strerror or exc}")
            return
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            if stat.S_ISLNK(st.st_mode):
                self.intake.warn_once(path, NOT_FOLLOWED)
            # Never taken; in place of a known file, that file is gone.
            self._guarded(self.intake.gone, path)
        self.tracker.touch(path, event=kind)

    def _touch_tree(self, folder: str, kind: str, since: float) -> None:
        """Touch the files below ``folder``, which appeared at ``since``; not again where a
        walk that began later looked already. A tree made faster than its events are taken
        (watchdog adds one for every folder below a new one) is otherwise walked again
        below each of its folders: 1,500 nested folders, a million listings."""
        if self._walked.get((folder, kind), -math.inf) > since:
            return
        began = time.monotonic()
        for parent, dirs, files in trees.walk(folder, onerror=self._cannot_read):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            self._walked[parent, kind] = began
            for name in files:
                self._touch(os.path.join(parent, name), kind)

    def _cannot_read(self, exc: OSError) -> None:
        folder = str(exc.filename)
        self.intake.unreadable.add(folder)
        reason = f"cannot look into it: {exc.strerror or exc}; its files are taken once it can be"
        self.intake.warn_once(folder, reason)

    def _mode_changed(self, folder: str) -> bool:
        """A folder's mode or times changed (chmod, utime); returns whether to rescan.

        One that could not be read before and can now had no watch made for it (inotify
        needs read access): its watched folder is watched again, and rescanned.
        """
        try:
            os.scandir(folder).close()
        except PermissionError as exc:
            self._cannot_read(exc)
            return False
        except OSError:
            return False
        if folder not in self.intake.unreadable:
            return False
        self.intake.unreadable.discard(folder)
        log.info("%s can be read again; watching it", folder)
        with self._rescan_lock:
            for root in [r for r in self._scheduled if Path(folder).is_relative_to(r)]:
                self._unschedule(self._scheduled.pop(root)[0])
        return True  # the rescan watches it again, and takes what came meanwhile

    def _schedule(self) -> None:
        """Watch every folder not watched yet; one that cannot be watched is only rescanned.

        A watched folder removed (its watch ends with it) is watched again once a folder
        is there again; it is not made again here, as it is at start-up: a volume not
        mounted must not get an empty folder in its place.
        """
        for root in self.intake.roots():
            if self.observer is None:
                return
            here = _identity(root)
            known = self._scheduled.get(root)
            if known is not None:
                if known[1] == here:
                    continue
                del self._scheduled[root]
                self._lost.add(root)
                if here is None:
                    # Unscheduled now, its files' deletions still on their way would be
                    # dropped: let go once the folder's own deletion comes (or it is back).
                    self._retiring[root] = known[0]
                else:
                    self._unschedule(known[0])
                log.warning("watched folder %s is gone; watching it again once it is back", root)
            if root in self._lost and here is None:
                continue
            if root in self._too_deep and self.intake.depth.get(root, DEEPEST) >= DEEPEST:
                continue  # still too deep: a try would fail again, and leak its watches
            if root in self._retiring:
                self._unschedule(self._retiring.pop(root))
            try:
                if root not in self._lost:
                    root.mkdir(parents=True, exist_ok=True)
                watch = self.observer.schedule(_Enqueue(self.events), str(root), recursive=True)
            except (OSError, RecursionError) as exc:
                if isinstance(exc, RecursionError):
                    self._too_deep.add(root)
                # E.g. the inotify watch limit (fs.inotify.max_user_watches), no permission,
                # or folders nested deeper than watchdog's recursive walk can follow.
                self._cannot_watch(root, _why_not(exc))
                self._lost.discard(root)  # no use trying every LOST_POLL; each rescan tries
                continue
            self._scheduled[root] = (watch, _identity(root))
            self._lost.discard(root)
            self._too_deep.discard(root)
            if self._unwatchable.pop(root, None) is not None:
                log.info("watching %s again", root)
            else:
                log.info("watching %s", root)

    def _cannot_watch(self, root: Path, reason: str) -> None:
        """Say once (log and status) that ``root`` is not watched, and why; each rescan
        tries again, and still finds its files."""
        if self._unwatchable.get(root) == reason:
            return
        self._unwatchable[root] = reason
        log.error(
            "cannot watch %s: %s; its files are found by the rescan every "
            "[ingest].rescan_interval instead",
            root,
            reason,
        )

    def warnings(self) -> list[str]:
        """The watched folders that cannot be watched now, each with why (for status)."""
        return [
            f"cannot watch {root}: {reason}; its files are found by the periodic rescan instead"
            for root, reason in list(self._unwatchable.items())
        ]

    def _observer_died(self) -> bool:
        """watchdog's inotify reader stopped on an error (a RecursionError when a folder
        nested deeper than its recursive walk can follow appears): no watched folder gets
        events any more. Then watch them all again with a new observer; a folder that still
        cannot be watched is said once and left to the rescans."""
        reader = getattr(self.observer, "_inotify_fd", None)  # watchdog >= 6, Linux
        if reader is None or reader.is_alive() or self._stopping.is_set():
            return False
        error = getattr(reader, "_dispatch_error", None)
        log.error(
            "the drop-folder watcher stopped (%s); watching the folders again",
            _why_not(error) if isinstance(error, BaseException) else "no reason given",
        )
        with self._rescan_lock:
            old, self.observer = self.observer, self._new_observer()
            self._scheduled.clear()
            self._retiring.clear()
            self.observer.start()
        # Its emitters end as their watches are removed (not waited for); its reader is
        # gone, so removing them may fail: nothing more to undo then.
        with contextlib.suppress(Exception):
            old.stop()
        return True

    def _unschedule(self, watch: Any) -> None:
        with contextlib.suppress(KeyError):  # watchdog may have dropped it already
            self.observer.unschedule(watch)

    def _retired(self, folder: str) -> None:
        """A folder's own deletion: if it was a watched folder gone, all its watch had to
        say has been said."""
        with self._rescan_lock:
            watch = self._retiring.pop(Path(folder), None)
            if watch is not None:
                self._unschedule(watch)

    def _guarded(self, action: Callable[..., Any], *args: Any) -> Any:
        try:
            return action(*args)
        except Exception:
            # A file or a database hiccup must not end the ingest thread; the rescan retries.
            log.exception("ingest: %s%r failed", getattr(action, "__name__", action), args)
            return None
