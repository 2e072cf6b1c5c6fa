"""Processor results on disk: where they live, how they are written, shared and read back."""

# One piece (~640 lines): the results folder's layout, its writes, links and reads
# keep one set of rules about what is the service's own file.

# ``<data_dir>/results/<file_uuid>/`` holds one file's results:
#
# - ``<processor>.json``: the processor's document, ``status`` completed, failed or partial
#   (cancelled), with ``result``, ``error`` and ``last_checkpoint``;
# - ``<processor>.srt`` / ``.vtt``: subtitles beside asr's and asrx's documents;
# - ``cut.thumbnails/``: cut's scene keyframes, named in ``cut.json``;
# - ``<processor>.failed.json`` or ``.partial.json``: a later run that failed or was
#   cancelled, kept beside a complete result so that it never replaces it; removed
#   when the processor next completes. At most one of the two is there at a time.
#
# Files are written 0600 and folders 0700 whatever the process umask: results hold
# transcripts and what was seen. With service.share_group set (share_with), 0640 and 0750
# with that group, so the studio's tools in it can read them.

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import random
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable
from json.encoder import encode_basestring as _string
from pathlib import Path
from typing import Any

from . import durable, store, trees
from .clock import iso
from .store import Job, MediaFile, ProcessorRun

FILE_MODE = 0o600  # share_with changes these (the service's start, backup, restore)
DIR_MODE = 0o700
_GROUP = -1  # the group results are shared with (a gid), -1: none
THUMBNAILS = "cut.thumbnails"  # beside cut.json; linked with it for duplicate content

COMPLETED, FAILED, PARTIAL = "completed", "failed", "partial"
_HASH_CHUNK = 1 << 20

# -- layout ------------------------------------------------------------------------------------


def results_root(data_dir: Path) -> Path:
    return data_dir / "results"


def written_folders(data_dir: Path) -> tuple[Path, Path]:
    """The folders the service writes to, each maybe on a disk of its own: the data dir
    (the database, logs) and the results (often put on a larger or shared disk)."""
    return data_dir, results_root(data_dir)


def results_dir(data_dir: Path, file_uuid: str) -> Path:
    """The folder of one file's results."""
    return results_root(data_dir) / file_uuid


def document_path(folder: Path, processor: str) -> Path:
    return folder / f"{processor}.json"


def aside_path(folder: Path, processor: str, status: str) -> Path:
    """Where a failed or partial document goes while a complete one is kept."""
    return folder / f"{processor}.{status}.json"


# -- writing -----------------------------------------------------------------------------------


def share_with(gid: int | None) -> None:
    """Results private to the service's account (None), or readable by the group ``gid``."""
    global FILE_MODE, DIR_MODE, _GROUP
    FILE_MODE, DIR_MODE = (0o600, 0o700) if gid is None else (0o640, 0o750)
    _GROUP = -1 if gid is None else gid


def give_mode(target: int | str | Path, folder: bool = False) -> None:
    """Give a result file (an open descriptor or a path) or folder its mode and group."""
    mode = DIR_MODE if folder else FILE_MODE
    if isinstance(target, int):
        os.fchmod(target, mode)
        if _GROUP != -1:
            os.fchown(target, -1, _GROUP)
    else:
        os.chmod(target, mode)
        if _GROUP != -1:
            os.chown(target, -1, _GROUP)


def make_dir(folder: Path) -> Path:
    """Create ``folder`` and any missing parents, each DIR_MODE."""
    try:
        os.mkdir(folder, DIR_MODE)
    except FileExistsError:
        return folder
    except FileNotFoundError:
        make_dir(folder.parent)
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:  # made meanwhile by another writer
            return folder
    give_mode(folder, folder=True)  # mkdir's mode would be narrowed by the umask
    durable.flush_folder(folder.parent)  # the new entry, before anything is placed in it
    return folder


def write_atomic(path: Path, text: str) -> Path:
    """Write via a temp file in the same folder and rename, so readers never see half a
    file; the file is flushed to disk before the rename, its folder after it."""
    staged = stage(path, text)
    try:
        return staged.place()
    finally:
        staged.discard()  # not placed: not left behind


