"""A search: the user's query read into clauses, run on the database's full-text index,
its hits ranked, with snippets and the thumbnail of the scene each falls in."""

# Queries are read here, never handed to the database's query syntax: every term is cut
# from the query by the index's own rules (words.py), so it holds letters and digits
# only, and is quoted when the full-text expression is written. ``"..."`` is a phrase, a
# word ending in ``*`` a prefix, several words must all be there; anything else (``-``,
# ``:``, ``NEAR``, ``OR``, brackets, SQL) is read as words or dropped as punctuation.

from __future__ import annotations

import bisect
import collections
import csv
import io
import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import peewee as pw

from .. import outputs, store
from ..errors import Invalid
from ..store import MediaFile, ResultPart, SearchEntry
from ..words import fold, is_cjk, stem, terms, word_terms, words
from . import index
from .moments import SEARCHED, TRANSCRIPTS

MAX_QUERY = 1000  # characters
MAX_CLAUSES = 16
# Hits are ranked within the newest CANDIDATES that match (and pass the filters): exact
# BM25 over every match of a common word costs about a microsecond a match. Beyond it,
# the total is a lower bound ("total_exact": false).
CANDIDATES = 2000
# PostgreSQL: a phrase's candidates are looked for among the newest PHRASE_SCAN moments
# that hold all its words (its GIN index knows words, not where they are). The same
# bound as a word's: reading them costs what a word as common as all of them costs.
PHRASE_SCAN = 2000
# PostgreSQL's planner reads how common a prefix is off the terms ANALYZE found commonest
# in the tsv column (pg_stats.most_common_elems) where it has at least PLANNER_TERMS of
# them; with fewer it guesses 2 % of rows for any prefix. Looked up once STATS_SECONDS.
PLANNER_TERMS = 100
STATS_SECONDS = 300.0
SNIPPET = 160  # characters of text around the first match
PROCESSORS = (*SEARCHED, "name")


@dataclass
class Clause:
    """Terms in a row (one term: a word; more: a phrase), the last maybe a prefix."""

    terms: list[str]
    prefix: bool = False


@dataclass
class Query:
    clauses: list[Clause]
    words: list[str] = field(default_factory=list)  # the folded words, for the snippets
    prefixes: list[str] = field(default_factory=list)


_PART = re.compile(r'"([^"]*)"?|(\S+)')


def parse(text: str) -> Query:
    """The clauses of a user's query; Invalid (400) when it has none or is too long."""
    if len(text) > MAX_QUERY:
        raise Invalid(f"q must be at most {MAX_QUERY} characters")
    query = Query([])
    for phrase, bare in _PART.findall(text):
        if phrase:
            found = [t for w in words(phrase) for t in word_terms(w)]
            query.words += words(phrase)
            if found:
                query.clauses.append(Clause(found))
            continue
        prefix = bare.endswith("*")
        found_words = words(bare)
        for i, word in enumerate(found_words):
            last = i == len(found_words) - 1
            if prefix and last:
                query.prefixes.append(word)
                query.clauses.append(Clause([_prefix_term(word)], prefix=True))
            elif is_cjk(word) and len(word) == 1:  # indexed inside its pairs (terms.terms)
                query.words.append(word)
                query.clauses.append(Clause([word], prefix=True))
            else:
                query.words.append(word)
                query.clauses.append(Clause(word_terms(word)))
    if not query.clauses:
        raise Invalid("q has no words to search for")
    if len(query.clauses) > MAX_CLAUSES:
        raise Invalid(f"q may hold at most {MAX_CLAUSES} words or phrases")
    return query


def _prefix_term(word: str) -> str:
    """The indexed form a prefix is looked up by: stemmed where the stem is a prefix of
    the word ("budgets*" finds "budget"), else as typed; a CJK prefix by its first pair."""
    if is_cjk(word):
        return word[:2]
    stemmed = stem(word)
    return stemmed if word.startswith(stemmed) else word


