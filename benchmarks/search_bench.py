"""Search figures: query latency at scale on SQLite and PostgreSQL, beside a plain LIKE scan;
what the index adds to the database per hour of footage; what indexing adds to a job.

    .venv/bin/python benchmarks/search_bench.py [--segments 2000000] [--queries 1000]
        [--databases sqlite,postgres] [--pg-url postgresql://postgres@127.0.0.1:5432/test]

The index is filled with generated moments: ``--segments`` transcript segments (8 to 16
words each, drawn with a natural, Zipf, word frequency from a 40,000-word vocabulary, so
"the" comes as often as in speech), plus on-screen text lines (a tenth as many) and
object labels (a twentieth), 200 segments a file (about an hour of footage each). The
rows go in through the service's own index (search.index.put): terms folded and stemmed
as in a job. Then ``--queries`` queries through search.query.search (the route's own
call: ranking, snippets, name hits, the index's state): 70 % single words drawn by their
frequency, 15 % two-word phrases from a segment, 15 % prefixes; p50 and p95 of each kind
and of all. Beside it, the same words as ``text LIKE '%word%'`` (a scan of every row; 50
queries: each takes seconds).

Then one hour of footage's documents (asr: 900 segments; ocr: 3,600 samples; yolo: 7,200
samples) is indexed the way a completed run is (stored_results.keep's index step), timed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from databases import scratch_postgres  # noqa: E402

from momentry_edge import store  # noqa: E402
from momentry_edge.search import index, query  # noqa: E402
from momentry_edge.store import MediaFile  # noqa: E402

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


def fill(segments: int, rng: random.Random, words: list[str], weights: list[float]) -> list[str]:
    """Index ``segments`` transcript segments (and their share of OCR lines and labels);
    returns a sample of the segments' texts (for phrases)."""
    files = max(1, segments // SEGMENTS_PER_FILE)
    database = MediaFile._meta.database
    samples = []
    started = time.perf_counter()
    for f in range(files):
        record = MediaFile.create(
            file_uuid=f"{f:032x}",
            path=f"/drop/day{f % 30}/clip{f}.mp4",
            watch_root="/drop",
            rel_path=f"day{f % 30}/clip{f}.mp4",
            name=f"clip{f}.mp4",
            folded_name=f"clip{f}.mp4",
        )
        texts = [
            " ".join(rng.choices(words, weights, k=rng.randint(8, 16)))
            for _ in range(SEGMENTS_PER_FILE)
        ]
        samples += texts[:2]
        asr = {
            "status": "completed",
            "result": {
                "segments": [
                    {"start": i * 18.0, "end": i * 18.0 + 4, "text": t} for i, t in enumerate(texts)
                ]
            },
        }
        lines = [" ".join(rng.choices(words, weights, k=3)) for _ in range(SEGMENTS_PER_FILE // 10)]
        ocr = {
            "status": "completed",
            "result": {
                "sample_fps": 1,
                "frames": [
                    {"timestamp": i * 180.0 + k, "lines": [{"text": line}]}
                    for i, line in enumerate(lines)
                    for k in range(3)
                ],
            },
        }
        yolo = {
            "status": "completed",
            "result": {
                "sample_fps": 1,
                "frames": [
                    {"timestamp": i * 360.0, "detections": [{"label": rng.choice(LABELS)}]}
                    for i in range(SEGMENTS_PER_FILE // 20)
                ],
            },
        }
        with store.write_transaction(database):
            for name, document in (("asr", asr), ("ocr", ocr), ("yolo", yolo)):
                index.put(record.id, name, json.dumps(document).encode())
        if f and f % 100 == 0:
            rate = f * SEGMENTS_PER_FILE / (time.perf_counter() - started)
            print(f"  {f * SEGMENTS_PER_FILE:,} segments indexed ({rate:,.0f}/s)", flush=True)
    return samples


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
        texts = fill(args.segments, rng, words, weights)
        if store.is_postgres(database):
            database.execute_sql("VACUUM ANALYZE search_entry")
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
        times: dict[str, list[float]] = {"word": [], "phrase": [], "prefix": []}
        estimated = 0
        for kind_of, q in drawn:
            at = time.perf_counter()
            found = query.search(q, query.Filters(), 20, 0)
            times[kind_of].append((time.perf_counter() - at) * 1000)
            estimated += not found["total_exact"]
        everything = [t for ts in times.values() for t in ts]
        print(f"{'queries':<22}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
        for name, ts in [*times.items(), ("all", everything)]:
            if ts:
                print(
                    f"{name:<22}{len(ts):>6}{statistics.median(ts):>10.1f}"
                    f"{percentile(ts, 95):>10.1f}{max(ts):>10.1f}"
                )
        print(
            f"({estimated} of {len(drawn)} answers had more than {query.CANDIDATES:,} matches:"
            " ranked among the newest, total a lower bound)"
        )
        like = []
        for _, word in [d for d in drawn if d[0] == "word"][: args.like]:
            at = time.perf_counter()
            store.execute(
                "SELECT id FROM search_entry WHERE LOWER(text) LIKE ? ORDER BY id DESC LIMIT 20",
                f"%{word}%",
            ).fetchall()
            store.execute(
                "SELECT COUNT(*) FROM search_entry WHERE LOWER(text) LIKE ?", f"%{word}%"
            ).fetchone()
            like.append((time.perf_counter() - at) * 1000)
        if like:
            print(
                f"{'LIKE %word% (+count)':<22}{len(like):>6}{statistics.median(like):>10.1f}"
                f"{percentile(like, 95):>10.1f}{max(like):>10.1f}"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=2_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--like", type=int, default=50, help="LIKE scans (each reads every row)")
    parser.add_argument("--databases", default="sqlite,postgres")
    args = parser.parse_args()
    for kind in args.databases.split(","):
        if kind == "sqlite":
            run(kind, "", args)
        else:
            with scratch_postgres() as url:
                run(kind, url, args)
                store.close_connection()


if __name__ == "__main__":
    main()
