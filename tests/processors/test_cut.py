import io
import json
import os
import shutil
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from media_factory import make_corrupt_video, make_text_file, make_video, segment_colour
from PIL import Image
from reports import Reports

from momentry_edge import store
from momentry_edge.processors.base import (
    PermanentError,
    ProcessorError,
    RunContext,
    Stop,
)
from momentry_edge.processors.cut import CutProcessor

FPS = 25


def kept_in_the_folder_only(svc, database_url: str) -> None:
    """The results as an earlier version kept them: in the results folder only, not in
    the database (stored_results), so the API reads them from the folder."""
    database = store.connect(database_url, svc.data_dir)
    database.execute_sql("DELETE FROM result_part")
    database.close()


def run_cut(path: Path, tmp_path: Path, reports: Reports, checkpoint=None, **settings) -> dict:
    ctx = RunContext(
        media_path=path,
        output_dir=tmp_path / "out",
        checkpoint=checkpoint,
        attempt=1 if checkpoint is None else 2,
        _report=reports,
    )
    return CutProcessor(settings).run(ctx)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """20 s, hard cuts at 5, 10 and 15 s."""
    return make_video(tmp_path_factory.mktemp("cut") / "four scenes.mp4", fps=FPS)


@pytest.fixture(scope="module")
def uninterrupted(clip, tmp_path_factory):
    reports = Reports()
    result = run_cut(clip, tmp_path_factory.mktemp("run"), reports)
    return result, reports


def test_finds_the_cuts_and_covers_the_whole_clip(uninterrupted):
    result, _ = uninterrupted

    assert result["cuts"] == pytest.approx([5.0, 10.0, 15.0], abs=1 / FPS)
    assert result["fps"] == FPS
    assert result["frame_count"] == 500
    scenes = result["scenes"]
    assert [s["index"] for s in scenes] == [0, 1, 2, 3]
    assert scenes[0]["start_frame"] == 0 and scenes[0]["start"] == 0.0
    assert scenes[-1]["end_frame"] == 499 and scenes[-1]["end"] == pytest.approx(20.0)
    for before, after in pairwise(scenes):
        assert after["start_frame"] == before["end_frame"] + 1
        assert after["start"] == before["end"]
    assert [s["start"] for s in scenes[1:]] == result["cuts"]


def test_reports_progress_with_checkpoints_but_not_every_frame(uninterrupted):
    result, reports = uninterrupted

    assert 5 <= len(reports.calls) <= 20
    assert reports.calls[-1] == (500, 500)
    currents = [current for current, _ in reports.calls]
    assert currents == sorted(currents)
    assert max(b - a for a, b in pairwise([0, *currents])) <= 2 * FPS
    checkpoint = reports.checkpoints[-1]
    assert checkpoint["frame"] == 500
    assert checkpoint["timestamp"] == pytest.approx(20.0)
    assert checkpoint["partial"] == result


@pytest.mark.parametrize(
    "save_when_stopping",
    [True, False],
    ids=["cancelled (checkpoint saved)", "killed (last checkpoint lost)"],
)
def test_stopped_run_resumes_to_the_same_result(clip, tmp_path, uninterrupted, save_when_stopping):
    expected, _ = uninterrupted
    first = Reports(stop_at=260, save_when_stopping=save_when_stopping)

    with pytest.raises(Stop):
        run_cut(clip, tmp_path, first)

    stopped_at = first.calls[-1][0]
    checkpoint = first.checkpoints[-1]
    assert 260 <= stopped_at < 500
    assert stopped_at - checkpoint["frame"] <= 2 * FPS  # redone work: at most ~2 s
    partial = checkpoint["partial"]
    assert partial["scenes"][-1]["end_frame"] == checkpoint["frame"] - 1
    assert partial["cuts"] == [c for c in expected["cuts"] if c * FPS < checkpoint["frame"]]

    second = Reports()
    result = run_cut(clip, tmp_path, second, checkpoint=checkpoint)

    assert result == expected
    assert second.calls[0][0] > checkpoint["frame"]  # went on, did not start over


def test_checkpoint_from_other_settings_is_not_reused(clip, tmp_path, uninterrupted):
    expected, reports = uninterrupted
    foreign = {**reports.checkpoints[4], "cuts_frames": [42]}
    foreign["settings"] = {**foreign["settings"], "threshold": 99.0}

    result = run_cut(clip, tmp_path, Reports(), checkpoint=foreign)

    assert result == expected


def test_missing_file_is_transient(tmp_path):
    with pytest.raises(ProcessorError) as caught:
        run_cut(tmp_path / "still uploading.mp4", tmp_path, Reports())

    assert caught.value.transient is True
    assert not isinstance(caught.value, PermanentError)
    assert "file not found" in str(caught.value)


@pytest.mark.parametrize(
    ("make", "reason"),
    [(make_text_file, "not a readable media file"), (make_corrupt_video, "truncated or corrupt")],
    ids=["text", "truncated"],
)
def test_unreadable_file_is_permanent(tmp_path, make, reason):
    path = make(tmp_path / "upload.mp4")

    with pytest.raises(PermanentError, match=reason) as caught:
        run_cut(path, tmp_path, Reports())

    assert caught.value.transient is False