def fts5(query: Query) -> str:
    """The FTS5 expression: each clause a quoted string (terms hold no quotes)."""
    parts = []
    for clause in query.clauses:
        quoted = '"' + " ".join(clause.terms) + '"'
        parts.append(quoted + (" *" if clause.prefix else ""))
    return " AND ".join(parts)


def tsquery(query: Query, phrases: bool = True) -> str:
    """The PostgreSQL tsquery text: each term quoted, phrases by <-> (by & without
    ``phrases``: all its words, anywhere), prefixes by :*."""
    parts = []
    for clause in query.clauses:
        quoted = [f"'{term}'" for term in clause.terms]
        if clause.prefix:
            quoted[-1] += ":*"
        parts.append("(" + (" <-> " if phrases else " & ").join(quoted) + ")")
    return " & ".join(parts)


@dataclass
class Filters:
    folder: str | None = None  # a folder in the drop folder (its files and those below)
    processor: str | None = None
    file_uuid: str | None = None
    since: float | None = None  # files registered from
    until: float | None = None


def search(text: str, filters: Filters, limit: int, offset: int) -> dict[str, Any]:
    """The answer of GET /api/v1/search."""
    query = parse(text)
    hits: list[dict[str, Any]] = []
    total, exact = 0, True
    if filters.processor in (None, "name"):
        names = _name_hits(query, filters)
        total += len(names)
        hits += names
    if filters.processor != "name":
        moments, count, exact = _moment_hits(query, filters, limit + offset - len(hits))
        hits += moments
        total += count
    page = hits[offset : offset + limit]
    add_thumbnails(page)
    waiting = index.waiting()
    return {
        "query": text,
        "hits": [render(hit, query) for hit in page],
        "total": total,
        "total_exact": exact,
        "limit": limit,
        "offset": offset,
        "index": {"complete": waiting == 0, "waiting": waiting},
    }


def file_conditions(filters: Filters) -> list[Any]:
    conditions = []
    if filters.file_uuid:
        conditions.append(MediaFile.file_uuid == filters.file_uuid)
    if filters.folder:  # the files in it and in the folders below
        folder = filters.folder.strip("/")
        conditions.append(MediaFile.rel_path.startswith(folder + "/"))
    if filters.since is not None:
        conditions.append(MediaFile.registered_at >= filters.since)
    if filters.until is not None:
        conditions.append(MediaFile.registered_at < filters.until)
    return conditions


def _name_hits(query: Query, filters: Filters) -> list[dict[str, Any]]:
    """Files whose name holds every word (a prefix: as a part) of the query."""
    wanted = query.words + query.prefixes
    if not wanted:
        return []
    select = MediaFile.select(MediaFile.id, MediaFile.file_uuid, MediaFile.name, MediaFile.rel_path)
    for word in wanted:
        escaped = re.sub(r"([\\%_])", r"\\\1", word)
        select = select.where(
            pw.NodeList(
                (MediaFile.folded_name, pw.SQL("LIKE"), f"%{escaped}%", pw.SQL("ESCAPE '\\'"))
            )
        )
    for condition in file_conditions(filters):
        select = select.where(condition)
    found = select.order_by(MediaFile.id.desc()).limit(100)
    return [
        {
            "file_id": file_id,
            "file_uuid": uuid,
            "name": name,
            "rel_path": rel_path,
            "processor": "name",
            "start": None,
            "end": None,
            "text": name,
            "score": None,
            "sources": ["name"],
        }
        for file_id, uuid, name, rel_path in store.rows(found)
    ]