class Staged:
    """A file written out (flushed to disk) beside ``path``, under a name of its own, until
    ``place`` renames it to ``path``; ``discard`` removes it if it was not placed."""

    def __init__(
        self, tmp: str, path: Path, after: Callable[[], None] | None = None, *, fresh: bool = False
    ) -> None:
        self._tmp = tmp
        self.path = path
        # What placing it replaces besides (documents set aside): nothing, in a folder that
        # was made for it (fresh).
        self._after = None if fresh else after
        self._placed = False
        self.companions: list[Staged] = []  # placed just before it (a run's extra files)
        # (processor, status) of a run's document (stage_result): stored with the run.
        self.result: tuple[str, str] | None = None

    def place(self) -> Path:
        """Put the file at ``path``; again, when already placed, does nothing."""
        if not self._placed:
            for companion in self.companions:
                companion.place()
            os.replace(self._tmp, self.path)
            self._placed = True
            # Before the caller records it (a run's completion commits after this).
            durable.flush_folder(self.path.parent)
            if self._after is not None:
                self._after()
        return self.path

    def discard(self) -> None:
        for companion in self.companions:
            companion.discard()
        if not self._placed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)


def stage(path: Path, text: str, after: Callable[[], None] | None = None) -> Staged:
    """``text`` written to a temp file beside ``path``, to be placed there (Staged).
    Written with the os calls themselves: a few documents a job, where Python's file
    objects cost more than the writing."""
    data = text.encode("utf-8")
    fd, tmp, fresh = _temp_file(path)
    try:
        try:
            give_mode(fd)  # os.open's mode would be narrowed by the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            durable.flush(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Staged(tmp, path, after, fresh=fresh)


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _temp_file(path: Path) -> tuple[int, str, bool]:
    """A new file beside ``path`` (``.<name>.<random>``), open for writing, and whether its
    folder was made for it (make_dir) as it was not there."""
    made = False
    while True:
        tmp = f"{path.parent}{os.sep}.{path.name}.{random.getrandbits(48):012x}"
        try:
            return os.open(tmp, _TEMP_FLAGS, FILE_MODE), tmp, made
        except FileExistsError:
            continue  # another writer's name: draw again
        except FileNotFoundError:
            if made:
                raise
            make_dir(path.parent)
            made = True


def write_json_atomic(path: Path, data: Any) -> Path:
    return write_atomic(path, indented(data) + "\n")


def indented(data: Any) -> str:
    """``json.dumps(data, ensure_ascii=False, indent=2)``, the same text, but strict JSON
    (store.NotJSON for NaN or Infinity: strict parsers refuse them). For a document
    (a dict of mostly plain values) its top level is written here and each plain value
    by json's C encoder: json's indenting encoder is written in Python."""
    if not isinstance(data, dict) or not data or not all(isinstance(k, str) for k in data):
        return store.to_json(data, indent=2)
    items = []
    for key, value in data.items():
        if isinstance(value, dict | list | tuple) and value:
            # Nested lines one level deeper: JSON strings hold no raw line breaks.
            text = store.to_json(value, indent=2).replace("\n", "\n  ")
        elif isinstance(value, str):
            text = _string(value)
        elif value is None:
            text = "null"
        else:
            text = store.to_json(value)
        items.append(f"  {_string(key)}: {text}")
    return store.utf8("{\n" + ",\n".join(items) + "\n}")  # the strings written as they are


def write_result(
    folder: Path,
    job: Job,
    processor: str,
    status: str,
    result: Any,
    **details: Any,
) -> Path:
    """Write a processor's document (see stage_result); returns where it went."""
    staged = stage_result(folder, job, processor, status, result, **details)
    try:
        return staged.place()
    finally:
        staged.discard()  # not placed: not left behind


def stage_result(
    folder: Path,
    job: Job,
    processor: str,
    status: str,
    result: Any,
    *,
    error: str | None = None,
    checkpoint: dict[str, Any] | None = None,
    backend: str | None = None,
    model: str | None = None,
    version: str | None = None,
) -> Staged:
    """A processor's document, written out and ready to be put in place (Staged): the
    worker places it only while it still holds the job (jobs._write_run).

    A failed or partial run never replaces a complete result: it goes beside it
    (``aside_path``). A completed one removes what was set aside before it.
    """
    checkpoint = checkpoint or {}
    document = {
        "processor": processor,
        "status": status,
        "completed_at": iso(time.time()),
        "backend": backend,
        "model": model,
        "version": version,
        "task_id": job.task_id,
        "file_uuid": job.file.file_uuid,
        "fingerprint": job.file.fingerprint,  # the content this result is of
        "result": result,
        "error": error,
        "last_checkpoint": {k: checkpoint[k] for k in ("frame", "timestamp") if k in checkpoint}
        or None,
    }
    staged = _stage_document(folder, processor, status, indented(document) + "\n")
    staged.result = (processor, status)
    return staged


