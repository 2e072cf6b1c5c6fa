"""A file's record: its stat observed, its content glanced at, its row written."""

from __future__ import annotations

import os
import stat as stat_module
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import peewee as pw

from .. import jobs, store
from ..errors import Conflict, Invalid
from ..media import EMPTY, MediaError, MediaInfo, MediaNotFoundError, is_transient, probe
from ..store import FileState, Job, JobStatus, MediaFile, fingerprint
from ..words import fold
from .guard import needs_probe
from .paths import file_uuid_for
from .records import Outcome, metadata

# A file that does not probe yet and was written to less than this many seconds ago,
# by a writer not known to have closed it, is taken to be still arriving, not broken.

WRITING_GRACE = 60.0


ABORTED = "upload did not finish (the upload hook sent upload_status other than 1)"


GONE = "gone from disk"


class Gone(Exception):
    """The file vanished (or turned into something else) before it could be registered."""


@dataclass(frozen=True)
class _Observed:
    state: str
    reason: str | None
    info: MediaInfo | None
    fingerprint: str | None
    transient: bool = False  # rejected for a cause that can pass (see MediaFile.transient)


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
    """Known, and its stat unchanged since it was read (``store.unchanged``): no need to read
    it again.

    A file that is missing, or rejected for a cause that can pass without the file
    changing, is always looked at again; so is one ignored before (its kind is taken now).
    """
    if state in (FileState.MISSING, FileState.IGNORED):
        return False
    if state == FileState.REJECTED and transient:
        return False
    return store.unchanged((size, mtime, inode, ctime), st)


def _stamp(found: Sequence[tuple[str, os.stat_result]]) -> None:
    """Give records made before the inode and ctime columns existed their file's, as the
    rescan finds it unchanged otherwise (never read again for that)."""
    database = MediaFile._meta.database
    for chunk in pw.chunked(found, 500):
        with store.write_transaction(database):
            for path, st in chunk:
                fields = store.stamp(st)
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
        "folded_name": fold(path.name),
        **store.stamp(st),
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
        fields |= metadata(observed.info)
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
        "folded_name": fold(path.name),
        **store.stamp(st),
        "state": observed.state,
        "reason": observed.reason,
        "fingerprint": observed.fingerprint,
        "transient": observed.transient,
        "registered_at": now,
        "updated_at": now,
        **metadata(observed.info),
    }


def _upload_failed(record: MediaFile, st: os.stat_result) -> None:
    """The hook reports a failed upload of a known file. Its waiting jobs are cancelled (a
    failed upload is never processed). A job already running on the very content the file
    still holds is not pulled from under it: Conflict. Changed content is rejected as
    usual, and the running job notices the replaced file itself (FileGuard)."""
    active = list(Job.select().where(Job.file == record.id, Job.status.in_(store.ACTIVE_STATES)))
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