def _moment_hits(
    query: Query, filters: Filters, wanted: int
) -> tuple[list[dict[str, Any]], int, bool]:
    """The best ``wanted`` moments (ranked within the newest CANDIDATES matches), how many
    matched, and whether that count is exact."""
    database = SearchEntry._meta.database
    where, params = [], []
    if filters.processor:
        where.append("e.processor = ?")
        params.append(filters.processor)
    conditions = file_conditions(filters)
    if conditions:
        files = MediaFile.select(MediaFile.id)
        for condition in conditions:
            files = files.where(condition)
        sql, file_params = files.sql()
        where.append(f"e.file_id IN ({sql.replace('%s', '?')})")
        params += file_params
    extra = "".join(f" AND {w}" for w in where)
    columns = (
        'e.id, e.file_id, m.file_uuid, m.name, m.rel_path, e.processor, e.start, e."end", e.text'
    )
    # The candidates: the newest matches (the index read newest first, stopped at the
    # bound); then a transcript's twins made one, scored, counted and the best ``wanted``
    # kept, before the rows are read whole and joined to their files.
    moment = 'e.id, e.file_id, e.processor, e.start, e."end"'
    if store.is_postgres(database):
        # The tsquery is written as a constant (not a joined value), so that the planner
        # knows how common its words are: the newest matches of "the" are read off the
        # primary key backwards, a rare word's through the GIN index. The score is taken
        # after the bound: in the candidates' list it would be computed for every match.
        match = "to_tsquery('simple', ?)"
        expression = tsquery(query)
        if any(len(clause.terms) > 1 for clause in query.clauses):
            # GIN holds no positions: a phrase of common words ("and you") is rare, its
            # words are not, and the planner, taking it for its words, would read the
            # whole table for it. Its candidates are taken among the newest
            # PHRASE_SCAN moments holding all its words.
            found = (
                f"c0 AS (SELECT {moment}, e.tsv FROM search_entry e"
                f" WHERE e.tsv @@ {match}{extra} ORDER BY e.id DESC LIMIT ?),"
                f" c AS (SELECT * FROM c0 WHERE tsv @@ {match} ORDER BY id DESC LIMIT ?),"
            )
            args = [tsquery(query, phrases=False), *params, PHRASE_SCAN, expression, CANDIDATES]
            scanned = "(SELECT COUNT(*) FROM c0)"
        else:
            # A prefix is planned as a word is (a common one off the primary key, a rare
            # one through the GIN index) where the column's statistics tell the planner
            # how common it is. Without them it guesses 2 % of rows and would read the
            # table newest first, all of it for a rare prefix: "+ 0" keeps it off the
            # primary key, on the GIN index.
            prefix = any(clause.prefix for clause in query.clauses)
            order = "e.id + 0" if prefix and not _prefixes_planned(database) else "e.id"
            found = (
                f"c AS (SELECT {moment}, e.tsv FROM search_entry e"
                f" WHERE e.tsv @@ {match}{extra} ORDER BY {order} DESC LIMIT ?),"
            )
            args = [expression, *params, CANDIDATES]
            scanned = "0"
        score = f"ts_rank(d.tsv, {match})"
        args.append(expression)
        join = "JOIN"
    else:
        # CROSS JOIN: SQLite joins in the order written, the full-text index first.
        found = (
            f"c AS (SELECT {moment}, -bm25(search_fts) AS score"
            " FROM search_fts CROSS JOIN search_entry e ON e.id = search_fts.rowid"
            f" WHERE search_fts MATCH ?{extra} ORDER BY search_fts.rowid DESC LIMIT ?),"
        )
        args = [fts5(query), *params, CANDIDATES]
        score, scanned, join = "d.score", "0", "CROSS JOIN"
    # asr and asrx of one file hold the same segments (one transcription, asrx's with
    # word timings): a moment of both is one hit, asrx's, that names both.
    twins = (
        "PARTITION BY c.file_id, CASE WHEN c.processor IN ('asr', 'asrx') THEN 0 ELSE c.id END,"
        ' c.start, c."end"'
    )
    candidates = (
        f"WITH {found}"
        f" d AS (SELECT c.*, ROW_NUMBER() OVER ({twins} ORDER BY c.processor DESC, c.id DESC)"
        f" AS twin, COUNT(*) OVER ({twins}) AS twins FROM c),"
        f" r AS (SELECT d.id, {score} AS score, d.twins, COUNT(*) OVER () AS n,"
        f" {scanned} AS scanned FROM d WHERE d.twin = 1 ORDER BY score DESC, d.id DESC LIMIT ?)"
    )
    ranked = (
        f" SELECT {columns}, r.score, r.twins, r.n, r.scanned FROM r"
        f" {join} search_entry e ON e.id = r.id {join} media_file m ON m.id = e.file_id"
        " ORDER BY r.score DESC, e.id DESC"
    )
    # At least one row, for the count, when no moment is wanted on this page.
    rows = store.execute(candidates + ranked, *args, max(wanted, 1)).fetchall()
    counted, scanned_rows = (int(rows[0][-2]), int(rows[0][-1])) if rows else (0, 0)
    hits = [
        moment_hit(row[:9], row[9], list(TRANSCRIPTS) if row[10] > 1 else [row[5]])
        for row in rows[: max(wanted, 0)]
    ]
    return hits, counted, counted < CANDIDATES and scanned_rows < PHRASE_SCAN