def test_bad_settings_are_permanent(clip, tmp_path):
    with pytest.raises(PermanentError, match="bad cut settings"):
        run_cut(clip, tmp_path, Reports(), threshold="high")


def scene_colours(result: dict, out: Path) -> list[tuple[float, ...]]:
    """The mean RGB of each scene's thumbnail, checking each is a JPEG of the clip's shape."""
    colours = []
    for scene in result["scenes"]:
        with Image.open(out / scene["thumbnail"]) as picture:
            assert picture.format == "JPEG"
            assert picture.size == (320, 240)  # the clip's size: never upscaled
            colours.append(tuple(np.asarray(picture.convert("RGB")).mean(axis=(0, 1))))
    return colours


def nearest_segment(colour: tuple[float, ...]) -> int:
    """Which of the clip's four scenes a picture of this mean colour shows."""
    return min(range(4), key=lambda k: np.linalg.norm(np.subtract(colour, segment_colour(k))))


def test_writes_one_thumbnail_per_scene_from_its_middle(clip, tmp_path):
    result = run_cut(clip, tmp_path, Reports())

    names = [s["thumbnail"] for s in result["scenes"]]
    assert names == [f"cut.thumbnails/{s['start_frame']:010d}.jpg" for s in result["scenes"]]
    assert sorted(p.name for p in (tmp_path / "out" / "cut.thumbnails").iterdir()) == [
        n.split("/")[1] for n in names
    ]
    assert [nearest_segment(c) for c in scene_colours(result, tmp_path / "out")] == [0, 1, 2, 3]


def test_thumbnails_fit_the_configured_side_and_can_be_turned_off(clip, tmp_path):
    small = run_cut(clip, tmp_path / "small", Reports(), thumbnail_max_side=64)
    with Image.open(tmp_path / "small" / "out" / small["scenes"][0]["thumbnail"]) as picture:
        assert picture.size == (64, 48)

    off = run_cut(clip, tmp_path / "off", Reports(), thumbnails=False)
    assert "thumbnail" not in off["scenes"][0]
    assert not (tmp_path / "off" / "out" / "cut.thumbnails").exists()


def test_a_resumed_run_keeps_the_thumbnails_of_scenes_before_its_checkpoint(clip, tmp_path):
    first = Reports(stop_at=400, save_when_stopping=False)  # killed in the last scene
    with pytest.raises(Stop):
        run_cut(clip, tmp_path, first)

    result = run_cut(clip, tmp_path, Reports(), checkpoint=first.checkpoints[-1])

    assert [s["thumbnail"] is not None for s in result["scenes"]] == [True] * 4
    assert [nearest_segment(c) for c in scene_colours(result, tmp_path / "out")] == [0, 1, 2, 3]
    assert not (tmp_path / "out" / ".cut.thumbnails.work").exists()


def test_the_api_serves_each_scene_thumbnail(start_service, clip):
    svc = start_service()
    shutil.copy(clip, svc.drop / "four scenes.mp4")
    task = svc.submit("four scenes.mp4", ["cut"])
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=120)
    assert job["status"] == "completed", job

    base = f"/api/v1/files/{task['file_uuid']}/thumbnails"
    colours = []
    for index in range(4):
        reply = svc.client.get(f"{base}/{index}")
        assert reply.status_code == 200 and reply.headers["content-type"] == "image/jpeg"
        with Image.open(io.BytesIO(reply.content)) as picture:
            assert picture.format == "JPEG" and picture.size == (320, 240)
            colours.append(tuple(np.asarray(picture.convert("RGB")).mean(axis=(0, 1))))
    assert [nearest_segment(c) for c in colours] == [0, 1, 2, 3]
    # 5000 digits: more than int() takes from a string.
    for index in ("4", "x", "9" * 20, "-1", "9" * 5000, "0" * 4999 + "1"):
        reply = svc.client.get(f"{base}/{index}")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"


def test_links_and_fifos_put_in_a_results_folder_are_never_served(
    start_service, clip, tmp_path, database_url
):
    """A results folder holds only what the service wrote; a link there (made by hand, or
    brought in by a restored backup) could point anywhere on the machine."""
    svc = start_service()
    shutil.copy(clip, svc.drop / "four scenes.mp4")
    task = svc.submit("four scenes.mp4", ["cut"])
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=120)
    assert job["status"] == "completed", job
    file_uuid = task["file_uuid"]
    kept_in_the_folder_only(svc, database_url)  # what this test is about
    folder = svc.data_dir / "results" / file_uuid
    secret = tmp_path / "secret.txt"
    secret.write_text('{"secret": true}')

    thumbnails = sorted((folder / "cut.thumbnails").iterdir())
    thumbnails[0].unlink()
    thumbnails[0].symlink_to(secret)
    thumbnails[1].unlink()
    os.mkfifo(thumbnails[1])
    base = f"/api/v1/files/{file_uuid}/thumbnails"
    for index in (0, 1):
        reply = svc.client.get(f"{base}/{index}", timeout=10)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    assert svc.client.get(f"{base}/2").headers["content-type"] == "image/jpeg"

    (folder / "cut.json").rename(tmp_path / "cut.json")
    (folder / "cut.json").symlink_to(secret)
    reply = svc.client.get(f"/api/v1/files/{file_uuid}/results/cut")
    assert reply.status_code == 404 and b"secret" not in reply.content
    assert svc.client.get(f"{base}/2").status_code == 404


