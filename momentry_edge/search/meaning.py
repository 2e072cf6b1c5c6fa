"""A search by meaning: every moment's text embedded (``Embedder``, in the background),
and a query answered by the moments nearest to it in meaning (``search``)."""

# The vectors are float16 blobs in the queue database (SearchVector), so every node
# shares them, and a query reads them in chunks of CHUNK, keeping only the best: memory
# stays flat however many there are. Neither sqlite-vec (this Python's sqlite3 cannot
# load extensions) nor pgvector (not installed on the PostgreSQL here) is needed; at
# 2 M moments a scan reads 1.5 GB (benchmarks/meaning_bench.py).
#
# Moments are embedded after the run that made them is recorded, not inside its
# transaction: that would hold the database's write lock for the seconds the model takes.

from __future__ import annotations

import heapq
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
import peewee as pw

from .. import store
from ..errors import Conflict, Invalid
from ..store import SearchEntry, SearchVector
from . import query

log = logging.getLogger(__name__)

CHUNK = 4096  # vectors read at a time (3 MB)
MIN_SCORE = 0.2  # cosine similarity below which a moment is taken as not about the query
BATCH = 64  # moments embedded in one write
POLL = 2.0  # seconds between looks for new moments while idle
AFTER = 30.0  # seconds before embedding is tried again after an error
SWEEP_EVERY = 600.0  # seconds between full looks (a moment committed out of id order)


