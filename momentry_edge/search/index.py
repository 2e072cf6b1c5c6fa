"""The search index's contents: a file's moments put in when its result completes, its
earlier ones of that processor replaced; results made before the index existed put in
by a background pass at start (``Backfill``)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import peewee as pw

from .. import outputs, store
from ..store import Job, MediaFile, ProcessorRun, RunStatus, SearchEntry, SearchIndexed
from ..words import indexed
from .moments import SEARCHED, moments

log = logging.getLogger(__name__)


def put(file_id: int, processor: str, document: bytes) -> int:
    """Index the moments of ``document`` of ``processor`` for the file in place of the ones
    it had, if it is a completed one (an incomplete run never replaces what a complete
    one indexed), and mark the result indexed; inside the caller's transaction. Returns
    how many moments were indexed."""
    if processor not in SEARCHED:
        return 0
    try:
        parsed = json.loads(document)
    except ValueError:
        parsed = None
    count = 0
    if isinstance(parsed, dict) and parsed.get("status") == outputs.COMPLETED:
        count = _replace(file_id, processor, moments(processor, parsed.get("result")))
    SearchIndexed.insert(file=file_id, processor=processor).on_conflict_ignore().execute()
    return count


def _replace(file_id: int, processor: str, found: list[tuple[Any, Any, str]]) -> int:
    SearchEntry.delete().where(
        SearchEntry.file == file_id, SearchEntry.processor == processor
    ).execute()
    rows = [
        {
            "file": file_id,
            "processor": processor,
            "start": start,
            "end": end,
            "text": text,
            "terms": words,
        }
        for start, end, text in found
        if (words := indexed(text))
    ]
    for at in range(0, len(rows), 500):  # within every database's parameter limit
        SearchEntry.insert_many(rows[at : at + 500]).execute()
    return len(rows)


def forget(file_ids: list[int]) -> None:
    """Take these files' moments out of the index (their results were removed)."""
    for model in (SearchEntry, SearchIndexed):
        model.delete().where(model.file.in_(file_ids)).execute()


def _waiting() -> pw.ModelSelect[ProcessorRun]:
    """(file id, processor) of completed runs of searched processors whose file has no
    indexed result of that processor."""
    indexed_already = SearchIndexed.select(SearchIndexed.id).where(
        SearchIndexed.file == Job.file, SearchIndexed.processor == ProcessorRun.processor
    )
    return (
        ProcessorRun.select(Job.file, ProcessorRun.processor)
        .join(Job)
        .where(
            ProcessorRun.processor.in_(SEARCHED),
            ProcessorRun.status.in_([RunStatus.COMPLETED, RunStatus.SKIPPED]),
            ProcessorRun.output_path.is_null(False),
            ~pw.fn.EXISTS(indexed_already),
        )
        .distinct()
    )


_WAITING_FOR = 5.0  # seconds a count is kept: it reads every run, and searches come often
_waiting_count: tuple[float, int] | None = None


def waiting() -> int:
    """How many files' results the index does not hold yet (as of a few seconds ago)."""
    global _waiting_count
    now = time.monotonic()
    if _waiting_count is None or now - _waiting_count[0] > _WAITING_FOR or _waiting_count[1]:
        _waiting_count = (now, int(_waiting().count()))
    return _waiting_count[1]


class Backfill:
    """Index, in the background, the results this node's results folder holds that the
    index does not: those made before it existed. One pass at start; the service serves
    meanwhile, and a search says the index is incomplete until it is done."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="search-backfill", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        try:
            count = self.run_once()
            if count:
                log.info("search index: %d earlier results indexed", count)
        except Exception:
            log.exception("search index: indexing earlier results stopped")
        finally:
            self.done.set()
            store.release_connection()

    def run_once(self) -> int:
        indexed_now = 0
        for file_id, processor in store.rows(_waiting()):
            if self._stop.is_set():
                break
            if self._index_one(file_id, processor):
                indexed_now += 1
        return indexed_now

    def _index_one(self, file_id: int, processor: str) -> bool:
        record = MediaFile.get_or_none(MediaFile.id == file_id)
        if record is None:
            return False
        folders = outputs.result_folders(self.data_dir, record)
        document: Any = None
        for folder in folders:  # the complete result, not a failed one set aside
            path = outputs.document_path(folder, processor)
            try:
                document = path.read_bytes()
                break
            except OSError:
                continue
        if document is None:
            return False  # on another node's disk: that node indexes it
        with store.write_transaction(SearchEntry._meta.database):
            put(file_id, processor, document)
        return True
