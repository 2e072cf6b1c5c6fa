"""Processor results kept in the queue database (ResultPart), so every node sharing it
serves them: a run's document, subtitles and thumbnails, stored with the run's record;
read first by the views, the results folder after (results made before)."""

# Nodes of one PostgreSQL queue share no disk: a result written to one node's results
# folder would be out of the others' reach, and out of everyone's once that node is off.
# The folder stays as it was, for the people and tools that read it.

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peewee as pw

from . import clock, store
from .outputs import (
    COMPLETED,
    LATER_FIELDS,
    RUN_FIELDS,
    THUMBNAILS,
    Staged,
    document_path,
    of_content,
    thumbnail_names,
    with_later_run,
)
from .store import MediaFile, ProcessorRun, ResultPart

# -- storing, as a run is recorded -------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """A run's document as stored: for the search index to read."""

    file_id: int
    processor: str
    status: str
    document: bytes


def keep_staged(run_id: int, staged: Staged) -> Kept | None:
    """Store the document ``staged`` (placed just now, with its companions) as run
    ``run_id``'s; a completed cut's thumbnails with it. Inside the run's transaction."""
    if staged.result is None:
        return None  # not a run's document
    processor, status = staged.result
    extras = [c.path for c in staged.companions]
    if status == COMPLETED:
        extras += _thumbnails(staged.path.parent, processor)
    return keep(run_id, processor, status, staged.path, extras)


def keep_folder(run_id: int, processor: str, folder: Path) -> Kept | None:
    """Store the completed result of ``processor`` in ``folder`` (one linked from another
    file of the same content) as run ``run_id``'s."""
    document = document_path(folder, processor)
    extras = [
        p
        for p in folder.glob(f"{processor}.*")
        if p.suffix != ".json" and p.is_file() and not p.is_symlink()
    ]
    return keep(run_id, processor, COMPLETED, document, extras + _thumbnails(folder, processor))