_planned: dict[int, tuple[float, bool]] = {}  # id(database): (when looked up, planned)


def _prefixes_planned(database: pw.Database) -> bool:
    """Whether PostgreSQL's planner can tell how common a prefix is in ``database``: its
    statistics of search_entry.tsv (gathered by ANALYZE, and autovacuum) hold at least
    PLANNER_TERMS terms. Looked up at most once STATS_SECONDS a process."""
    now = time.monotonic()
    known = _planned.get(id(database))
    if known is not None and now - known[0] < STATS_SECONDS:
        return known[1]
    row = store.execute(
        "SELECT cardinality(most_common_elems::text::text[]) FROM pg_stats"
        " WHERE schemaname = current_schema() AND tablename = 'search_entry'"
        " AND attname = 'tsv'"
    ).fetchone()
    planned = bool(row and row[0] and row[0] >= PLANNER_TERMS)
    _planned[id(database)] = (now, planned)
    return planned


def moment_hit(row: Sequence[Any], score: float, sources: list[str]) -> dict[str, Any]:
    """A moment's hit, before rendering, from its row: entry id, file id, file uuid, name,
    rel_path, processor, start, end, text (the order both searches select them in)."""
    entry_id, file_id, uuid, name, rel_path, processor, start, end, text = row
    return {
        "entry_id": entry_id,
        "file_id": file_id,
        "file_uuid": uuid,
        "name": name,
        "rel_path": rel_path,
        "processor": processor,
        "start": start,
        "end": end,
        "text": text,
        "score": round(float(score), 4),
        "sources": sources,
    }


# -- thumbnails: the keyframe of the scene a hit starts in --------------------------------------

_SCENES: collections.OrderedDict[int, list[tuple[float, int, bool]]] = collections.OrderedDict()
_scenes_lock = threading.Lock()


def add_thumbnails(hits: list[dict[str, Any]]) -> None:
    for hit in hits:
        hit["scene"] = None
        if hit["start"] is None:
            continue
        scenes = _scenes(hit["file_id"])
        at = bisect.bisect_right(scenes, (hit["start"], float("inf"), True)) - 1
        if at >= 0 and scenes[at][2]:
            hit["scene"] = scenes[at][1]


def _scenes(file_id: int) -> list[tuple[float, int, bool]]:
    """(start, index, has a thumbnail) of each scene of the file's stored complete cut
    result; [] for a file without one (an audio file, or cut not run)."""
    newest = (
        ResultPart.select(ResultPart.id)
        .where(
            ResultPart.file == file_id,
            ResultPart.name == "cut.json",
            ResultPart.status == outputs.COMPLETED,
        )
        .order_by(ResultPart.id.desc())
        .limit(1)
        .scalar()
    )
    if newest is None:
        return []
    with _scenes_lock:
        if (known := _SCENES.get(newest)) is not None:
            return known
    content = ResultPart.select(ResultPart.content).where(ResultPart.id == newest).scalar()
    try:
        scenes = json.loads(bytes(content))["result"]["scenes"]
        found = sorted(
            (float(s["start"]), i, bool(s.get("thumbnail"))) for i, s in enumerate(scenes)
        )
    except (ValueError, LookupError, TypeError, AttributeError):
        found = []
    with _scenes_lock:
        _SCENES[newest] = found
        while len(_SCENES) > 64:
            _SCENES.popitem(last=False)
    return found