class Embedder:
    """Embeds, on one background thread, the moments that have no vector yet: new ones
    as their runs complete (within POLL seconds) and those indexed before the model was in
    place. Idle, and loading nothing, while no moment wants a vector or the model is not in
    place."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="search-meaning", daemon=True)
        self._after = 0  # every moment up to this id has a vector (until a sweep says no)
        self._swept = 0.0
        self._said_missing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            pause, began = 0.0, time.monotonic()
            try:
                # After a batch, a rest as long as it took: a backlog (moments indexed
                # before the model was there) takes at most half of one core from jobs.
                pause = time.monotonic() - began if self.step() else POLL
            except Exception:  # the database out, say: said, and tried again later
                log.exception("search by meaning: embedding stopped; tried again in %d s", AFTER)
                pause = AFTER
            finally:
                store.release_connection()
            self._stop.wait(pause)

    def step(self) -> int:
        """Embed the next BATCH moments that need it; how many (0: none waiting, or no
        model)."""
        if time.monotonic() - self._swept > SWEEP_EVERY:
            self._after, self._swept = 0, time.monotonic()
        else:  # moments deleted and their ids used again (SQLite) are looked at anew
            newest = SearchVector.select(pw.fn.MAX(SearchVector.entry)).scalar() or 0
            self._after = min(self._after, newest)
        top = SearchEntry.select(pw.fn.MAX(SearchEntry.id)).scalar() or 0
        todo = store.rows(
            SearchEntry.select(SearchEntry.id, SearchEntry.text)
            .where(
                SearchEntry.id > self._after,
                ~pw.fn.EXISTS(
                    SearchVector.select(SearchVector.entry).where(
                        SearchVector.entry == SearchEntry.id
                    )
                ),
            )
            .order_by(SearchEntry.id)
            .limit(BATCH)
        )
        if not todo:
            self._after = max(self._after, top)  # every moment up to top has its vector
            return 0
        # Loaded once a moment wants it (the encoder with numpy): a service that indexes
        # nothing never loads it.
        from . import encoder

        try:
            model = encoder.load()
        except encoder.MeaningUnavailable as exc:
            if not self._said_missing:
                log.info("search by meaning is off: %s", exc)
                self._said_missing = True
            return 0
        vectors = encoder.as_blob(model.encode([text for _, text in todo]))
        rows = [
            {"entry": entry_id, "vector": v} for (entry_id, _), v in zip(todo, vectors, strict=True)
        ]
        with store.write_transaction(SearchVector._meta.database):
            # A moment replaced meanwhile (a re-run; SQLite may give its id to another
            # moment) gets no vector: the next step embeds what is there now.
            alive = set(
                store.rows(
                    SearchEntry.select(SearchEntry.id, SearchEntry.text).where(
                        SearchEntry.id.in_([entry_id for entry_id, _ in todo])
                    )
                )
            )
            kept = [r for r, item in zip(rows, todo, strict=True) if tuple(item) in alive]
            if kept:
                SearchVector.insert_many(kept).on_conflict_ignore().execute()
        self._after = todo[-1][0]
        return len(todo)


def search(text: str, filters: query.Filters, limit: int, offset: int) -> dict[str, Any]:
    """The answer of GET /api/v1/search?mode=meaning: the moments nearest in meaning to
    ``text``, best first, those at least MIN_SCORE alike."""
    text = text.strip()
    if not text:
        raise Invalid("q has no words to search for")
    if len(text) > query.MAX_QUERY:
        raise Invalid(f"q must be at most {query.MAX_QUERY} characters")
    from . import encoder

    try:
        model = encoder.load()
    except encoder.MeaningUnavailable as exc:
        # The node's state, not the client's request: 409 (the API answers no 5xx).
        raise Conflict(str(exc)) from None
    wanted = model.encode([text])[0]
    # Twice the page: a moment both asr and asrx hold is shown once (_hits).
    best, total = _nearest(wanted, filters, 2 * (limit + offset))
    hits = _hits(best)[offset : offset + limit]
    query.add_thumbnails(hits)
    try:
        words = query.parse(text)  # to mark the query's own words where a moment has them
    except Invalid:
        words = query.Query([])
    waiting = _waiting()
    return {
        "query": text,
        "hits": [query.render(hit, words) for hit in hits],
        "total": total,
        "total_exact": True,
        "limit": limit,
        "offset": offset,
        "index": {"complete": waiting == 0, "waiting": waiting},
    }


def _nearest(
    wanted: np.ndarray, filters: query.Filters, count: int
) -> tuple[list[tuple[float, int]], int]:
    """The ``count`` best (score, entry id) passing the filters, and how many are at least
    MIN_SCORE alike; the vectors read CHUNK at a time."""
    import numpy as np

    from . import encoder

    select = SearchVector.select(SearchVector.entry, SearchVector.vector)
    conditions = query.file_conditions(filters)
    if filters.processor or conditions:
        select = select.join(SearchEntry)
        if filters.processor:
            select = select.where(SearchEntry.processor == filters.processor)
        if conditions:
            files = store.MediaFile.select(store.MediaFile.id)
            for condition in conditions:
                files = files.where(condition)
            select = select.where(SearchEntry.file.in_(files))
    database = SearchVector._meta.database
    best: list[tuple[float, int]] = []  # a heap of the best so far, worst first
    total, after = 0, 0
    wanted32 = wanted.astype(np.float32)
    while True:
        page = select.where(SearchVector.entry > after).order_by(SearchVector.entry).limit(CHUNK)
        chunk = database.execute(page).fetchall()  # plain tuples: no model rows to build
        if not chunk:
            break
        after = chunk[-1][0]
        scores = encoder.from_blobs([blob for _, blob in chunk]).astype(np.float32) @ wanted32
        good = np.flatnonzero(scores >= MIN_SCORE)
        total += len(good)
        for at in good[np.argsort(-scores[good])[:count]]:
            item = (float(scores[at]), int(chunk[at][0]))
            if len(best) < count:
                heapq.heappush(best, item)
            elif item > best[0]:
                heapq.heapreplace(best, item)
        if len(chunk) < CHUNK:
            break
    return sorted(best, reverse=True), total


def _hits(best: list[tuple[float, int]]) -> list[dict[str, Any]]:
    if not best:
        return []
    score = {entry_id: s for s, entry_id in best}
    rows = store.rows(
        SearchEntry.select(
            SearchEntry.id,
            SearchEntry.file,
            store.MediaFile.file_uuid,
            store.MediaFile.name,
            store.MediaFile.rel_path,
            SearchEntry.processor,
            SearchEntry.start,
            SearchEntry.end,
            SearchEntry.text,
        )
        .join(store.MediaFile)
        .where(SearchEntry.id.in_(list(score)))
    )
    hits = [query.moment_hit(row, score[row[0]], [row[5]]) for row in rows]
    hits.sort(key=lambda h: (-h["score"], -h["entry_id"]))
    # asr and asrx transcribe the same speech: one moment said twice is shown once, with
    # both as its sources (as word search shows it).
    kept: dict[tuple[Any, ...], dict[str, Any]] = {}
    for hit in hits:
        same = (hit["file_id"], hit["start"], hit["end"], hit["text"])
        if same in kept:
            kept[same]["sources"] = sorted({*kept[same]["sources"], hit["processor"]})
        else:
            kept[same] = hit
    return list(kept.values())


_WAITING_FOR = 5.0  # seconds a count is kept
_waiting_count: tuple[float, int] | None = None


def _waiting() -> int:
    """How many moments have no vector yet (as of a few seconds ago)."""
    global _waiting_count
    now = time.monotonic()
    if _waiting_count is None or now - _waiting_count[0] > _WAITING_FOR or _waiting_count[1]:
        entries = SearchEntry.select().count()
        _waiting_count = (now, max(0, entries - SearchVector.select().count()))
    return _waiting_count[1]
