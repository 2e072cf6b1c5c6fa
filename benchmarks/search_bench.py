"""Search figures: query latency at scale on SQLite and PostgreSQL, beside a plain LIKE scan;
what the index adds to the database per hour of footage; what indexing adds to a job.

    .venv/bin/python benchmarks/search_bench.py [--segments 2000000] [--queries 1000]
        [--like 10] [--databases sqlite,postgres] [--job-seconds 60]

The index is filled with generated moments: ``--segments`` transcript segments (8 to 16
words each, drawn with a natural, Zipf, word frequency from a 40,000-word vocabulary, so
"the" comes as often as in speech), plus on-screen text lines (a tenth as many) and
object labels (a twentieth), as the spans moments.py makes, 200 segments a file (about
an hour of footage each). The terms are made as a job makes them (words.indexed); the
rows go in in bulk (COPY on PostgreSQL, its GIN index built after and the tables
analysed; executemany in large transactions on SQLite, the FTS5 triggers kept): about
10,000 segments a second on a quiet machine. Then ``--queries`` queries through
search.query.search (the route's own call: ranking, snippets, name hits, the index's
state): 70 % single words drawn by their frequency, 15 % two-word phrases from a
segment, 15 % prefixes; p50 and p95 of each kind and of all, wall and CPU (this process
and its PostgreSQL server process: a figure the machine's load does not inflate).
Beside it, ``--like`` of the same words as ``text LIKE '%word%'`` with a count (a scan
of every row: sampled, each takes seconds at 2 million), and each p95's ratio to it.

Then one hour of footage's documents (asr: 900 segments; ocr: 3,600 samples; yolo: 7,200
samples) is indexed the way a completed run is (stored_results.keep's index step), timed.
With ``--job-seconds``, first a real job (cut, asr, asrx, ocr, yolo) in an in-process
service on a video that long: its end-to-end time beside what its runs spent storing
and indexing their results.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from databases import scratch_postgres  # noqa: E402

from momentry_edge import store  # noqa: E402
from momentry_edge.search import index, query  # noqa: E402
from momentry_edge.store import MediaFile, SearchIndexed, connection  # noqa: E402
from momentry_edge.words import indexed  # noqa: E402

SEGMENTS_PER_FILE = 200
LABELS = ["person", "car", "chair", "cup", "laptop", "dog", "bottle", "tv", "book", "phone"]
COMMON = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "it",
    "you",
    "that",
    "he",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "i",
    "his",
    "they",
    "be",
    "at",
    "one",
]


def vocabulary(size: int, rng: random.Random) -> list[str]:
    """``size`` distinct words: the commonest English ones first, then made-up ones."""
    words = list(COMMON)
    seen = set(words)
    while len(words) < size:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 10)))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def zipf_weights(size: int, s: float = 1.07) -> list[float]:
    return [1 / (rank**s) for rank in range(1, size + 1)]


def fill(
    segments: int, rng: random.Random, words: list[str], cum_weights: list[float]
) -> list[str]:
    """Put ``segments`` transcript segments (and their share of OCR lines and labels, as
    the spans moments.py makes) in the index in bulk: the terms folded and stemmed as in
    a job (words.indexed), the rows written by COPY (PostgreSQL, its GIN index made after)
    or executemany in large transactions (SQLite, the FTS5 triggers kept). Returns a
    sample of the segments' texts (for phrases)."""
    files = max(1, segments // SEGMENTS_PER_FILE)
    database = MediaFile._meta.database
    postgres = store.is_postgres(database)
    now = time.time()
    file_rows = [
        {
            "file_uuid": f"{f:032x}",
            "path": f"/drop/day{f % 30}/clip{f}.mp4",
            "watch_root": "/drop",
            "rel_path": f"day{f % 30}/clip{f}.mp4",
            "name": f"clip{f}.mp4",
            "folded_name": f"clip{f}.mp4",
            "registered_at": now - (files - f) * 60,
        }
        for f in range(files)
    ]
    with database.atomic():
        for at in range(0, files, 500):
            MediaFile.insert_many(file_rows[at : at + 500]).execute()
    ids = [row[0] for row in store.execute("SELECT id FROM media_file ORDER BY id").fetchall()]
    if postgres:  # one GIN index built at the end costs a fraction of one kept per row
        database.execute_sql("DROP INDEX IF EXISTS search_entry_tsv")
    samples: list[str] = []
    started = time.perf_counter()
    batch: list[tuple] = []

    # A generated text's terms are its words' (plain lowercase words): made once a word,
    # as words.indexed makes them, not once a segment.
    term_of = {word: indexed(word) for word in words}

    def text(k: int) -> tuple[str, str]:
        chosen = rng.choices(words, cum_weights=cum_weights, k=k)
        return " ".join(chosen), " ".join(term_of[word] for word in chosen)

    for done, file_id in enumerate(ids, start=1):
        texts = [text(rng.randint(8, 16)) for _ in range(SEGMENTS_PER_FILE)]
        samples += [t for t, _ in texts[:2]]
        moments = [("asr", i * 18.0, i * 18.0 + 4, *t) for i, t in enumerate(texts)]
        moments += [
            ("ocr", i * 180.0, i * 180.0 + 8, *text(3)) for i in range(SEGMENTS_PER_FILE // 10)
        ]
        labels = [rng.choice(LABELS) for _ in range(SEGMENTS_PER_FILE // 20)]
        moments += [
            ("yolo", i * 360.0, i * 360.0 + 30, label, indexed(label))
            for i, label in enumerate(labels)
        ]
        batch += [(file_id, *moment) for moment in moments]
        if len(batch) >= 50_000 or done == len(ids):
            _write(database, batch)
            batch = []
            rate = done * SEGMENTS_PER_FILE / (time.perf_counter() - started)
            print(f"  {done * SEGMENTS_PER_FILE:,} segments indexed ({rate:,.0f}/s)", flush=True)
    with database.atomic():
        indexed_rows = [{"file": i, "processor": p} for i in ids for p in ("asr", "ocr", "yolo")]
        for at in range(0, len(indexed_rows), 500):
            SearchIndexed.insert_many(indexed_rows[at : at + 500]).execute()
    if postgres:
        at = time.perf_counter()
        connection.answer_timeout = None  # the index takes minutes at 2 million rows
        database.execute_sql("SET maintenance_work_mem = '256MB'")
        database.execute_sql("CREATE INDEX search_entry_tsv ON search_entry USING GIN (tsv)")
        print(f"  GIN index built in {time.perf_counter() - at:.0f} s", flush=True)
        database.execute_sql("VACUUM ANALYZE search_entry, media_file")
    return samples


COLUMNS = ("file_id", "processor", "start", "end", "text", "terms")


def _write(database, batch: list[tuple]) -> None:
    if store.is_postgres(database):
        with database.atomic():
            cursor = database.cursor()
            columns = ", ".join(f'"{c}"' for c in COLUMNS)
            with cursor.copy(f"COPY search_entry ({columns}) FROM STDIN") as copy:
                for row in batch:
                    copy.write_row(row)
        return
    with database.atomic():
        columns = ", ".join(f'"{c}"' for c in COLUMNS)
        database.cursor().executemany(
            f"INSERT INTO search_entry ({columns}) VALUES (?, ?, ?, ?, ?, ?)", batch
        )


def queries(
    count: int, rng: random.Random, words: list[str], weights: list[float], texts: list[str]
):
    drawn = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.70:
            drawn.append(("word", rng.choices(words, weights)[0]))
        elif kind < 0.85:
            parts = rng.choice(texts).split()
            at = rng.randrange(len(parts) - 1)
            drawn.append(("phrase", f'"{parts[at]} {parts[at + 1]}"'))
        else:
            word = rng.choices(words[30:], weights[30:])[0]
            drawn.append(("prefix", word[: max(3, len(word) - 2)] + "*"))
    return drawn


def cpu_clock(database) -> Callable[[], float]:
    """Seconds of CPU used so far by this process and, on PostgreSQL (a local server), by
    the server process of its connection: what a query costs, whatever the load."""
    if not store.is_postgres(database):
        return time.process_time
    backend = Path(f"/proc/{store.execute('SELECT pg_backend_pid()').fetchone()[0]}/stat")
    ticks = os.sysconf("SC_CLK_TCK")

    def used() -> float:
        try:
            fields = backend.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a remote server
            return time.process_time()
        return time.process_time() + (int(fields[11]) + int(fields[12])) / ticks

    return used


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def database_bytes(database, data_dir: Path) -> int:
    if store.is_postgres(database):
        return int(
            database.execute_sql(
                "SELECT pg_total_relation_size('search_entry')"
                " + pg_total_relation_size('search_indexed')"
            ).fetchone()[0]
        )
    database.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in data_dir.glob("momentry.db*"))


def one_hour_documents(rng: random.Random, words: list[str], weights: list[float]) -> dict:
    segments = [
        {"start": i * 4.0, "end": i * 4.0 + 4, "text": " ".join(rng.choices(words, weights, k=12))}
        for i in range(900)
    ]
    lines = [" ".join(rng.choices(words, weights, k=3)) for _ in range(120)]
    ocr_frames = [{"timestamp": float(t), "lines": [{"text": lines[t // 30]}]} for t in range(3600)]
    yolo_frames = [
        {"timestamp": t / 2, "detections": [{"label": LABELS[(t // 40) % len(LABELS)]}]}
        for t in range(7200)
    ]
    return {
        "asr": {"status": "completed", "result": {"segments": segments}},
        "ocr": {"status": "completed", "result": {"sample_fps": 1, "frames": ocr_frames}},
        "yolo": {"status": "completed", "result": {"sample_fps": 2, "frames": yolo_frames}},
    }


def run(kind: str, url: str, args: argparse.Namespace) -> None:
    rng = random.Random(7)
    words = vocabulary(40_000, rng)
    weights = zipf_weights(len(words))
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        database = store.connect(url, data_dir)
        empty = database_bytes(database, data_dir)
        print(f"\n{kind}: indexing {args.segments:,} segments ...", flush=True)
        started = time.perf_counter()
        texts = fill(args.segments, rng, words, list(itertools.accumulate(weights)))
        filled = time.perf_counter() - started
        grown = database_bytes(database, data_dir) - empty
        hours = max(1, args.segments // SEGMENTS_PER_FILE)
        rows = store.execute("SELECT COUNT(*) FROM search_entry").fetchone()[0]
        print(
            f"- {rows:,} moments in {filled:.0f} s; index {grown / 2**20:,.0f} MiB,"
            f" {grown / hours / 2**10:,.0f} KiB per hour of footage ({hours:,} hours)"
        )

        drawn = queries(args.queries, rng, words, weights, texts)
        for q in drawn[:20]:  # warm the caches, as a running service has them
            query.search(q[1], query.Filters(), 20, 0)
        cpu = cpu_clock(database)
        walls: dict[str, list[float]] = {"word": [], "phrase": [], "prefix": []}
        cpus: dict[str, list[float]] = {"word": [], "phrase": [], "prefix": []}
        estimated = 0
        for kind_of, q in drawn:
            at, used = time.perf_counter(), cpu()
            found = query.search(q, query.Filters(), 20, 0)
            walls[kind_of].append((time.perf_counter() - at) * 1000)
            cpus[kind_of].append((cpu() - used) * 1000)
            estimated += not found["total_exact"]
        walls["all"] = [t for ts in walls.values() for t in ts]
        cpus["all"] = [t for ts in cpus.values() for t in ts]
        like_walls, like_cpus = [], []
        for _, word in [d for d in drawn if d[0] == "word"][: args.like]:
            at, used = time.perf_counter(), cpu()
            store.execute(
                "SELECT id FROM search_entry WHERE LOWER(text) LIKE ? ORDER BY id DESC LIMIT 20",
                f"%{word}%",
            ).fetchall()
            store.execute(
                "SELECT COUNT(*) FROM search_entry WHERE LOWER(text) LIKE ?", f"%{word}%"
            ).fetchone()
            like_walls.append((time.perf_counter() - at) * 1000)
            like_cpus.append((cpu() - used) * 1000)
        walls["LIKE %word% (+count)"], cpus["LIKE %word% (+count)"] = like_walls, like_cpus
        print(f"  load average {os.getloadavg()[0]:.1f} after the queries ({os.cpu_count()} cores)")
        print(
            f"{'queries':<22}{'n':>6}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}"
            f"{'CPU p50':>9}{'CPU p95':>9}{'p95 / LIKE':>12}"
        )
        like_p95 = percentile(like_walls, 95) if like_walls else float("nan")
        for name, ts in walls.items():
            if ts:
                print(
                    f"{name:<22}{len(ts):>6}{statistics.median(ts):>9.1f}"
                    f"{percentile(ts, 95):>9.1f}{max(ts):>9.1f}"
                    f"{statistics.median(cpus[name]):>9.1f}{percentile(cpus[name], 95):>9.1f}"
                    f"{percentile(ts, 95) / like_p95:>12.3f}"
                )
        print(
            f"({estimated} of {len(drawn)} answers had more than {query.CANDIDATES:,} matches,"
            " or were phrases of common words: ranked among the newest, total a lower bound;"
            f" the LIKE scan sampled: the first {len(like_walls)} words, each also counted;"
            " CPU: this process's and, on PostgreSQL, its server process's)"
        )

        documents = one_hour_documents(rng, words, weights)
        written = {name: len(json.dumps(doc, indent=2).encode()) for name, doc in documents.items()}
        print(
            "- one hour's documents as written and stored (result_part): "
            + ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in written.items())
        )
        record = MediaFile.create(
            file_uuid="f" * 32,
            path="/drop/hour.mp4",
            watch_root="/drop",
            rel_path="hour.mp4",
            name="hour.mp4",
            folded_name="hour.mp4",
        )
        spent = []
        for _ in range(3):
            at = time.perf_counter()
            with store.write_transaction(database):
                count = sum(
                    index.put(record.id, name, json.dumps(doc).encode())
                    for name, doc in documents.items()
                )
            spent.append(time.perf_counter() - at)
        print(
            f"- indexing one hour of footage's results ({count:,} moments from asr, ocr,"
            f" yolo documents): {min(spent) * 1000:.0f} ms (best of 3)"
        )
        database.close()


SPOKEN = (
    "Welcome to the weekly budget meeting. The budgets for next year were cut again. "
    "We will hire fewer people and travel less. Questions go to the finance team."
)


def job_share(seconds: float) -> None:
    """A real job (cut, asr, asrx, ocr, yolo: the processors searched, and the scenes'
    pictures) on a ``seconds`` long video with speech and on-screen text, in an
    in-process service on SQLite: its end-to-end time beside the time its runs spent
    storing their results in the database and indexing their moments (timed around
    jobs.runs' own steps, in the same transactions as the service makes them)."""
    import subprocess

    import numpy as np
    from common import running_service
    from frame_media import pull_models, text_frame
    from media_factory import make_video

    from momentry_edge import config as config_module
    from momentry_edge.jobs import runs
    from momentry_edge.store import Job

    spent = {"store and index": 0.0, "index": 0.0}
    keep, put = runs._keep, runs.search_index.put

    def timed_keep(*args, **kwargs):
        at = time.perf_counter()
        try:
            return keep(*args, **kwargs)
        finally:
            spent["store and index"] += time.perf_counter() - at

    def timed_put(*args, **kwargs):
        at = time.perf_counter()
        try:
            return put(*args, **kwargs)
        finally:
            spent["index"] += time.perf_counter() - at

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = pull_models(root / "models", "whisper-tiny.en", "yolov8n")
        wav = root / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), SPOKEN], check=True)
        size = (640, 360)
        scenes = [text_frame(f"QUARTERLY FIGURES {i}", size=size, font_size=40) for i in range(4)]
        scenes.append(np.full((size[1], size[0], 3), (40, 90, 160), np.uint8))
        fps, per_scene = 10, 6
        video = make_video(
            root / "meeting.mp4",
            segments=max(1, round(seconds / per_scene)),
            segment_seconds=per_scene,
            fps=fps,
            size=size,
            speech_wav=wav,
            picture=lambda i: scenes[(i // (fps * per_scene)) % len(scenes)],
        )
        whisper = {"model": "whisper-tiny.en", "models_dir": str(models)}
        settings = {
            "service": {
                "data_dir": str(root / "data"),
                "watch": [str(root / "drop")],
                "port": 0,
                "log_level": "warning",
            },
            "ingest": {"settle_seconds": 0.5, "processors": ["cut", "asr", "asrx", "ocr", "yolo"]},
            "processors.asr": whisper,
            "processors.asrx": whisper,
            "processors.yolo": {"models_dir": str(models)},
        }
        lines = []
        for section, values in settings.items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        (root / "drop").mkdir()
        config = root / "momentry.toml"
        config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        runs._keep, runs.search_index.put = timed_keep, timed_put
        try:
            with running_service(config_module.load(config, env={})):
                started = time.perf_counter()
                video.replace(root / "drop" / video.name)
                while True:
                    job = Job.select().order_by(Job.id.desc()).first()
                    if job is not None and job.status in ("completed", "failed", "dead"):
                        break
                    time.sleep(0.2)
                wall = time.perf_counter() - started
                moments = store.execute("SELECT COUNT(*) FROM search_entry").fetchone()[0]
                stored = store.execute(
                    "SELECT processor, SUM(LENGTH(content)) FROM result_part GROUP BY processor"
                    " ORDER BY processor"
                ).fetchall()
                entries = store.execute(
                    "SELECT SUM(LENGTH(text) + LENGTH(terms)) FROM search_entry"
                ).fetchone()[0]
        finally:
            runs._keep, runs.search_index.put = keep, put
    print(
        f"- a real job ({job.status}; cut, asr, asrx, ocr, yolo) on {seconds:.0f} s of video:"
        f" {wall:.1f} s end to end (from the drop, settling included); storing its results"
        f" {spent['store and index'] * 1000:.0f} ms of which indexing {moments} moments"
        f" {spent['index'] * 1000:.0f} ms: {spent['store and index'] / wall:.2%} and"
        f" {spent['index'] / wall:.2%} of the job"
    )
    hour = 3600 / seconds
    print(
        "  its results kept in the database (result_part), per hour of such footage: "
        + ", ".join(f"{name} {size * hour / 2**20:.2f} MiB" for name, size in stored)
        + f"; its moments' text and terms {(entries or 0) * hour / 2**10:.0f} KiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=2_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--like", type=int, default=50, help="LIKE scans (each reads every row)")
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument(
        "--job-seconds", type=float, default=0, help="also time a real job on a video this long"
    )
    args = parser.parse_args()
    if args.job_seconds:
        job_share(args.job_seconds)
    for kind in args.databases.split(","):
        if kind == "sqlite":
            run(kind, "", args)
        else:
            with scratch_postgres() as url:
                run(kind, url, args)
                store.close_connection()


if __name__ == "__main__":
    main()