def _thumbnails(folder: Path, processor: str) -> list[Path]:
    if f"{processor}.thumbnails" != THUMBNAILS:
        return []
    try:
        with os.scandir(folder / THUMBNAILS) as entries:
            return sorted(Path(e.path) for e in entries if e.is_file(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def keep(
    run_id: int, processor: str, status: str, document: Path, extras: Iterable[Path]
) -> Kept | None:
    """Store ``document`` (as ``<processor>.json``) and ``extras`` (named as in the results
    folder) for run ``run_id``, replacing what they supersede: a completed run replaces
    all of the processor's parts of the file, a failed or partial one only the failed or
    partial parts (a complete result is never replaced by an incomplete one)."""
    row = store.execute(
        "SELECT job.file_id FROM processor_run JOIN job ON job.id = processor_run.job_id"
        " WHERE processor_run.id = ?",
        run_id,
    ).fetchone()
    if row is None:
        return None
    file_id = row[0]
    written = document.read_bytes()
    parts = [(f"{processor}.json", written)]
    folder = document.parent
    parts += [(path.relative_to(folder).as_posix(), path.read_bytes()) for path in extras]
    replaced = "" if status == COMPLETED else " AND status <> ?"
    store.execute(
        f"DELETE FROM result_part WHERE file_id = ? AND processor = ?{replaced}",
        *((file_id, processor) if status == COMPLETED else (file_id, processor, COMPLETED)),
    )
    now = clock.now()
    rows = [
        {
            "file": file_id,
            "run_id": run_id,
            "processor": processor,
            "status": status,
            "name": name,
            "content": content,
            "stored_at": now,
        }
        for name, content in parts
    ]
    for at in range(0, len(rows), 500):  # within every database's parameter limit
        ResultPart.insert_many(rows[at : at + 500]).execute()
    return Kept(file_id, processor, status, written)


# -- reading, for the views --------------------------------------------------------------------


def read_document(record: MediaFile, processor: str) -> bytes | None:
    """The stored document of ``processor`` every view shows, by outputs.shown_result's
    rule: the last complete result for the file's content, with a newer failed or partial
    run named beside it as ``later_run``; without one, the newest stored document. None
    when none is stored."""
    rows: Any = (  # (status, content) tuples, newest first
        ResultPart.select(ResultPart.status, ResultPart.content)
        .where(ResultPart.file == record.id, ResultPart.name == f"{processor}.json")
        .order_by(ResultPart.id.desc())
        .tuples()
    )
    newest: bytes | None = None
    for status, raw in rows:
        content = bytes(raw)
        if newest is None:
            newest = content
        if status != COMPLETED:
            continue
        document = _parsed(content)
        if not of_content(document, record.fingerprint):
            break  # of the file's earlier content: not shown
        if content is newest:
            return content
        return with_later_run(document, _parsed(newest))
    return newest


def summary(record: MediaFile, processors: Iterable[str]) -> dict[str, dict[str, Any]]:
    """For each of ``processors`` with a stored document, what the one read_document
    serves says of its run, as outputs.results_summary gives it from a results folder:
    the file page's list of results, the same on every node."""
    names = {f"{processor}.json": processor for processor in processors}
    rows: Any = (  # (row id, name, status, run id), newest first
        ResultPart.select(ResultPart.id, ResultPart.name, ResultPart.status, ResultPart.run_id)
        .where(ResultPart.file == record.id, ResultPart.name.in_(list(names)))
        .order_by(ResultPart.id.desc())
        .tuples()
    )
    by_processor: dict[str, list[tuple[int, str, int | None]]] = {}
    for row_id, name, status, run_id in rows:
        by_processor.setdefault(names[name], []).append((row_id, status, run_id))
    found = {}
    for processor, stored in by_processor.items():
        shown, later = _shown(stored, record.fingerprint)
        run = _run_brief(shown[0])
        found[processor] = {k: run.get(k) for k in LATER_FIELDS} | {
            "output_path": _output_path(shown[2]),
            "later_run": None if later is None else {k: later.get(k) for k in LATER_FIELDS},
        }
    return found


def _shown(
    stored: list[tuple[int, str, int | None]], fingerprint: str | None
) -> tuple[tuple[int, str, int | None], dict[str, Any] | None]:
    """Of a processor's stored documents (newest first), the one shown and the brief of
    the newer run beside it: read_document's rule."""
    newest = stored[0]
    for row in stored:
        if row[1] != COMPLETED:
            continue
        if not of_content(_run_brief(row[0]), fingerprint):
            break
        return row, None if row is newest else _run_brief(newest[0])
    return newest, None


def _output_path(run_id: int | None) -> str | None:
    """Where the run wrote the document, on the node that ran it."""
    if run_id is None:
        return None
    path = ProcessorRun.select(ProcessorRun.output_path).where(ProcessorRun.id == run_id).scalar()
    return None if path is None else str(path)


# What stored documents say of their runs, by row (a row is never changed): the console
# asks for a file's every processor each time it draws its page, and a document may be
# megabytes.
_BRIEFS: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
_BRIEFS_KEPT = 256
_briefs_lock = threading.Lock()


def _run_brief(row_id: int) -> dict[str, Any]:
    with _briefs_lock:
        if (brief := _BRIEFS.get(row_id)) is not None:
            _BRIEFS.move_to_end(row_id)
            return brief
    content = ResultPart.select(ResultPart.content).where(ResultPart.id == row_id).scalar()
    document = _parsed(bytes(content)) if content is not None else {}
    brief = {k: document.get(k) for k in RUN_FIELDS}
    with _briefs_lock:
        _BRIEFS[row_id] = brief
        while len(_BRIEFS) > _BRIEFS_KEPT:
            _BRIEFS.popitem(last=False)
    return brief


def _parsed(content: bytes) -> dict[str, Any]:
    try:
        document = json.loads(content)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def read_sidecar(record: MediaFile, name: str) -> bytes | None:
    """A stored file written beside the documents (``asr.srt``); None when none is."""
    return _newest(record, name)


def _newest(record: MediaFile, name: str, completed: bool = False) -> bytes | None:
    query = ResultPart.select(ResultPart.content).where(
        ResultPart.file == record.id, ResultPart.name == name
    )
    if completed:
        query = query.where(ResultPart.status == COMPLETED)
    row = query.order_by(ResultPart.id.desc()).limit(1).tuples().first()
    return None if row is None else bytes(row[0])


def scene_thumbnail(record: MediaFile, index: str) -> bytes | None:
    """The stored JPEG of scene ``index`` (as given in a URL) that the stored complete
    cut document names; None when none is stored (then the results folder may hold it)."""
    if not (index.isascii() and index.isdigit() and len(index) <= 18):
        return None
    names = _thumbnail_names(record)
    if names is None:
        return None
    try:
        name = names[int(index)]
    except IndexError:
        return None
    if not isinstance(name, str) or not name.startswith(f"{THUMBNAILS}/"):
        return None
    return _newest(record, name, completed=True)


# The thumbnail names of stored cut documents by their row: a long video's cut.json is
# megabytes, and a page of thumbnails asks for each scene's.
_NAMES: collections.OrderedDict[int, list[Any]] = collections.OrderedDict()
_NAMES_KEPT = 16
_names_lock = threading.Lock()


def _thumbnail_names(record: MediaFile) -> list[Any] | None:
    newest = (
        ResultPart.select(ResultPart.id)
        .where(
            ResultPart.file == record.id,
            ResultPart.name == "cut.json",
            ResultPart.status == COMPLETED,
        )
        .order_by(ResultPart.id.desc())
        .limit(1)
        .scalar()
    )
    if newest is None:
        return None
    with _names_lock:
        if (names := _NAMES.get(newest)) is not None:
            _NAMES.move_to_end(newest)
            return names
    content = ResultPart.select(ResultPart.content).where(ResultPart.id == newest).scalar()
    names = thumbnail_names(bytes(content))
    with _names_lock:
        _NAMES[newest] = names
        while len(_NAMES) > _NAMES_KEPT:
            _NAMES.popitem(last=False)
    return names


# -- the retention sweep's part ----------------------------------------------------------------


def sweep(keep: pw.Query, cutoff: float) -> list[int]:
    """Remove the stored results of files not in ``keep`` (a query of MediaFile ids) stored
    before ``cutoff``, as the sweep removes their results folders; returns those files'
    ids."""
    gone = (
        ResultPart.select(ResultPart.file)
        .where(ResultPart.file.not_in(keep))
        .group_by(ResultPart.file)
        .having(pw.fn.MAX(ResultPart.stored_at) < cutoff)
    )
    files: list[int] = [row[0] for row in store.rows(gone)]
    if files:
        ResultPart.delete().where(ResultPart.file.in_(files)).execute()
    return files