def _stage_document(folder: Path, processor: str, status: str, text: str) -> Staged:
    path = document_path(folder, processor)
    if status != COMPLETED and _holds_complete_result(path):
        other = aside_path(folder, processor, PARTIAL if status == FAILED else FAILED)
        # The newer of the two set aside tells.
        return stage(
            aside_path(folder, processor, status), text, lambda: other.unlink(missing_ok=True)
        )
    if status == COMPLETED:
        return stage(path, text, lambda: _drop_asides(folder, processor))
    return stage(path, text)


def _holds_complete_result(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("status") == COMPLETED
    except (OSError, ValueError, AttributeError):
        return False


def _drop_asides(folder: Path, processor: str) -> None:
    for status in (FAILED, PARTIAL):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside_path(folder, processor, status))


# -- reading, for the API ----------------------------------------------------------------------


def result_folders(data_dir: Path, record: MediaFile) -> list[Path]:
    """Where the file's results may be: this node's folder, then, newest first, the folders
    other nodes sharing the queue wrote its documents to (as recorded with their runs;
    readable here when the nodes share a file system or a machine)."""
    own = results_dir(data_dir, record.file_uuid)
    written = (
        ProcessorRun.select(ProcessorRun.output_path)
        .join(Job)
        .where(Job.file == record.id, ProcessorRun.output_path.is_null(False))
        .order_by(ProcessorRun.id.desc())
    )
    folders = [own]
    for (output_path,) in store.rows(written):
        folder = Path(output_path).parent
        # Only a results folder of this file: a duplicate's document is linked into it.
        if folder.name == record.file_uuid and folder not in folders:
            folders.append(folder)
    return folders


# What a document says of its run (all but its result), and what a newer run set aside
# beside a complete result says of itself (``later_run``).
RUN_FIELDS = ("status", "task_id", "completed_at", "error", "last_checkpoint", "fingerprint")
LATER_FIELDS = ("status", "task_id", "completed_at", "error", "last_checkpoint")


@dataclasses.dataclass(frozen=True)
class Shown:
    """The document of a processor that stands as its result (``name`` in ``folder``), what
    it says of its run, and what a newer failed or partial run beside it says (or None)."""

    folder: Path
    name: str
    run: dict[str, Any]
    later: dict[str, Any] | None


def shown_result(folders: list[Path], processor: str, fingerprint: str | None) -> Shown | None:
    """The result of ``processor`` every view shows, from the first of ``folders`` that has
    a document of it; None when it has not run.

    That is its last complete result for the file's content (``fingerprint``), with a newer
    failed or partial run set aside beside it as ``later``. Without such a result, the
    newest document there is (a failure, a cancelled run's partial output) stands alone.
    """
    for folder in folders:
        main = document_path(folder, processor).name
        found = _run_of(folder, main)
        later_name, later = None, None
        for status in (FAILED, PARTIAL):  # at most one of the two is there
            later_name = aside_path(folder, processor, status).name
            if (later := _run_of(folder, later_name)) is not None:
                break
        if found is None and later is None:
            continue
        # Of a file rewritten since, a complete result is of its earlier content: not shown.
        if found is not None and found["status"] == COMPLETED and of_content(found, fingerprint):
            brief = {k: later[k] for k in LATER_FIELDS} if later is not None else None
            return Shown(folder, main, found, brief)
        if later is not None and later_name is not None:
            return Shown(folder, later_name, later, None)  # set aside: newer than the main one
        assert found is not None
        return Shown(folder, main, found, None)
    return None


def read_shown(shown: Shown) -> bytes | None:
    """The document ``shown`` names as served: as stored, with ``later_run`` added when a
    newer run failed or was cancelled beside it; None when it is gone meanwhile."""
    document = _read_own(shown.folder, shown.name)
    if document is None or shown.later is None:
        return document
    try:
        parsed = json.loads(document)
    except ValueError:
        return document
    return with_later_run(parsed, shown.later)


def of_content(run: dict[str, Any], fingerprint: str | None) -> bool:
    """Whether a document's run (its ``fingerprint``) is of the file's content now (one
    written before documents said it counts as such)."""
    return fingerprint is None or run.get("fingerprint") in (None, fingerprint)


