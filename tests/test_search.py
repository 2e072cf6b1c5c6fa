"""Search: moments found by what was said (real speech, whisper) and written on screen
(real text, OCR), files found by their names, on SQLite (FTS5) and PostgreSQL (tsvector);
bad queries answered, never a 500."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
import unicodedata

import numpy as np
import pytest
from frame_media import text_frame
from media_factory import make_video

from momentry_edge import forget, jobs, outputs, store
from momentry_edge.search import index, query
from momentry_edge.upkeep import housekeeping

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

SIZE = (640, 360)
SPEECH = "Welcome to the weekly budget meeting. The budgets were cut."
SHOWN = "QUARTERLY FIGURES"


def meeting(svc, tmp_path, name: str = "meeting.mp4") -> None:
    """9 s in three 3 s scenes, speech throughout: the first scene shows SHOWN."""
    wav = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), SPEECH], check=True)
    scenes = [
        text_frame(SHOWN, size=SIZE, font_size=48),
        np.full((SIZE[1], SIZE[0], 3), (200, 40, 40), np.uint8),
        np.full((SIZE[1], SIZE[0], 3), (40, 40, 200), np.uint8),
    ]
    video = make_video(
        tmp_path / name,
        segments=3,
        segment_seconds=3,
        fps=10,
        size=SIZE,
        speech_wav=wav,
        picture=lambda i: scenes[min(i // 30, 2)],
    )
    video.replace(svc.drop / name)


def search(svc, q: str, **params) -> dict:
    return svc.get("/api/v1/search", params={"q": q, **params})


def marked(hit: dict) -> list[str]:
    return [part["text"] for part in hit["snippet"] if part["match"]]


@SQLITE  # PostgreSQL's search: the two nodes' test (test_shared_results.py) and those below
def test_said_and_shown_are_found_each_as_one_moment(start_service, models_dir, tmp_path):
    whisper = {"model": "whisper-tiny.en", "models_dir": str(models_dir)}
    svc = start_service(
        **{
            "processors.asr": whisper,
            "processors.asrx": whisper,  # one transcription for both
            "processors.ocr": {"sample_fps": 1},
        }
    )
    meeting(svc, tmp_path)
    task = svc.submit("meeting.mp4", ["cut", "asr", "asrx", "ocr"])
    uuid = task["file_uuid"]
    svc.wait_status(task["task_id"], "completed", timeout=240)

    found = search(svc, "budgets")  # word forms: "budget" is found too
    # asr and asrx hold the same segments: each moment is one hit, asrx's, naming both.
    said = [h for h in found["hits"] if h["processor"] in ("asr", "asrx")]
    assert said and {h["processor"] for h in said} == {"asrx"}, found
    assert all(h["sources"] == ["asr", "asrx"] for h in said)
    spans = [(h["start"], h["end"]) for h in said]
    assert len(spans) == len(set(spans)) and found["total"] == len(found["hits"])
    only_asr = search(svc, "budgets", source="asr")["hits"]
    assert [(h["start"], h["end"], h["sources"]) for h in only_asr] == [
        (*span, ["asr"]) for span in spans
    ]
    assert found["index"] == {"complete": True, "waiting": 0}
    first = said[0]
    assert first["file"] == {"file_uuid": uuid, "name": "meeting.mp4", "folder": ""}
    assert {w.lower() for h in said for w in marked(h)} >= {"budget"}
    assert 0 <= first["start"] < first["end"] <= 9.5
    # Its thumbnail is the keyframe of the scene the moment starts in.
    scene = int(first["start"] // 3)
    assert first["thumbnail_url"] == f"/api/v1/files/{uuid}/thumbnails/{scene}"
    picture = svc.client.get(first["thumbnail_url"])
    assert picture.status_code == 200 and picture.content[:2] == b"\xff\xd8"

    # The line on screen for 3 s (three samples) is one moment, from its first to last time.
    shown = search(svc, "quarterly", source="ocr")
    assert [(h["processor"], h["start"]) for h in shown["hits"]] == [("ocr", 0.0)]
    assert shown["hits"][0]["end"] == 2.0
    assert marked(shown["hits"][0]) == ["QUARTERLY"]
    assert shown["hits"][0]["thumbnail_url"] == f"/api/v1/files/{uuid}/thumbnails/0"

    # Phrases, prefixes, several words, case and accents.
    assert search(svc, '"budget meeting"')["hits"][0]["processor"] == "asrx"
    assert search(svc, '"meeting budget"')["hits"] == []
    assert [h["processor"] for h in search(svc, "QUART*")["hits"]] == ["ocr"]
    assert search(svc, "figures quarterly")["total"] == 1
    assert search(svc, "fígures")["total"] == 1
    assert search(svc, "budget figures")["total"] == 0  # both words in one moment
    # Filters: where the words are, the file, the folder.
    assert {h["processor"] for h in search(svc, "budget", source="asr")["hits"]} == {"asr"}
    assert search(svc, "budget", file=uuid)["total"] >= 1
    assert search(svc, "budget", file="f" * 32)["total"] == 0
    assert search(svc, "budget", folder="elsewhere")["total"] == 0

    # The hits as CSV.
    exported = svc.client.get("/api/v1/search.csv", params={"q": "quarterly"})
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert [(r["file"], r["source"], r["timecode"]) for r in rows] == [
        ("meeting.mp4", "ocr", "0:00:00.000")
    ]

    # A re-run replaces the file's moments: still one.
    again = svc.call(
        "POST",
        f"/api/v1/file/{uuid}/deep-scan",
        expect=202,
        json={"processors": ["ocr"], "force": True},
    )
    svc.wait_status(again["task_id"], "completed", timeout=120)
    assert len(search(svc, "quarterly")["hits"]) == 1


NAMES = ["Día de rodaje.mp4", "plató B.mp4", "Éclair.mp4"]


def test_names_are_found_without_case_or_accents_however_written(start_service):
    svc = start_service()
    for name in NAMES:  # written decomposed (NFD), as macOS writes names
        svc.submit(unicodedata.normalize("NFD", name), ["noop"])

    def listed(name: str) -> list[str]:
        files = svc.get("/api/v1/files", params={"name": name})["files"]
        return [unicodedata.normalize("NFC", f["file_name"]) for f in files]

    assert listed("Día") == ["Día de rodaje.mp4"]  # typed composed
    assert listed("dia") == ["Día de rodaje.mp4"]
    assert listed("PLATÓ") == ["plató B.mp4"]
    assert listed("eclair") == listed("ÉCLAIR") == ["Éclair.mp4"]
    hits = search(svc, "eclair")["hits"]
    assert [(h["processor"], h["start"]) for h in hits] == [("name", None)]
    assert marked(hits[0]) == [unicodedata.normalize("NFD", "Éclair")]

    searched = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(svc.config_path),
         "search", "ÉCLAIR"],
        capture_output=True, text=True, env=svc.env,
    )  # fmt: skip
    assert searched.returncode == 0, searched.stderr
    first, count = searched.stdout.splitlines()
    assert unicodedata.normalize("NFC", first).startswith("Éclair.mp4  -  [name]  **Éclair**")
    assert count == "1 of 1 found"
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "momentry_edge.cli",
            "--config",
            str(svc.config_path),
            "results",
            "eclair.mp4",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=svc.env,
    )
    assert shown.returncode == 0, shown.stderr
    assert (
        unicodedata.normalize("NFC", json.loads(shown.stdout)["file"]["file_name"]) == "Éclair.mp4"
    )


BAD = [
    "",
    " ",
    '"',
    "*",
    "NEAR",
    "NEAR(a b)",
    ":",
    "-",
    "a:b",
    "-budget",
    '"unbalanced',
    "'; DROP TABLE media_file; --",
    "a\x00b",
    "\x07\x1b[31m",
    "x" * 10_000,
    "(",
    ")",
    "AND",
    "OR NOT",
    "^",
    "{a b}",
    "col:budget",
    "*budget",
    "b*u*d",
    "％",
]


def test_any_query_gets_results_or_a_clear_400(start_service):
    svc = start_service()
    for q in BAD:
        reply = svc.client.get("/api/v1/search", params={"q": q})
        assert reply.status_code in (200, 400), (q, reply.status_code, reply.text)
        body = reply.json()
        if reply.status_code == 400:
            assert body["error"]["code"] == "bad_request" and "q" in body["error"]["message"]
            assert "fts5" not in reply.text.lower() and "syntax" not in reply.text.lower()
        else:
            assert body["hits"] == [] and body["total"] == 0
    for params in (
        {"q": "a", "source": "nothing"},
        {"q": "a", "since": "yesterday"},
        {"q": "a", "limit": "0"},
        {"q": "a", "q2": "b"},
    ):
        assert svc.client.get("/api/v1/search", params=params).status_code == 400
    assert svc.get("/api/v1/queue/status")  # still serving


def dropped_file(name: str, file_uuid: str) -> store.MediaFile:
    """A file registered at the top of the drop folder (its name folded as typed)."""
    return store.MediaFile.create(
        file_uuid=file_uuid,
        path=f"/drop/{name}",
        watch_root="/drop",
        rel_path=name,
        name=name,
        folded_name=name,
    )


TALK_ZH = "我们今天开会讨论明年的预算问题，预算被削减了。"


def test_a_chinese_word_inside_a_chinese_sentence_is_found(tmp_path, database_url):
    database = store.connect(database_url, tmp_path)
    record = dropped_file("会议.mp4", "c" * 32)
    document = {
        "status": "completed",
        "result": {
            "segments": [
                {"start": 1.0, "end": 4.0, "text": TALK_ZH},
                {"start": 4.0, "end": 6.0, "text": "谢谢大家。"},
            ]
        },
    }
    with database.atomic():
        index.put(record.id, "asr", json.dumps(document).encode())
    for word in ("预算", "开会", "削减", "预", "明年的预算"):
        hits = query.search(word, query.Filters(), 10, 0)["hits"]
        assert [h["start"] for h in hits if h["processor"] == "asr"] == [1.0], word
        assert set(marked(hits[0])) == {word}  # each place it is in
    assert query.search("算预", query.Filters(), 10, 0)["total"] == 0  # not in that order
    assert query.search("会议", query.Filters(), 10, 0)["hits"][0]["processor"] == "name"
    database.close()


DAY = 86400.0


def test_results_removed_by_the_retention_sweep_leave_no_hit(tmp_path, database_url):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    gone = dropped_file("old.mp4", "e" * 32)
    job, _ = jobs.submit(gone, ["asr"], max_retries=0)
    jobs.cancel(job)
    store.MediaFile.update(state=store.FileState.MISSING).where(
        store.MediaFile.id == gone.id
    ).execute()
    said = {
        "status": "completed",
        "result": {"segments": [{"start": 0, "end": 2, "text": "budget"}]},
    }
    with database.atomic():
        index.put(gone.id, "asr", json.dumps(said).encode())
        store.ResultPart.create(
            file=gone.id,
            processor="asr",
            status="completed",
            name="asr.json",
            content=json.dumps(said).encode(),
        )
    assert query.search("budget", query.Filters(), 10, 0)["total"] == 1

    housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 31 * DAY)

    assert query.search("budget", query.Filters(), 10, 0)["total"] == 0
    assert store.ResultPart.select().count() == 0
    assert store.SearchEntry.select().count() == 0
    database.close()


def transcript(*texts: str, status: str = "completed") -> bytes:
    segments = [{"start": i * 2.0, "end": i * 2.0 + 2, "text": t} for i, t in enumerate(texts)]
    return json.dumps({"status": status, "result": {"segments": segments}}).encode()


def test_the_index_answers_while_rebuilt_and_stays_true_to_reruns_and_forget(
    tmp_path, database_url
):
    data = tmp_path / "data"
    database = store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    indexed, earlier = (
        dropped_file(name, c * 32) for c, name in (("a", "monday.mp4"), ("b", "tuesday.mp4"))
    )
    with database.atomic():
        index.put(indexed.id, "asr", transcript("the budget of monday"))
    # Tuesday's transcript, made before the index existed: in its results folder only.
    job, _ = jobs.submit(earlier, ["asr"], max_retries=0)
    document = outputs.document_path(outputs.results_dir(data, earlier.file_uuid), "asr")
    document.parent.mkdir(parents=True)
    document.write_bytes(transcript("the budget of tuesday"))
    store.ProcessorRun.update(status=store.RunStatus.COMPLETED, output_path=str(document)).where(
        store.ProcessorRun.job == job.id
    ).execute()
    index._waiting_count = None  # counted afresh, as a service that has just started

    def said(q: str = "budget") -> tuple[list[str], dict]:
        found = query.search(q, query.Filters(), 10, 0)
        return [h["text"] for h in found["hits"]], found["index"]

    # While it is being rebuilt, a search answers from what is there, and says so.
    assert said() == (["the budget of monday"], {"complete": False, "waiting": 1})
    assert index.Backfill(data).run_once() == 1
    texts, state = said()
    assert sorted(texts) == ["the budget of monday", "the budget of tuesday"]
    assert state == {"complete": True, "waiting": 0}

    # A failed run leaves the complete one's moments; a completed re-run replaces them.
    with database.atomic():
        index.put(indexed.id, "asr", transcript("nothing said", status="failed"))
    assert "the budget of monday" in said()[0] and said("nothing")[0] == []
    with database.atomic():
        index.put(indexed.id, "asr", transcript("a new budget for monday"))
    assert said("new budget") == (["a new budget for monday"], {"complete": True, "waiting": 0})

    # A forgotten file leaves no hit (neither its moments nor its name).
    forget.forget(data, earlier)
    assert said("tuesday")[0] == [] and sorted(said()[0]) == ["a new budget for monday"]
    assert store.SearchEntry.select().where(store.SearchEntry.file == earlier.id).count() == 0
    database.close()


@pytest.mark.timeout(60)
def test_a_common_and_a_rare_prefix_each_find_their_newest_moments(tmp_path, database_url):
    # 2,500 segments say "budgeted" and "report" (17 of them "budgeted report"), each
    # with two of 230 other words; the oldest alone says "zebra". On PostgreSQL with the
    # column's statistics gathered (ANALYZE), a common prefix is read newest first off
    # the primary key, a rare one through the GIN index; without them, both through the
    # GIN index. Each finds the same moments.
    database = store.connect(database_url, tmp_path)
    record = dropped_file("talk.mp4", "d" * 32)
    said = [
        f"budgeted report w{i % 150} v{i % 80}"
        if i % 150 == 7
        else f"report w{i % 150} budgeted v{i % 80}"
        for i in range(2500)
    ]
    said[0] = "zebra " + said[0]
    with database.atomic():
        index.put(record.id, "asr", transcript(*said))

    def found(q: str) -> tuple[list[float], int, bool]:
        answer = query.search(q, query.Filters(), 5, 0)
        return [h["start"] for h in answer["hits"]], answer["total"], answer["total_exact"]

    postgres = store.is_postgres(database)
    for analysed in (False, True):
        if analysed:
            store.execute("ANALYZE search_entry")
            query._planned.clear()  # looked up afresh, as a process does every few minutes
            assert not postgres or query._prefixes_planned(database)
        # All 2,500 match: ranked among the newest 2,000 (equal scores, newest first).
        assert found("budg*") == ([2.0 * i for i in range(2499, 2494, -1)], 2000, False)
        assert found("zeb*") == ([0.0], 1, True)
        assert found("zebu*") == ([], 0, True)
        # The phrase's 17 segments, 13 of them among the newest 2,000 holding both words:
        # on PostgreSQL it is looked for there, and its total is a lower bound.
        starts, total, exact = found('"budgeted report"')
        assert starts == [2.0 * i for i in (2407, 2257, 2107, 1957, 1807)]
        assert (total, exact) == ((13, False) if postgres else (17, True))
    database.close()
