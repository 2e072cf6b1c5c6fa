"""The file guard: at a job's start and while it runs, is its file still the one queued?"""

from __future__ import annotations

import logging
import os
import stat as stat_module
import time
from pathlib import Path

import peewee as pw

from .. import jobs, store
from ..events import bus
from ..media import MediaError, MediaNotFoundError, probe
from ..store import FileState, Job, MediaFile, fingerprint
from ..trees import lstat_regular
from .records import Outcome, lock_path, metadata

log = logging.getLogger(__name__)


def needs_probe(record: MediaFile) -> bool:
    """Present but not probed yet (taken whole, see ``_admit_whole``): a probed file
    always has a duration (an audio file has no video codec)."""
    return record.state == FileState.PRESENT and record.duration is None


class StillArriving(Exception):
    """A file that does not probe yet, written to moments ago (a writer that closes it
    after each part, as a resumed upload does): its job waits until ``until``."""

    def __init__(self, reason: str, until: float) -> None:
        super().__init__(reason)
        self.reason, self.until = reason, until


def check_arriving(record: MediaFile, quiet: float, reason: str, now: float | None = None) -> None:
    """StillArriving if the file was written to less than ``quiet`` seconds ago."""
    written = lstat_regular(Path(record.path))
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
    MediaFile.update(metadata(info), updated_at=now).where(_unchanged(record)).execute()
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
        if st is not None and self._seen and not record.holds(st):
            now = store.stamp(st)
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
        st = lstat_regular(self.path)
        if st is None:
            return "the file was deleted or moved away during processing"
        if store.written(self._seen, st):
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


def requeue_replaced(job: Job, snapshot: MediaFile) -> Job | None:
    """After ``job`` ended on content its file no longer holds: queue the new content if
    it was registered meanwhile (that registration found ``job`` still active and joined
    it). Otherwise the watcher registers it, and queues it, once it has settled.

    Under the path's lock, as registrations are: one in progress has read ``job`` as
    active but not committed yet, and is waited for (PostgreSQL would otherwise show
    the record as it was, and neither would queue the new content).
    """
    database = MediaFile._meta.database
    with bus.held(), store.write_transaction(database):  # the job announced once committed
        lock_path(database, snapshot.path)
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
