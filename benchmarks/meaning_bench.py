"""Search by meaning: recall on a labelled set beside word search, what embedding costs
per hour of transcript, and how long a query's scan of the stored vectors takes beside
the same product on a matrix held in memory (plain numpy).

    .venv/bin/python benchmarks/meaning_bench.py [--vectors 200000]
        [--databases sqlite,postgres] [--cost-segments 900]

Recall: benchmarks/data/meaning_set.json, 60 segments of a film production's talk and 40
queries, each with the segments a person wants found (most share no word with them).
Both searches run through the service's own calls (search.meaning.search and
search.query.search) on a scratch SQLite database; recall@k is the share of the wanted
segments in the first k hits, found@k the share of queries with one of them there.
"any word" is word search asked for each word of the query alone, the moments holding
more of them first (word search itself wants every word in one moment).

Cost: one hour of transcript (900 segments, the labelled set's sentences over again;
``--cost-segments`` fewer)
embedded the way the service's background embedder does it (meaning.Embedder.step),
CPU seconds of this process.

Scan: ``--vectors`` random unit vectors stored as the service stores them (float16 blobs,
one row a moment), 20 queries through meaning's chunked scan, beside numpy's product over
the same vectors held in memory as one float16 matrix; wall and this process's CPU (on a
busy machine the CPU is the figure to compare; PostgreSQL's own CPU is not in it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from databases import scratch_postgres  # noqa: E402
from frame_media import pull_models  # noqa: E402

from momentry_edge import store, weights  # noqa: E402
from momentry_edge.search import encoder, index, meaning, query  # noqa: E402

SET = ROOT / "benchmarks" / "data" / "meaning_set.json"
KS = (1, 3, 5, 10)
SEGMENTS_PER_HOUR = 900


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def new_file(name: str) -> store.MediaFile:
    return store.MediaFile.create(
        file_uuid=os.urandom(16).hex(),
        path=f"/drop/{name}",
        watch_root="/drop",
        rel_path=name,
        name=name,
        folded_name=name,
    )


def put_segments(texts: list[str], name: str) -> None:
    record = new_file(name)
    document = {
        "status": "completed",
        "result": {
            "segments": [
                {"start": i * 5.0, "end": i * 5.0 + 5, "text": t} for i, t in enumerate(texts)
            ]
        },
    }
    with store.SearchEntry._meta.database.atomic():
        index.put(record.id, "asr", json.dumps(document).encode())


def any_word(q: str) -> list[dict]:
    """Word search's moments for any of the query's words, those with more of them
    first: the kindest reading of a query by its words."""
    found: dict[str, list[float]] = {}
    for word in set(q.split()):
        try:
            hits = query.search(word, query.Filters(processor="asr"), max(KS), 0)["hits"]
        except Exception:  # a word with no letters: nothing to look up
            continue
        for hit in hits:
            found.setdefault(hit["text"], []).append(hit["score"] or 0.0)
    ranked = sorted(found, key=lambda t: (-len(found[t]), -max(found[t])))
    return [{"text": text} for text in ranked]


def recall(data_dir: Path) -> None:
    labelled = json.loads(SET.read_text(encoding="utf-8"))
    database = store.connect("", data_dir)
    put_segments(labelled["segments"], "talk.mp4")
    embedder = meaning.Embedder()
    while embedder.step():
        pass
    print(
        f"## Recall: {len(labelled['queries'])} queries over {len(labelled['segments'])} segments"
    )
    print()
    print(
        "| search | " + " | ".join(f"recall@{k} | found@{k}" for k in KS) + " | p50 ms | p95 ms |"
    )
    print("|---|" + "---|---|" * len(KS) + "---|---|")
    for mode in ("words", "any word", "meaning"):
        recalls = {k: [] for k in KS}  # type: dict[int, list[float]]
        founds = {k: [] for k in KS}  # type: dict[int, list[float]]
        took = []
        for item in labelled["queries"]:
            wanted = {labelled["segments"][n - 1] for n in item["expected"]}
            started = time.perf_counter()
            if mode == "meaning":
                hits = meaning.search(item["q"], query.Filters(processor="asr"), max(KS), 0)
                hits = hits["hits"]
            elif mode == "words":
                hits = query.search(item["q"], query.Filters(processor="asr"), max(KS), 0)
                hits = hits["hits"]
            else:
                hits = any_word(item["q"])
            took.append(time.perf_counter() - started)
            texts = [h["text"] for h in hits]
            for k in KS:
                got = wanted & set(texts[:k])
                recalls[k].append(len(got) / len(wanted))
                founds[k].append(1.0 if got else 0.0)
        cells = " | ".join(
            f"{statistics.mean(recalls[k]):.2f} | {statistics.mean(founds[k]):.2f}" for k in KS
        )
        print(
            f"| {mode} | {cells} | {percentile(took, 50) * 1000:.1f}"
            f" | {percentile(took, 95) * 1000:.1f} |"
        )
    print()
    database.close()


def cost(data_dir: Path, segments: int) -> None:
    labelled = json.loads(SET.read_text(encoding="utf-8"))["segments"]
    database = store.connect("", data_dir)
    hour = [labelled[i % len(labelled)] for i in range(segments)]
    put_segments(hour, "hour.mp4")
    encoder.load()  # loading is once a process; measured apart
    embedder = meaning.Embedder()
    cpu, wall = time.process_time(), time.perf_counter()
    while embedder.step():
        pass
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    before = time.process_time()
    encoder._loaded.clear()
    encoder.load()
    load_cpu = time.process_time() - before
    each = cpu / segments
    print(f"## Embedding cost: {segments} segments (an hour of transcript is {SEGMENTS_PER_HOUR})")
    print()
    print("| CPU s | wall s | ms CPU a segment | CPU s an hour | model load CPU s | stored |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {cpu:.1f} | {wall:.1f} | {each * 1000:.1f} | {each * SEGMENTS_PER_HOUR:.1f}"
        f" | {load_cpu:.2f} | {encoder.DIMENSIONS * 2} bytes a segment (float16) |"
    )
    print()
    database.close()


def scan(kind: str, url: str, data_dir: Path, count: int) -> None:
    database = store.connect(url, data_dir)
    rng = np.random.default_rng(7)
    record = new_file("many.mp4")
    made, after = 0, 0
    while made < count:  # entries and their vectors, as the embedder leaves them
        n = min(5000, count - made)
        with database.atomic():
            store.SearchEntry.insert_many(
                [
                    {"file": record.id, "processor": "asr", "start": i, "end": i + 1,
                     "text": "x", "terms": "x"}
                    for i in range(made, made + n)
                ]
            ).execute()  # fmt: skip
            ids = [
                i
                for (i,) in store.rows(
                    store.SearchEntry.select(store.SearchEntry.id)
                    .where(store.SearchEntry.id > after)
                    .order_by(store.SearchEntry.id)
                )
            ]
            vectors = rng.standard_normal((n, encoder.DIMENSIONS)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            store.SearchVector.insert_many(
                [
                    {"entry": i, "vector": b}
                    for i, b in zip(ids, encoder.as_blob(vectors), strict=True)
                ]
            ).execute()
        made, after = made + n, ids[-1]
    matrix = encoder.from_blobs(
        [b for (b,) in store.rows(store.SearchVector.select(store.SearchVector.vector))]
    )
    queries = rng.standard_normal((20, encoder.DIMENSIONS)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ours, ours_cpu, plain, plain_cpu = [], [], [], []
    for q in queries:
        started, cpu = time.perf_counter(), time.process_time()
        meaning._nearest(q, query.Filters(), 20)
        ours.append(time.perf_counter() - started)
        ours_cpu.append(time.process_time() - cpu)
        started, cpu = time.perf_counter(), time.process_time()
        scores = matrix.astype(np.float32) @ q
        np.argpartition(-scores, 20)[:20]
        plain.append(time.perf_counter() - started)
        plain_cpu.append(time.process_time() - cpu)
    ms = [percentile(v, p) * 1000 for v in (ours, ours_cpu) for p in (50, 95)]
    plain_ms = percentile(plain_cpu, 50) * 1000
    print(
        f"| {kind} | {count:,} | {ms[0]:.0f} | {ms[1]:.0f} | {ms[2]:.0f} | {ms[3]:.0f}"
        f" | {plain_ms:.0f} | {ms[2] / max(plain_ms, 1e-3):.1f} |"
    )
    database.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vectors", type=int, default=200_000)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--cost-segments", type=int, default=SEGMENTS_PER_HOUR)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start")
    print()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights.use_models_dir(pull_models(root / "models", encoder.MODEL))
        recall(root / "recall")
        cost(root / "cost", args.cost_segments)
        print(f"## A query's scan of {args.vectors:,} stored vectors (20 queries)")
        print()
        print(
            "| database | vectors | wall p50 ms | wall p95 ms | CPU p50 ms | CPU p95 ms"
            " | numpy in memory, CPU p50 ms | CPU ratio |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for kind in args.databases.split(","):
            if kind == "postgres":
                with scratch_postgres() as url:
                    scan(kind, url, root / kind, args.vectors)
            else:
                scan(kind, "", root / kind, args.vectors)
    print()
    print(f"machine load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
