"""Results kept in the queue database: every node sharing it serves them, the node that
made them on or off, and results made before still come from the results folder."""

from __future__ import annotations

import os
import subprocess

import pytest
import srt
from conftest import wait_for
from media_factory import make_video

from momentry_edge import store

POSTGRES = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def talk(svc, tmp_path, name: str = "weekly.mp4") -> None:
    """A three-scene video with speech, in ``svc``'s drop folder."""
    wav = tmp_path / "speech.wav"
    subprocess.run(
        ["espeak-ng", "-w", str(wav), "Welcome to the weekly budget meeting."], check=True
    )
    video = make_video(
        tmp_path / name, segments=3, segment_seconds=2, fps=10, size=(96, 64), speech_wav=wav
    )
    os.replace(video, svc.drop / name)


@POSTGRES
def test_node_a_serves_what_node_b_made_while_b_is_off(start_service, models_dir, tmp_path):
    asr = {"processors.asr": {"model": "whisper-tiny.en", "models_dir": str(models_dir)}}
    b = start_service("b", service={"node_id": "node-b"}, **asr)
    talk(b, tmp_path)
    task = b.submit("weekly.mp4", ["cut", "asr"])["task_id"]
    job = b.wait_status(task, "completed", timeout=120)
    assert job["node"] == "node-b"
    base = f"/api/v1/files/{job['file_uuid']}"
    made = {
        "cut": b.get(f"{base}/results/cut"),
        "asr": b.get(f"{base}/results/asr"),
        "srt": b.client.get(f"{base}/results/asr.srt").text,
        "thumbnail": b.client.get(f"{base}/thumbnails/1").content,
        "summary": b.get(base)["results"],
    }
    b.stop()

    a = start_service("a", service={"node_id": "node-a"}, **asr)
    assert not (a.data_dir / "results" / job["file_uuid"]).exists()  # nothing on a's disk
    assert a.get(f"{base}/results/cut") == made["cut"]
    assert len(made["cut"]["result"]["scenes"]) == 3
    transcript = a.get(f"{base}/results/asr")
    assert transcript == made["asr"] and "budget" in transcript["result"]["text"].lower()
    subtitles = a.client.get(f"{base}/results/asr.srt")
    assert subtitles.status_code == 200 and subtitles.text == made["srt"]
    assert "budget" in " ".join(s.content for s in srt.parse(subtitles.text)).lower()
    picture = a.client.get(f"{base}/thumbnails/1")
    assert picture.status_code == 200 and picture.headers["content-type"] == "image/jpeg"
    assert picture.content == made["thumbnail"] and picture.content[:2] == b"\xff\xd8"
    assert a.client.get(f"{base}/thumbnails/3").status_code == 404  # three scenes: 0 to 2
    # The file's page lists B's results as B did: "asr: completed", by B's job.
    summary = a.get(base)["results"]
    assert summary == made["summary"]
    assert {p: (r["status"], r["task_id"]) for p, r in summary.items()} == {
        "asr": ("completed", task),
        "cut": ("completed", task),
    }

    # Node A finds node B's moment by what was said, with its scene's picture.
    found = a.get("/api/v1/search", params={"q": "budgets"})
    said = [h for h in found["hits"] if h["processor"] == "asr"]
    assert said and said[0]["file"]["file_uuid"] == job["file_uuid"], found
    assert a.client.get(said[0]["thumbnail_url"]).content[:2] == b"\xff\xd8"


@SQLITE
def test_results_made_before_the_upgrade_are_served_and_indexed_in_the_background(
    start_service, models_dir, tmp_path, database_url
):
    svc = start_service(
        **{"processors.asr": {"model": "whisper-tiny.en", "models_dir": str(models_dir)}}
    )
    talk(svc, tmp_path)
    task = svc.submit("weekly.mp4", ["cut", "asr"])["task_id"]
    uuid = svc.wait_status(task, "completed", timeout=120)["file_uuid"]
    base = f"/api/v1/files/{uuid}"
    made = (svc.get(f"{base}/results/asr"), svc.client.get(f"{base}/thumbnails/0").content)
    # As a database from before the tables held results and moments: none stored.
    database = store.connect(database_url, svc.data_dir)
    for table in ("result_part", "search_entry", "search_indexed"):
        database.execute_sql(f"DELETE FROM {table}")
    database.close()
    assert svc.get(f"{base}/results/asr") == made[0]
    assert svc.client.get(f"{base}/thumbnails/0").content == made[1]
    assert "budget" in svc.client.get(f"{base}/results/asr.srt").text.lower()

    def found() -> dict:
        return svc.get("/api/v1/search", params={"q": "budget"})

    # Not indexed: the answer says so; the next start indexes the results folder's.
    waiting = wait_for(lambda: (f := found())["index"]["complete"] is False and f)
    assert waiting["index"]["waiting"] == 1 and waiting["hits"] == []
    svc.restart()
    done = wait_for(lambda: (f := found())["index"]["complete"] and f["hits"] and f)
    assert done["hits"][0]["file"]["file_uuid"] == uuid
    assert done["hits"][0]["processor"] == "asr"