def test_no_link_below_the_results_root_is_followed(start_service, clip, tmp_path, database_url):
    """The results root may be a link (shared storage); below it, a linked folder (the
    thumbnails' or a whole file's results) could point anywhere on the machine."""
    shared = tmp_path / "shared"
    shared.mkdir()
    svc = start_service()
    (svc.data_dir / "results").symlink_to(shared)
    shutil.copy(clip, svc.drop / "four scenes.mp4")
    task = svc.submit("four scenes.mp4", ["cut"])
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=120)
    assert job["status"] == "completed", job
    file_uuid = task["file_uuid"]
    base = f"/api/v1/files/{file_uuid}/thumbnails"
    assert svc.client.get(f"{base}/1").headers["content-type"] == "image/jpeg"
    kept_in_the_folder_only(svc, database_url)  # what this test is about

    # Elsewhere on the machine: a "thumbnail" and a cut.json naming it.
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "cut.thumbnails").mkdir(parents=True)
    folder = shared / file_uuid
    names = sorted(p.name for p in (folder / "cut.thumbnails").iterdir())
    for name in names:
        (elsewhere / "cut.thumbnails" / name).write_text("secret")
    shutil.copy(folder / "cut.json", elsewhere / "cut.json")

    (folder / "cut.thumbnails").rename(tmp_path / "kept thumbnails")
    (folder / "cut.thumbnails").symlink_to(elsewhere / "cut.thumbnails")
    reply = svc.client.get(f"{base}/1")
    assert reply.status_code == 404 and b"secret" not in reply.content

    folder.rename(tmp_path / "kept results")
    folder.symlink_to(elsewhere)
    for path in (f"{base}/1", f"/api/v1/files/{file_uuid}/results/cut"):
        reply = svc.client.get(path)
        assert reply.status_code == 404 and b"secret" not in reply.content, path


def test_a_thumbnail_follows_a_cut_json_written_anew(start_service, clip, tmp_path, database_url):
    """cut.json is parsed once for many thumbnail requests, and again once it changes."""
    svc = start_service()
    shutil.copy(clip, svc.drop / "four scenes.mp4")
    task = svc.submit("four scenes.mp4", ["cut"])
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=120)
    assert job["status"] == "completed", job
    base = f"/api/v1/files/{task['file_uuid']}/thumbnails"
    first = [svc.client.get(f"{base}/{index}").content for index in range(4)]
    assert len(set(first)) == 4
    kept_in_the_folder_only(svc, database_url)  # what this test is about

    # Scene 0 now names scene 3's picture, as a later run's cut.json could.
    cut_json = svc.data_dir / "results" / task["file_uuid"] / "cut.json"
    document = json.loads(cut_json.read_text())
    scenes = document["result"]["scenes"]
    scenes[0]["thumbnail"] = scenes[3]["thumbnail"]
    staged = cut_json.with_name("cut.json.new")
    staged.write_text(json.dumps(document))
    staged.replace(cut_json)
    assert svc.client.get(f"{base}/0").content == first[3]
    assert svc.client.get(f"{base}/1").content == first[1]


def test_a_link_in_the_original_results_is_not_shared_with_a_duplicate(
    start_service, clip, tmp_path, database_url
):
    svc = start_service()
    shutil.copy(clip, svc.drop / "original.mp4")
    original = svc.submit("original.mp4", ["cut"])
    job = svc.wait_status(original["task_id"], "completed", "partial", "failed", timeout=120)
    assert job["status"] == "completed", job
    kept_in_the_folder_only(svc, database_url)  # what this test is about

    # The original's thumbnails replaced by a link to files elsewhere, named as they are.
    folder = svc.data_dir / "results" / original["file_uuid"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for picture in (folder / "cut.thumbnails").iterdir():
        (elsewhere / picture.name).write_text("secret")
    shutil.rmtree(folder / "cut.thumbnails")
    (folder / "cut.thumbnails").symlink_to(elsewhere)

    shutil.copy(clip, svc.drop / "copy.mp4")
    copy = svc.submit("copy.mp4", ["cut"])
    job = svc.wait_status(copy["task_id"], "completed", "partial", "failed", timeout=120)
    assert job["processors"]["cut"]["reason"] == f"duplicate of {original['file_uuid']}", job
    for uuid in (original["file_uuid"], copy["file_uuid"]):
        reply = svc.client.get(f"/api/v1/files/{uuid}/thumbnails/0")
        assert reply.status_code == 404 and b"secret" not in reply.content