def with_later_run(document: dict[str, Any], later: dict[str, Any]) -> bytes:
    """``document`` as served with ``later_run``: the brief (LATER_FIELDS) of a newer run
    of its processor that failed or was cancelled."""
    brief = {k: later.get(k) for k in LATER_FIELDS}
    return (indented(document | {"later_run": brief}) + "\n").encode("utf-8")


def read_result(folders: list[Path], processor: str, fingerprint: str | None) -> bytes | None:
    """The document of ``processor`` every view shows (shown_result, read_shown) as served;
    None when it has not run."""
    shown = shown_result(folders, processor, fingerprint)
    return None if shown is None else read_shown(shown)


def results_summary(
    folders: list[Path], processors: list[str], fingerprint: str | None
) -> dict[str, dict[str, Any]]:
    """For each of ``processors`` that has a document, what the shown one says of its run
    (status, task_id, completed_at, error, last_checkpoint), where it is (output_path) and
    its ``later_run``."""
    summary = {}
    for processor in processors:
        shown = shown_result(folders, processor, fingerprint)
        if shown is not None:
            summary[processor] = {k: shown.run[k] for k in LATER_FIELDS} | {
                "output_path": str(shown.folder / shown.name),
                "later_run": shown.later,
            }
    return summary


# What documents say of their runs, by (folder, name, the file's identity): the console asks
# for a file's every processor each time it draws its page, and a document may be megabytes.
_RUNS: collections.OrderedDict[tuple[Any, ...], dict[str, Any] | None] = collections.OrderedDict()
_RUNS_KEPT = 256
_runs_lock = threading.Lock()