# -- a hit as the API gives it --------------------------------------------------------------------


def render(hit: dict[str, Any], query: Query) -> dict[str, Any]:
    uuid = hit["file_uuid"]
    folder = hit["rel_path"].rsplit("/", 1)[0] if "/" in hit["rel_path"] else ""
    scene = hit.get("scene")
    return {
        "file": {"file_uuid": uuid, "name": hit["name"], "folder": folder},
        "processor": hit["processor"],
        "sources": hit["sources"],
        "start": hit["start"],
        "end": hit["end"],
        "text": hit["text"],
        "snippet": snippet(hit["text"], query),
        "score": hit["score"],
        "thumbnail_url": None if scene is None else f"/api/v1/files/{uuid}/thumbnails/{scene}",
    }


# A word of the text as written: letters and digits, with the combining accents of a
# decomposed (NFD) text inside it.
_SPAN = re.compile(r"[^\W_](?:[^\W_]|[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff])*")


def snippet(text: str, query: Query) -> list[dict[str, Any]]:
    """``text`` (cut to about SNIPPET characters around its first match) as parts, each
    {"text", "match"}: the words the query matched marked."""
    wanted = {t for w in query.words for t in word_terms(w)}
    marks: list[tuple[int, int]] = []
    for found in _SPAN.finditer(text):
        word_marks = _word_marks(found.group(), wanted, query)
        marks += [(found.start() + a, found.start() + b) for a, b in word_marks]
    if marks:
        first = marks[0][0]
        start = max(0, first - SNIPPET // 3)
    else:
        start = 0
    end = min(len(text), start + SNIPPET)
    parts: list[dict[str, Any]] = []
    at = start
    if start > 0:
        parts.append({"text": "…", "match": False})
    for a, b in marks:
        if b <= start or a >= end:
            continue
        a, b = max(a, start), min(b, end)
        if a > at:
            parts.append({"text": text[at:a], "match": False})
        parts.append({"text": text[a:b], "match": True})
        at = b
    if at < end:
        parts.append({"text": text[at:end], "match": False})
    if end < len(text):
        parts.append({"text": "…", "match": False})
    return parts


def _word_marks(word: str, wanted: set[str], query: Query) -> list[tuple[int, int]]:
    """Where in ``word`` (a run of letters and digits of the text) the query matched."""
    folded_words = words(word)
    if len(folded_words) == 1 and not is_cjk(folded_words[0]):
        folded = folded_words[0]
        if set(terms(folded)) & wanted or any(
            folded.startswith(p) or stem(folded).startswith(_prefix_term(p)) for p in query.prefixes
        ):
            return [(0, len(word))]
        return []
    # A CJK run (perhaps with other letters): each query word found in it, as typed.
    found = []
    for wanted_word in [*query.words, *query.prefixes]:
        if is_cjk(wanted_word):
            at = fold(word).find(wanted_word)
            while at >= 0:
                found.append((at, at + len(wanted_word)))
                at = fold(word).find(wanted_word, at + 1)
    return sorted(found)


CSV_COLUMNS = ("file", "folder", "file_uuid", "source", "start", "end", "timecode", "text")


def as_csv(found: dict[str, Any]) -> str:
    """The hits of a search answer as CSV (a header row, then one row a hit)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for hit in found["hits"]:
        start = hit["start"]
        writer.writerow(
            (
                hit["file"]["name"],
                hit["file"]["folder"],
                hit["file"]["file_uuid"],
                hit["processor"],
                start,
                hit["end"],
                "" if start is None else timecode(start),
                hit["text"],
            )
        )
    return out.getvalue()


def timecode(seconds: float) -> str:
    """H:MM:SS.mmm"""
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours}:{minutes:02d}:{rest // 1000:02d}.{rest % 1000:03d}"