def _run_of(folder: Path, name: str) -> dict[str, Any] | None:
    """What the document ``name`` in ``folder`` says of its run (RUN_FIELDS); None when
    there is none, or it is not a document."""
    fd = _open_own(folder, name)
    if fd is None:
        return None
    with open(fd, "rb") as file:
        st = os.fstat(fd)
        key = (str(folder), name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with _runs_lock:
            if key in _RUNS:
                _RUNS.move_to_end(key)
                return _RUNS[key]
        try:
            document = json.loads(file.read())
        except ValueError:
            document = None
    run = None
    if isinstance(document, dict) and isinstance(document.get("status"), str):
        run = {k: document.get(k) for k in RUN_FIELDS}
    with _runs_lock:
        _RUNS[key] = run
        while len(_RUNS) > _RUNS_KEPT:
            _RUNS.popitem(last=False)
    return run


def read_sidecar(folders: list[Path], name: str) -> bytes | None:
    """A file written beside the documents (``asr.srt``), from the first of ``folders``
    that has it; None when none has."""
    for folder in folders:
        content = _read_own(folder, name)
        if content is not None:
            return content
    return None


def _read_own(folder: Path, name: str) -> bytes | None:
    """The bytes of the file the service wrote at ``folder / name`` (``name`` may hold
    ``/``); None when there is none (see _open_own)."""
    fd = _open_own(folder, name)
    if fd is None:
        return None
    with open(fd, "rb") as file:
        return file.read()


def _open_own(folder: Path, name: str) -> int | None:
    """A descriptor of the regular file at ``folder / name``; None when there is none.

    A link anywhere below the results root, or anything but a regular file, counts as
    none: a link put in a results folder (by hand, or by a backup restored) could point
    anywhere on the machine, and a FIFO would hold the request for ever. Each part is
    opened without following links, from the results root (which may itself be a link:
    results on shared storage).
    """
    parts = [folder.name, *name.split("/")]
    try:
        fd = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        for part, flags in zip(parts, [_DIR_FLAGS] * (len(parts) - 1) + [_FILE_FLAGS], strict=True):
            inner = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # ELOOP: a part of the path is a link
            os.close(fd)
            raise
    os.close(fd)
    return None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def scene_thumbnail(folders: list[Path], index: str) -> bytes | None:
    """The JPEG of scene ``index`` (as given in a URL) that cut.json names, in the first of
    ``folders`` that has a cut.json, if there is one."""
    # At most 18 digits: int() refuses a string of thousands, and no cut has that many scenes.
    if not (index.isascii() and index.isdigit() and len(index) <= 18):
        return None
    for folder in folders:
        try:
            names = _thumbnail_names(folder)
        except OSError:
            return None
        if names is None:
            continue
        try:
            name = names[int(index)]
        except IndexError:
            return None
        if not isinstance(name, str) or not name.startswith(f"{THUMBNAILS}/") or ".." in name:
            return None
        try:
            return _read_own(folder, name)
        except OSError:
            return None
    return None


# cut.json's thumbnail names by (folder, the file's identity): a long video's cut.json is
# megabytes, and a page of thumbnails asks for each scene's.
_THUMBNAIL_NAMES: collections.OrderedDict[tuple[Any, ...], list[Any]] = collections.OrderedDict()
_THUMBNAIL_NAMES_KEPT = 16
_thumbnail_lock = threading.Lock()


def thumbnail_names(document: bytes) -> list[Any]:
    """The ``thumbnail`` of each scene of a cut document as written ([] if it is not one)."""
    try:
        scenes = json.loads(document)["result"]["scenes"]
        return [scene.get("thumbnail") if isinstance(scene, dict) else None for scene in scenes]
    except (ValueError, LookupError, TypeError, AttributeError):
        return []


def _thumbnail_names(folder: Path) -> list[Any] | None:
    """The ``thumbnail`` of each scene in ``folder``'s cut.json ([] if it is not a cut
    document), None when there is no cut.json; parsed once per version of the file."""
    fd = _open_own(folder, document_path(folder, "cut").name)
    if fd is None:
        return None
    with open(fd, "rb") as file:
        st = os.fstat(fd)
        key = (str(folder), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with _thumbnail_lock:
            if (names := _THUMBNAIL_NAMES.get(key)) is not None:
                _THUMBNAIL_NAMES.move_to_end(key)
                return names
        names = thumbnail_names(file.read())
    with _thumbnail_lock:
        _THUMBNAIL_NAMES[key] = names
        while len(_THUMBNAIL_NAMES) > _THUMBNAIL_NAMES_KEPT:
            _THUMBNAIL_NAMES.popitem(last=False)
    return names


# -- the retention sweep's part ----------------------------------------------------------------


def stored(data_dir: Path) -> list[tuple[str, float]]:
    """(file_uuid, last modified) of every file's results folder."""
    try:
        folders = [p for p in results_root(data_dir).iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []
    found = []
    for folder in folders:
        with contextlib.suppress(FileNotFoundError):
            found.append((folder.name, folder.stat().st_mtime))
    return found


# The folders a run fills before its result is placed (processors/keyframes.py's
# ``.cut.thumbnails.work``, and the ``.new`` and ``.old`` sets of its publish): named
# ``.<processor>.<what>.<work|new|old>``, each matched whole.
WORK_FOLDER = re.compile(r"\.[a-z0-9_-]+\.[^/]+\.(?:work|new|old)")


def remove_work(out_dir: Path, processor: str) -> int:
    """Remove the work folders of ``processor``'s run in ``out_dir`` (a run that ended
    without its result: they may hold thousands of files); returns how many."""
    removed = 0
    try:
        with os.scandir(out_dir) as entries:
            found = [
                e
                for e in entries
                if e.name.startswith(f".{processor}.")
                and WORK_FOLDER.fullmatch(e.name)
                and e.is_dir(follow_symlinks=False)
            ]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for entry in found:
        trees.remove(entry.path)
        removed += 1
    return removed


def remove(data_dir: Path, file_uuid: str) -> None:
    """Remove a file's results folder (linked results of other files stay with them)."""
    trees.remove(results_dir(data_dir, file_uuid))


# -- results shared between files of the same content ----------------------------------------


@store.retried  # read as a run starts: a dropped connection must not fail the run
def duplicate_output(
    record: MediaFile, processor: str, model: str | None, version: str, out_dir: Path
) -> tuple[str, str] | None:
    """A completed output of this processor (same model and version) for the same content.

    This file's own earlier result is "up to date"; another file's is linked into
    ``out_dir`` as a "duplicate of" it. Returns (reason, output_path) for
    ``jobs.skip_run``, or None when the processor has to run.
    """
    if not record.fingerprint:
        return None
    query = (
        ProcessorRun.select(ProcessorRun.output_path, MediaFile.file_uuid, MediaFile.id)
        .join(Job)
        .join(MediaFile)
        .where(
            MediaFile.fingerprint == record.fingerprint,
            ProcessorRun.processor == processor,
            ProcessorRun.status == store.RunStatus.COMPLETED,
            ProcessorRun.model.is_null() if model is None else ProcessorRun.model == model,
        )
        .order_by(ProcessorRun.completed_at.desc())
    )
    for output_path, original, original_id in store.rows(query):
        source = Path(output_path or "")
        try:
            document = json.loads(source.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if document.get("status") != COMPLETED or str(document.get("version")) != version:
            continue
        if original == record.file_uuid:
            # Its own output must be of this content, not of what the file held before.
            if document.get("fingerprint") == record.fingerprint:
                _drop_asides(source.parent, processor)  # this job's outcome is that result
                return "up to date", str(source)
            continue
        # The fingerprint only samples the content: share results only when all of it matches.
        mine = content_hash(record)
        if mine is None or mine != content_hash(MediaFile.get_by_id(original_id)):
            continue
        linked = _link_outputs(source, processor, out_dir)
        return f"duplicate of {original}", str(linked)
    return None


def content_hash(record: MediaFile) -> str | None:
    """A hash of the file's whole content, computed once per content and stored.

    None when the file on disk is no longer what ``record`` describes (gone, changed
    since it was registered, unreadable): then nothing can be confirmed about it.
    """
    if record.content_hash:
        return record.content_hash
    path = Path(record.path)
    before = _regular_stat(path)
    if before is None or not _still_holds(record, before):
        return None
    digest = hashlib.blake2b(digest_size=32)
    try:
        with path.open("rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    after = _regular_stat(path)
    if after is None or store.written(before, after):
        return None  # written while it was read
    value = digest.hexdigest()
    # Stored only while the record still describes this content (not re-registered meanwhile).
    saved = (
        MediaFile.update(content_hash=value)
        .where(
            MediaFile.id == record.id,
            MediaFile.size == record.size,
            MediaFile.mtime == record.mtime,
            MediaFile.inode == record.inode,
            MediaFile.ctime == record.ctime,
            MediaFile.fingerprint == record.fingerprint,
        )
        .execute()
    )
    if saved:
        record.content_hash = value  # the job's other processors ask the same instance
    return value


def _still_holds(record: MediaFile, st: os.stat_result) -> bool:
    """Whether the file is still the content ``record`` was read for. When only its ctime
    moved (a hard link made to it, a chmod: no event tells the watcher), its samples
    decide, as a rescan's look would."""
    if record.holds(st):
        return True
    if (record.size, record.mtime, record.inode) != tuple(store.stamp(st).values())[:3]:
        return False
    try:
        return store.fingerprint(Path(record.path), st.st_size) == record.fingerprint
    except OSError:
        return False


def _regular_stat(path: Path) -> os.stat_result | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _link_outputs(source: Path, processor: str, out_dir: Path) -> Path:
    """Hard-link ``<processor>.json`` (and .srt, .vtt, cut.thumbnails) of the original into
    ``out_dir``; what was set aside there before is superseded. Hard links, not symlinks:
    the original's next run replaces its files with new ones (or retention removes
    them), and these keep what they are, the results of this content."""
    make_dir(out_dir)
    for item in source.parent.glob(f"{processor}.*"):
        if item.name.endswith((f".{PARTIAL}.json", f".{FAILED}.json")) or item.is_symlink():
            continue  # a link there is none of ours: what it points to is not shared
        target = out_dir / item.name
        tmp = out_dir / f".{item.name}.{os.getpid()}.link"
        _remove(tmp)
        if item.is_dir():
            # A link inside is copied as the link, which is never served (_open_own).
            trees.copy(item, tmp, copy_function=_link_or_copy)
            durable.flush_folder(tmp)
            old = out_dir / f".{item.name}.{os.getpid()}.old"
            _remove(old)
            if target.is_symlink() or target.exists():
                os.replace(target, old)  # a folder is not replaced by a rename onto it
            os.replace(tmp, target)
            _remove(old)
        else:
            _link_or_copy(item, tmp)
            os.replace(tmp, target)  # atomic, like every other output
    durable.flush_folder(out_dir)
    _drop_asides(out_dir, processor)
    return document_path(out_dir, processor)


def _link_or_copy(source: Path | str, target: Path | str) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:  # a file system without hard links (some external drives)
        shutil.copy2(source, target, follow_symlinks=False)
        durable.flush_file(target)


def _remove(path: Path) -> None:
    trees.remove(path)
