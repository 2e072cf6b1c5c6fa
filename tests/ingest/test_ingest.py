"""Ingest from the drop folder, as an SFTP upload reaches it: a real service process watching
a real folder, on SQLite and PostgreSQL. Files are real videos (or real bad files)."""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path, PurePath

import psycopg
import pytest
from conftest import ServiceProcess, wait_for
from media_factory import make_corrupt_video, make_text_file, make_video

from momentry_edge.ingest.paths import ignored_reason, normalize_extensions
from momentry_edge.ingest.watcher import QUIET, SettleTracker

# Quick settling for tests; no periodic rescan unless a test asks for one.
INGEST = {"settle_seconds": 0.5, "processors": ["noop"], "rescan_interval": 3600}
EXTENSIONS = normalize_extensions([".mp4", ".mov", ".m4v", ".mkv", ".avi", ".webm", ".mts"])


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """200 small, real, pairwise different videos outside any watched folder."""
    folder = tmp_path_factory.mktemp("videos")
    return [
        make_video(
            folder / f"v{i:03d}.mp4",
            segments=1,
            segment_seconds=(4 + i) / 25,  # a different frame count, so different content
            fps=25,
            size=(64, 48),
            audio=False,
        )
        for i in range(200)
    ]


def drop_service(start_service: Callable[..., ServiceProcess], **ingest: object) -> ServiceProcess:
    return start_service(ingest=INGEST | ingest)


def files(svc: ServiceProcess) -> dict[str, dict]:
    """Every known file by its path relative to the drop folder."""
    return {f["path"]: f for f in svc.get("/api/v1/files?limit=1000")["files"]}


def jobs_per_file(svc: ServiceProcess) -> Counter[str]:
    reply = svc.get("/api/v1/jobs?limit=1000")
    assert reply["total"] <= 1000
    return Counter(job["file_uuid"] for job in reply["jobs"])


def jobs_of(svc: ServiceProcess, file_uuid: str) -> list[dict]:
    """A file's jobs in full, oldest first."""
    detail = svc.get(f"/api/v1/files/{file_uuid}")
    return [svc.job(j["task_id"]) for j in reversed(detail["jobs"])]


def rescan(svc: ServiceProcess) -> dict[str, int]:
    reply = svc.call("POST", "/api/v1/files/rescan")
    assert reply.pop("success") is True
    return reply


def copy_in(source: Path, target: Path) -> Path:
    """Copy as an upload would: a plain write into the watched folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def link_in(source: Path, target: Path, mtime: float | None = None) -> Path:
    """Arrive whole with no write, close or move seen in the watched folder (a hard link
    made from outside, the staging copy then removed): the watcher waits settle_seconds
    for it, so a long settle time leaves it to the rescan or the hook (backdated:
    ``mtime``). A rename into place would be taken at once, as a closed file is. A file
    already at ``target`` is removed first (the watcher sees it go)."""
    staging = target.parent.parent / f"{target.parent.name}.staging" / target.name
    copy_in(source, staging)
    if mtime is not None:
        os.utime(staging, (mtime, mtime))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    os.link(staging, target)
    staging.unlink()
    return target


# -- the pieces, without a service ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "taken"),
    [
        ("clip.mp4", True),
        ("LOUD.MP4", True),
        ("sub/folder/clip.mov", True),
        ("clip.mp4.part", False),
        ("clip.mp4.filepart", False),
        ("clip.tmp", False),
        ("clip.mp4.crdownload", False),
        ("clip.mp4.partial", False),
        (".clip.mp4", False),
        ("~$clip.mp4", False),
        (".sync/clip.mp4", False),
        ("notes.txt", False),
        ("no extension", False),
    ],
)
def test_which_names_are_taken(rel: str, taken: bool) -> None:
    reason = ignored_reason(PurePath(rel), EXTENSIONS)
    assert (reason is None) == taken, reason


def test_settle_tracker_waits_until_size_and_mtime_hold_still(tmp_path: Path) -> None:
    now = [100.0]
    tracker = SettleTracker(2.0, clock=lambda: now[0])
    upload = tmp_path / "upload.mp4"
    upload.write_bytes(b"a" * 10)
    tracker.touch(str(upload))
    now[0] = 101.9
    assert tracker.due() == []
    # Another chunk arrives: the wait starts again from when it was seen.
    with upload.open("ab") as f:
        f.write(b"b" * 10)
    assert tracker.due() == []
    now[0] = 103.8
    assert tracker.due() == []
    now[0] = 103.9
    assert tracker.due() == [(str(upload), QUIET)]
    assert tracker.due() == [], "each settled path is returned once"

    # An event alone (same size and mtime) also restarts the wait.
    tracker.touch(str(upload))
    now[0] = 105.0
    tracker.touch(str(upload))
    now[0] = 106.9
    assert tracker.due() == []
    now[0] = 107.0
    assert tracker.due() == [(str(upload), QUIET)]

    # Deleted before it settled, or a symlink: never due.
    gone = tmp_path / "gone.mp4"
    gone.write_bytes(b"x")
    tracker.touch(str(gone))
    gone.unlink()
    link = tmp_path / "link.mp4"
    link.symlink_to(upload)
    tracker.touch(str(link))
    now[0] = 200.0
    assert tracker.due() == [] and len(tracker) == 0


# -- uploads through the watched folder ------------------------------------------------------


def test_a_file_written_in_chunks_over_ten_seconds_is_queued_once_after_its_last_write(
    start_service, videos
) -> None:
    svc = drop_service(start_service, settle_seconds=2.0)
    data = videos[190].read_bytes()
    upload = svc.drop / "slow upload.mp4"
    pieces = 28
    step = -(-len(data) // pieces)
    with upload.open("wb") as out:
        for at in range(0, len(data), step):
            out.write(data[at : at + step])
            out.flush()
            # While the upload grows, nothing is registered or queued.
            assert svc.get("/api/v1/files")["total"] == 0
            assert svc.get("/api/v1/jobs")["total"] == 0
            time.sleep(0.4)
    last_write = upload.stat().st_mtime

    record = wait_for(lambda: files(svc).get("slow upload.mp4"), timeout=30)
    assert record["state"] == "present" and record["size"] == len(data)
    (job,) = jobs_of(svc, record["file_uuid"])
    assert _ts(job["created_at"]) >= last_write - 0.01, "queued only after the last write"
    svc.wait_status(job["task_id"], "completed")
    assert rescan(svc)["unchanged"] == 1
    assert svc.get("/api/v1/jobs")["total"] == 1


def test_a_part_file_renamed_to_mp4_is_queued_once_and_temp_names_never(
    start_service, videos
) -> None:
    svc = drop_service(start_service)
    ignored = [
        "take.mp4.part",
        "b.mp4.filepart",
        "c.tmp",
        "d.mp4.crdownload",
        "e.mp4.partial",
        ".hidden.mp4",
        "~$lock.mp4",
        "notes.txt",
        ".sync/inside.mp4",
    ]
    for i, name in enumerate(ignored):
        copy_in(videos[i], svc.drop / name)
    # Backdated, a rescan would register them at once if it took them at all.
    for name in ignored:
        os.utime(svc.drop / name, (time.time() - 3600,) * 2)
    assert rescan(svc) == {
        "new": 0,
        "changed": 0,
        "missing": 0,
        "unchanged": 0,
        "settling": 0,
        "ignored": 1,
    }

    os.rename(svc.drop / "take.mp4.part", svc.drop / "take.mp4")
    record = wait_for(lambda: files(svc).get("take.mp4"))
    (job,) = jobs_of(svc, record["file_uuid"])
    svc.wait_status(job["task_id"], "completed")
    assert rescan(svc)["unchanged"] == 1
    # Of the names not taken only a kind not taken is listed (ignored, with its reason).
    assert sorted(files(svc)) == ["notes.txt", "take.mp4"]
    assert files(svc)["notes.txt"]["state"] == "ignored"
    assert svc.get("/api/v1/jobs")["total"] == 1


def bad_files(folder: Path) -> dict[str, str]:
    """Files named like videos that are not usable ones, made in ``folder``, each with
    words of the reason it is rejected for."""
    folder.mkdir(parents=True, exist_ok=True)
    make_corrupt_video(folder / "cut short.mp4")
    make_text_file(folder / "notes.mp4")
    (folder / "empty.mp4").write_bytes(b"")
    return {
        "cut short.mp4": "truncated or corrupt",
        "notes.mp4": "not a readable media file",
        "empty.mp4": "empty (0 bytes)",
    }


def assert_rejected_and_not_processed(svc: ServiceProcess, record: dict, words: str) -> None:
    """Rejected with its reason; no processor ran on it and no result was written.

    A file whose writer closed it is queued before it is probed (a bulk drop is not held
    up by the probe); its job then fails at its start with the reason. An empty file is
    rejected at once, without a job.
    """
    assert record["state"] == "rejected", record
    assert words in record["reason"], record
    found = jobs_of(svc, record["file_uuid"])
    assert len(found) <= 1, found
    if record["reason"].endswith("empty (0 bytes)"):
        assert found == [] and record["status"] is None
    for job in found:
        job = svc.wait_status(job["task_id"], "failed")
        for name, run in job["processors"].items():
            assert run["status"] == "failed" and run["attempts"] == 0, run
            assert run["error"] == f"file rejected: {record['reason']}", run
            reply = svc.client.get(f"/api/v1/files/{record['file_uuid']}/results/{name}")
            assert reply.status_code == 404, reply.text


def test_200_videos_and_bad_files_copied_at_once_are_queued_once_and_the_bad_rejected(
    start_service, videos, tmp_path
) -> None:
    svc = drop_service(start_service)
    bad = bad_files(tmp_path / "bad")
    drops = {f"batch {i // 50}/clip {i:03d}.mp4": video for i, video in enumerate(videos)}
    drops |= {f"batch {i}/{name}": tmp_path / "bad" / name for i, name in enumerate(bad)}
    for name, source in drops.items():
        copy_in(source, svc.drop / name)

    wait_for(lambda: len(files(svc)) == len(drops), timeout=120, interval=0.5)
    wait_for(lambda: svc.status()["pending_count"] == 0 and svc.status()["active_count"] == 0)
    known = files(svc)
    good = {name: known[name] for name in drops if drops[name] in videos}
    assert {f["state"] for f in good.values()} == {"present"}
    assert {f["status"] for f in good.values()} == {"completed"}
    per_file = jobs_per_file(svc)
    assert all(per_file[f["file_uuid"]] == 1 for f in good.values()), "each queued once"
    detail = svc.get(f"/api/v1/files/{good['batch 3/clip 199.mp4']['file_uuid']}")
    assert (detail["width"], detail["height"], detail["fps"]) == (64, 48, 25.0)
    assert detail["duration"] == pytest.approx(203 / 25, abs=0.05), "probed at its job's start"
    for i, (name, words) in enumerate(bad.items()):
        assert_rejected_and_not_processed(svc, known[f"batch {i}/{name}"], words)
    assert rescan(svc)["unchanged"] == len(drops)
    total = svc.get("/api/v1/jobs")["total"]
    assert 200 <= total <= 200 + 3  # a bad file probed before queueing has no job

    svc.restart()
    assert rescan(svc)["unchanged"] == len(drops)
    assert svc.get("/api/v1/jobs")["total"] == total, "a restart queues nothing again"


def test_videos_renamed_into_place_are_queued_at_once_unprobed_and_a_bad_one_rejected(
    start_service, videos, tmp_path
) -> None:
    # A long settle time: only the renames can make the files due. Uploads as SFTPGo and
    # rsync finish them: written under a temporary or hidden name, closed, renamed into
    # place; others moved in whole from outside the watched folder.
    svc = drop_service(start_service, settle_seconds=60)
    svc.call("POST", "/api/v1/queue/pause")  # the jobs wait: their files stay unprobed
    bad = bad_files(tmp_path / "bad")
    staging = svc.root / "staging"
    # Renamed while its writer still has it open: not whole yet, so taken after its close.
    data = videos[199].read_bytes()
    still_open = (svc.drop / "open.mp4.part").open("wb")
    still_open.write(data[: len(data) // 2])
    still_open.flush()
    os.rename(svc.drop / "open.mp4.part", svc.drop / "open.mp4")
    drops: dict[str, Path] = {}
    for i, video in enumerate(videos[:100]):
        name = f"clip {i:03d}.mp4"
        if i % 2:
            temporary = copy_in(video, svc.drop / f".{name}.Xa9Qz{i}")  # rsync's temporary name
        else:
            temporary = copy_in(video, staging / name)  # outside the watched folder
        drops[name] = video
        os.rename(temporary, svc.drop / name)
    # A folder moved in whole: its files are whole too.
    for i, video in enumerate(videos[100:103]):
        copy_in(video, staging / "folder" / f"take {i}.mp4")
        drops[f"folder/take {i}.mp4"] = video
    os.rename(staging / "folder", svc.drop / "folder")
    cut_short = copy_in(tmp_path / "bad" / "cut short.mp4", svc.drop / "cut short.mp4.part")
    # Written long ago (rsync -t keeps the source's time): rejected when its job starts.
    # One written moments ago is given settle_seconds to be finished (a writer may close
    # it after each part).
    os.utime(cut_short, (time.time() - 3600, time.time() - 3600))
    os.rename(cut_short, svc.drop / "cut short.mp4")
    os.rename(copy_in(videos[150], staging / "hidden.mp4"), svc.drop / ".hidden.mp4")
    os.rename(copy_in(videos[151], staging / "b.mp4"), svc.drop / "b.mp4.filepart")

    wait_for(lambda: len(files(svc)) == len(drops) + 1, timeout=60, interval=0.5)
    known = files(svc)
    assert "open.mp4" not in known, "renamed while open for writing: not taken half-written"
    assert sorted(known) == sorted([*drops, "cut short.mp4"]), "temporary names never taken"
    for name in (*drops, "cut short.mp4"):
        assert known[name]["state"] == "present" and known[name]["status"] == "pending"
        assert svc.get(f"/api/v1/files/{known[name]['file_uuid']}")["duration"] is None

    still_open.write(data[len(data) // 2 :])
    still_open.close()
    finished = wait_for(lambda: files(svc).get("open.mp4"))
    assert finished["size"] == len(data)
    # Closed by its writer, who may add a part yet: its job waits for settle_seconds of
    # quiet, until the upload hook says the upload is done.
    (held,) = jobs_of(svc, finished["file_uuid"])
    assert held["not_before"] is not None
    svc.call("POST", "/api/v1/files/register", expect=200, json={"path": "open.mp4"})
    assert svc.job(held["task_id"])["not_before"] is None
    svc.call("POST", "/api/v1/queue/resume")
    wait_for(lambda: svc.status()["pending_count"] == 0 and svc.status()["active_count"] == 0)
    known = files(svc)
    for name in (*drops, "open.mp4"):
        assert known[name]["state"] == "present" and known[name]["status"] == "completed"
    detail = svc.get(f"/api/v1/files/{known['clip 099.mp4']['file_uuid']}")
    assert detail["duration"] == pytest.approx(103 / 25, abs=0.05), "probed at its job's start"
    assert_rejected_and_not_processed(svc, known["cut short.mp4"], bad["cut short.mp4"])
    assert set(jobs_per_file(svc).values()) == {1}, "each queued once"
    assert svc.get("/api/v1/jobs")["total"] == len(drops) + 2
    assert rescan(svc)["unchanged"] == len(drops) + 2


def test_files_dropped_while_stopped_are_queued_at_next_start_and_once(
    start_service, videos
) -> None:
    svc = drop_service(start_service)
    copy_in(videos[0], svc.drop / "before.mp4")
    wait_for(lambda: svc.get("/api/v1/jobs")["total"] == 1)
    svc.stop()

    names = [
        "nested/deeper/still/ünïcødé clip — 東京.mp4",
        "with  two  spaces .mov",
        "L" * 240 + ".mp4",  # near the 255-byte name limit
        "LOUD.MP4",
    ]
    for i, name in enumerate(names, start=1):
        copy_in(videos[i], svc.drop / name)
    svc.start()

    wait_for(lambda: svc.get("/api/v1/jobs")["total"] == 5, timeout=30)
    known = files(svc)
    assert sorted(known) == sorted(["before.mp4", *names])
    for name in names:
        assert known[name]["file_name"] == PurePath(name).name
        (job,) = jobs_of(svc, known[name]["file_uuid"])
        svc.wait_status(job["task_id"], "completed")

    for _ in range(2):
        svc.restart()
        assert rescan(svc)["unchanged"] == 5
        assert set(jobs_per_file(svc).values()) == {1}


def test_old_files_found_by_a_rescan_are_queued_and_the_bad_ones_rejected(
    start_service, videos, tmp_path
) -> None:
    # Written long ago and found by the start-up rescan (e.g. a drop while the service
    # was stopped): known to be whole, so taken in batches like closed files.
    svc = drop_service(start_service)
    svc.stop()
    old = time.time() - 3600
    reasons = bad_files(tmp_path / "bad")
    for i in range(5):
        link_in(videos[30 + i], svc.drop / "archive" / f"take {i}.mp4", mtime=old)
    for name in reasons:
        link_in(tmp_path / "bad" / name, svc.drop / "archive" / name, mtime=old)
    svc.start()

    wait_for(lambda: len(files(svc)) == 5 + len(reasons))
    wait_for(lambda: svc.status()["pending_count"] == 0 and svc.status()["active_count"] == 0)
    known = files(svc)
    for i in range(5):
        record = known[f"archive/take {i}.mp4"]
        assert record["state"] == "present" and record["status"] == "completed", record
        assert svc.get(f"/api/v1/files/{record['file_uuid']}")["video_codec"] == "h264"
    for name, words in reasons.items():
        assert_rejected_and_not_processed(svc, known[f"archive/{name}"], words)
    assert rescan(svc)["unchanged"] == 5 + len(reasons)


def test_reconcile_new_changed_missing_and_unchanged(start_service, videos) -> None:
    # A long settle time, and files linked in rather than written or renamed there (a file
    # closed or renamed into place is taken at once), keep the watcher out of the way: the
    # rescan does the work.
    svc = drop_service(start_service, settle_seconds=60)
    old = time.time() - 3600
    for i, name in enumerate(("keep.mp4", "edit.mp4", "delete.mp4", "touch.mp4")):
        link_in(videos[i], svc.drop / name, mtime=old)
    link_in(videos[10], svc.drop / "fresh.mp4")  # just written: left to the settle tracker
    assert rescan(svc) == {
        "new": 4,
        "changed": 0,
        "missing": 0,
        "unchanged": 0,
        "settling": 1,
        "ignored": 0,
    }
    before = files(svc)
    assert "fresh.mp4" not in before
    for record in before.values():
        (job,) = jobs_of(svc, record["file_uuid"])
        svc.wait_status(job["task_id"], "completed")

    shutil.copyfile(videos[20], svc.drop / "edit.mp4")  # changed in place after processing
    os.utime(svc.drop / "edit.mp4", (old + 60, old + 60))
    os.utime(svc.drop / "touch.mp4", (old + 60, old + 60))  # same content, new mtime
    (svc.drop / "delete.mp4").unlink()
    counts = rescan(svc)
    # The watcher may have marked the deleted file missing first; either way it is missing.
    assert counts["new"] == 0 and counts["missing"] in (0, 1) and counts["settling"] == 1
    assert counts["changed"] + counts["unchanged"] == 3
    after = files(svc)
    assert after["delete.mp4"]["state"] == "missing"

    edited = jobs_of(svc, after["edit.mp4"]["file_uuid"])
    assert len(edited) == 2, "a file changed in place after processing gets a new job"
    assert after["edit.mp4"]["file_uuid"] == before["edit.mp4"]["file_uuid"], "same path, same id"
    detail = svc.get(f"/api/v1/files/{after['edit.mp4']['file_uuid']}")
    assert detail["size"] == videos[20].stat().st_size
    assert len(jobs_of(svc, after["touch.mp4"]["file_uuid"])) == 1, "a touch is not new content"
    assert len(jobs_of(svc, after["keep.mp4"]["file_uuid"])) == 1

    # Put back with the same content, a processed file is present again and not re-run.
    link_in(videos[2], svc.drop / "delete.mp4", mtime=old)
    assert rescan(svc)["changed"] == 1
    back = files(svc)["delete.mp4"]
    assert back["state"] == "present" and back["status"] == "completed"
    assert len(jobs_of(svc, back["file_uuid"])) == 1


def test_new_content_of_the_same_size_and_mtime_is_new_and_a_chmod_or_restart_is_not(
    start_service, videos, tmp_path
) -> None:
    svc = drop_service(start_service)
    base = videos[0].read_bytes()
    # Three versions of one clip, alike in size; each its own content (a tail players skip).
    versions = []
    for tail in (b"first", b"fixed", b"again"):
        version = tmp_path / f"{tail.decode()}.mp4"
        version.write_bytes(base + tail)
        os.utime(version, (1_700_000_000, 1_700_000_000))  # one mtime, kept on upload
        versions.append(version)
    clip = svc.drop / "clip.mp4"

    def uploaded(count: int) -> list[dict]:
        """The clip's jobs once it has ``count``; each run to the end."""
        found = wait_for(lambda: len(j := jobs_of(svc, record["file_uuid"])) == count and j)
        return [svc.wait_status(job["task_id"], "completed") for job in found]

    shutil.copy2(versions[0], svc.root / "staging.mp4")
    os.replace(svc.root / "staging.mp4", clip)
    record = wait_for(lambda: files(svc).get("clip.mp4"))
    first = svc.get(f"/api/v1/files/{record['file_uuid']}")["fingerprint"]
    uploaded(1)

    # rsync -t, or an SFTP server's atomic upload of `put -p`: renamed over it, times kept.
    shutil.copy2(versions[1], svc.root / "staging.mp4")
    os.replace(svc.root / "staging.mp4", clip)
    uploaded(2)
    assert svc.get(f"/api/v1/files/{record['file_uuid']}")["fingerprint"] != first

    # Rewritten in place, times put back (`sftp put -p`, `cp -p`), while the service was down.
    svc.stop()
    with clip.open("r+b") as f:
        f.write(versions[2].read_bytes())
    os.utime(clip, (1_700_000_000, 1_700_000_000))
    svc.start()
    uploaded(3)

    # Not new content: a chmod, an access time set, a restart, rescans.
    clip.chmod(0o600)
    os.utime(clip, ns=(time.time_ns(), clip.stat().st_mtime_ns))  # touch -a
    svc.restart()
    for _ in range(2):
        counts = rescan(svc)
        assert (counts["new"], counts["changed"], counts["unchanged"]) == (0, 0, 1), counts
    # A copy of what it holds put in its place, times kept (a backup restored): the same.
    shutil.copy2(clip, svc.root / "staging.mp4")
    os.replace(svc.root / "staging.mp4", clip)
    assert rescan(svc) == {
        "new": 0,
        "changed": 0,
        "missing": 0,
        "unchanged": 1,
        "settling": 0,
        "ignored": 0,
    }
    assert len(jobs_of(svc, record["file_uuid"])) == 3


# -- bad files --------------------------------------------------------------------------------


def test_bad_files_are_rejected_with_reasons_and_a_good_file_after_them_is_processed(
    start_service, videos
) -> None:
    svc = drop_service(start_service)
    # Made elsewhere, then copied in one go, as an upload would arrive.
    reasons = bad_files(svc.root / "staging")
    for name in reasons:
        copy_in(svc.root / "staging" / name, svc.drop / name)
    copy_in(videos[0], svc.drop / "good.mp4")

    good = wait_for(lambda: files(svc).get("good.mp4"))
    (job,) = jobs_of(svc, good["file_uuid"])
    svc.wait_status(job["task_id"], "completed")
    wait_for(lambda: len(files(svc)) == len(reasons) + 1)
    for name, words in reasons.items():
        assert_rejected_and_not_processed(svc, wait_for(lambda n=name: _rejected(svc, n)), words)
    assert svc.get("/healthz")["status"] == "ok"

    # Linked in (neither closed nor renamed there) and old: probed before it is queued; no job.
    link_in(svc.root / "staging" / "notes.mp4", svc.drop / "linked.mp4", mtime=time.time() - 3600)
    linked = wait_for(lambda: files(svc).get("linked.mp4"))
    assert linked["state"] == "rejected" and linked["status"] is None, linked
    # Written again with the same content: its verdict stands, nothing is queued again.
    before = svc.get("/api/v1/jobs")["total"]
    copy_in(svc.root / "staging" / "notes.mp4", svc.drop / "notes.mp4")
    copy_in(videos[1], svc.drop / "after.mp4")  # taken after it: the watcher got that far
    wait_for(lambda: files(svc).get("after.mp4"))
    assert files(svc)["notes.mp4"]["state"] == "rejected"
    assert svc.get("/api/v1/jobs")["total"] == before + 1
    detail = svc.get(f"/api/v1/files/{good['file_uuid']}")
    assert (detail["width"], detail["height"], detail["fps"]) == (64, 48, 25.0)
    assert detail["video_codec"] == "h264" and detail["audio_codec"] is None
    assert detail["duration"] > 0 and detail["fingerprint"].startswith(f"{detail['size']}:")


# -- the upload hook -----------------------------------------------------------------------------


def test_register_refuses_escapes_and_temp_names_and_is_idempotent(start_service, videos) -> None:
    # A long settle time: only the hook registers anything in this test.
    svc = drop_service(start_service, settle_seconds=60)
    outside = copy_in(videos[0], svc.root / "outside" / "secret.mp4")
    (svc.drop / "escape.mp4").symlink_to(outside)
    (svc.drop / "escape dir").symlink_to(outside.parent, target_is_directory=True)
    (svc.drop / "sub").mkdir()
    for path in (
        "escape.mp4",
        str(svc.drop / "escape.mp4"),
        "escape dir/secret.mp4",
        "../outside/secret.mp4",
        "sub/../../outside/secret.mp4",
        str(outside),
        "/etc/passwd",
    ):
        reply = svc.client.post("/api/v1/files/register", json={"path": path})
        assert reply.status_code == 400, (path, reply.text)
        assert "not inside a watched folder" in reply.json()["error"]["message"]
    os.utime(outside, (time.time() - 3600,) * 2)
    assert rescan(svc)["new"] == 0, "a rescan does not follow symlinks out either"

    link_in(videos[1], svc.drop / "clip.mp4")
    first = svc.call("POST", "/api/v1/files/register", expect=201, json={"path": "clip.mp4"})
    assert first["state"] == "present" and first["task_id"]
    again = svc.call("POST", "/api/v1/files/register", expect=200, json={"path": "clip.mp4"})
    assert (again["file_uuid"], again["task_id"]) == (first["file_uuid"], first["task_id"])
    svc.wait_status(first["task_id"], "completed")
    # Unchanged and already processed: still the same record and the same job.
    body = {"path": str(svc.drop / "clip.mp4")}
    later = svc.call("POST", "/api/v1/files/register", expect=200, json=body)
    assert later["task_id"] == first["task_id"] and later["deduplicated"] is True
    (svc.drop / "alias.mp4").symlink_to(svc.drop / "clip.mp4")
    alias = svc.call("POST", "/api/v1/files/register", expect=200, json={"path": "alias.mp4"})
    assert alias["file_uuid"] == first["file_uuid"], "a symlink inside resolves to its target"
    assert svc.get("/api/v1/jobs")["total"] == 1 and len(files(svc)) == 1

    copy_in(videos[2], svc.drop / "upload.mp4.part")
    reply = svc.client.post("/api/v1/files/register", json={"path": "upload.mp4.part"})
    assert reply.status_code == 400 and "temporary or partial" in reply.text

    # An aborted upload: recorded as rejected with the reason; no job.
    data = videos[3].read_bytes()
    half = svc.root / "half.mp4"
    half.write_bytes(data[: len(data) // 2])
    link_in(half, svc.drop / "aborted.mp4", mtime=time.time() - 3600)  # old enough to rescan
    body = {"path": "aborted.mp4", "upload_status": 0}
    aborted = svc.call("POST", "/api/v1/files/register", expect=201, json=body)
    assert aborted["state"] == "rejected" and aborted["task_id"] is None
    assert "upload did not finish" in aborted["reason"]
    # The hook's verdict stands until the file changes; a rescan does not overrule it.
    assert rescan(svc)["unchanged"] == 2
    assert "upload did not finish" in files(svc)["aborted.mp4"]["reason"]
    # The client resumes and finishes; the hook reports success.
    whole = svc.root / "whole.mp4"
    whole.write_bytes(data)
    link_in(whole, svc.drop / "aborted.mp4")
    done = svc.call("POST", "/api/v1/files/register", expect=201, json={"path": "aborted.mp4"})
    assert done["file_uuid"] == aborted["file_uuid"]
    assert done["state"] == "present" and done["task_id"]
    assert svc.get("/api/v1/jobs")["total"] == 2


def test_register_answers_with_the_probe_for_a_file_the_watcher_queued_unprobed(
    start_service, videos, tmp_path
) -> None:
    svc = drop_service(start_service)
    svc.call("POST", "/api/v1/queue/pause")  # the jobs wait: their files stay unprobed
    reasons = bad_files(tmp_path / "bad")
    copy_in(videos[5], svc.drop / "good.mp4")
    copy_in(tmp_path / "bad" / "notes.mp4", svc.drop / "notes.mp4")
    known = wait_for(lambda: len(f := files(svc)) == 2 and f)
    for record in known.values():
        assert record["state"] == "present" and record["status"] == "pending", record
        assert svc.get(f"/api/v1/files/{record['file_uuid']}")["duration"] is None

    body = {"path": "good.mp4"}
    good = svc.call("POST", "/api/v1/files/register", expect=200, json=body)
    (queued,) = jobs_of(svc, good["file_uuid"])
    assert good["state"] == "present" and good["task_id"] == queued["task_id"]
    detail = svc.get(f"/api/v1/files/{good['file_uuid']}")
    assert detail["duration"] == pytest.approx(9 / 25, abs=0.05), "probed for the answer"
    bad = svc.call("POST", "/api/v1/files/register", expect=201, json={"path": "notes.mp4"})
    assert bad["state"] == "rejected" and bad["task_id"] is None
    assert reasons["notes.mp4"] in bad["reason"]

    svc.call("POST", "/api/v1/queue/resume")
    svc.wait_status(good["task_id"], "completed")
    assert_rejected_and_not_processed(svc, files(svc)["notes.mp4"], reasons["notes.mp4"])


# -- identity and dedup ------------------------------------------------------------------------


def test_same_content_under_another_name_skips_as_duplicate_and_links_results(
    start_service, videos
) -> None:
    svc = drop_service(start_service, processors=["cut"])
    copy_in(videos[100], svc.drop / "original.mp4")
    original = wait_for(lambda: files(svc).get("original.mp4"))
    (first,) = jobs_of(svc, original["file_uuid"])
    svc.wait_status(first["task_id"], "completed")

    copy_in(videos[100], svc.drop / "copies" / "same again.mp4")
    copy = wait_for(lambda: files(svc).get("copies/same again.mp4"))
    assert copy["file_uuid"] != original["file_uuid"]
    (second,) = jobs_of(svc, copy["file_uuid"])
    second = svc.wait_status(second["task_id"], "completed")
    cut = second["processors"]["cut"]
    assert cut["status"] == "skipped"
    assert cut["reason"] == f"duplicate of {original['file_uuid']}"
    linked = svc.get(f"/api/v1/files/{copy['file_uuid']}/results/cut")
    assert linked == svc.get(f"/api/v1/files/{original['file_uuid']}/results/cut")
    assert linked["status"] == "completed" and linked["result"]["scenes"]
    thumbnail = f"/api/v1/files/{copy['file_uuid']}/thumbnails/0"
    picture = svc.client.get(thumbnail).content
    assert picture.startswith(b"\xff\xd8")  # a JPEG

    # The original replaced by other content and scanned again: the copy keeps the
    # results of its own content.
    copy_in(videos[150], svc.drop / "original.mp4")
    wait_for(lambda: len(jobs_of(svc, original["file_uuid"])) == 2)
    rescanned = jobs_of(svc, original["file_uuid"])[-1]
    svc.wait_status(rescanned["task_id"], "completed")
    now = svc.get(f"/api/v1/files/{original['file_uuid']}/results/cut")
    assert now["fingerprint"] != linked["fingerprint"]
    assert svc.get(f"/api/v1/files/{copy['file_uuid']}/results/cut") == linked
    assert svc.client.get(thumbnail).content == picture

    # force: run it anyway.
    forced = svc.call(
        "POST", f"/api/v1/file/{copy['file_uuid']}/deep-scan", expect=202, json={"force": True}
    )
    forced = svc.wait_status(forced["task_id"], "completed")
    assert forced["processors"]["cut"]["status"] == "completed"
    own = svc.get(f"/api/v1/files/{copy['file_uuid']}/results/cut")
    assert own["file_uuid"] == copy["file_uuid"] and own["result"] == linked["result"]


def test_a_hard_link_to_a_file_done_is_a_duplicate_of_it(start_service, videos) -> None:
    # Filing material into folders with `ln`: the new name is a file of its own whose
    # content was processed already. (The link moves the first name's ctime, and no
    # event says so.)
    svc = start_service(
        ingest=INGEST | {"processors": ["steps"]},
        **{"processors.steps": {"steps": 5, "step_seconds": 0.01}},
    )
    original = copy_in(videos[0], svc.drop / "original.mp4")
    first = wait_for(lambda: files(svc).get("original.mp4"))
    (job,) = jobs_of(svc, first["file_uuid"])
    svc.wait_status(job["task_id"], "completed")
    (svc.drop / "filed").mkdir()
    os.link(original, svc.drop / "filed" / "original.mp4")
    link = wait_for(lambda: files(svc).get("filed/original.mp4"))
    (job,) = jobs_of(svc, link["file_uuid"])
    steps = svc.wait_status(job["task_id"], "completed")["processors"]["steps"]
    assert steps["status"] == "skipped", steps
    assert steps["reason"] == f"duplicate of {first['file_uuid']}"
    log = svc.data_dir / "results" / first["file_uuid"] / "steps.log"
    assert log.read_text().split() == [str(step) for step in range(5)], "ran once"


def test_copies_dropped_together_are_processed_once(start_service, videos) -> None:
    svc = start_service(
        ingest=INGEST | {"processors": ["steps"]},
        queue={"max_concurrent": 2},
        **{"processors.steps": {"steps": 20, "step_seconds": 0.1}},
    )
    staged = [copy_in(videos[0], svc.root / f"staging-{i}.mp4") for i in range(2)]
    for i, path in enumerate(staged):  # both arrive whole at once: they settle together
        os.replace(path, svc.drop / f"copy {i}.mp4")
    records = wait_for(lambda: len(found := files(svc)) == 2 and found)
    done = {}
    for record in records.values():
        (job,) = jobs_of(svc, record["file_uuid"])
        job = svc.wait_status(job["task_id"], "completed", timeout=60)
        assert job["error_message"] is None  # no word left of the wait
        done[record["file_uuid"]] = job["processors"]["steps"]

    ran = [uuid for uuid, steps in done.items() if steps["status"] == "completed"]
    assert len(ran) == 1, done
    (copy,) = set(done) - set(ran)
    assert done[copy]["status"] == "skipped"
    assert done[copy]["reason"] == f"duplicate of {ran[0]}"
    linked = svc.get(f"/api/v1/files/{copy}/results/steps")
    assert linked == svc.get(f"/api/v1/files/{ran[0]}/results/steps")
    log = svc.data_dir / "results" / ran[0] / "steps.log"
    assert log.read_text().split() == [str(step) for step in range(20)]
    # The copy's steps never ran: what it has is the original's log, linked.
    assert (svc.data_dir / "results" / copy / "steps.log").samefile(log)


def test_a_file_deleted_or_replaced_during_processing_fails_its_job_and_nothing_else(
    start_service, videos
) -> None:
    svc = start_service(
        ingest=INGEST | {"processors": ["steps"]},
        queue={"max_concurrent": 3},
        **{"processors.steps": {"steps": 60, "step_seconds": 0.1}},
    )
    for i, name in enumerate(("doomed.mp4", "replaced.mp4", "bystander.mp4")):
        copy_in(videos[i], svc.drop / name)

    def running(name: str) -> dict | None:
        record = files(svc).get(name)
        found = jobs_of(svc, record["file_uuid"]) if record else []
        steps = found[0]["processors"]["steps"] if found else {}
        return found[0] if steps.get("current", 0) >= 3 else None

    doomed = wait_for(lambda: running("doomed.mp4"))
    replaced = wait_for(lambda: running("replaced.mp4"))
    (svc.drop / "doomed.mp4").unlink()
    new_content = copy_in(videos[50], svc.root / "staging.mp4")
    os.replace(new_content, svc.drop / "replaced.mp4")

    doomed = svc.wait_status(doomed["task_id"], "failed")
    assert "deleted" in doomed["processors"]["steps"]["error"]
    assert doomed["processors"]["steps"]["attempts"] == 1, "not retried: it cannot get better"
    replaced = svc.wait_status(replaced["task_id"], "failed")
    assert "replaced or changed during processing" in replaced["processors"]["steps"]["error"]

    # The new content is the new upload: it gets its own job, which runs.
    record = files(svc)["replaced.mp4"]
    newer = wait_for(lambda: len(j := jobs_of(svc, record["file_uuid"])) == 2 and j[1])
    svc.wait_status(newer["task_id"], "completed")
    assert svc.get(f"/api/v1/files/{record['file_uuid']}")["size"] == videos[50].stat().st_size
    bystander = jobs_of(svc, files(svc)["bystander.mp4"]["file_uuid"])
    assert [svc.wait_status(j["task_id"], "completed")["status"] for j in bystander] == [
        "completed"
    ]
    assert files(svc)["doomed.mp4"]["state"] == "missing"


# The finish is held with a row lock: PostgreSQL's (SQLite has only its one write lock).
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_new_content_registered_between_a_jobs_last_look_and_its_finish_is_queued(
    start_service, database_url, videos, tmp_path
) -> None:
    hold = tmp_path / "quiet.hold"
    hold.touch()
    svc = start_service(
        service={"plugins": ["workloads:Quiet"]},
        ingest=INGEST | {"processors": ["quiet"]},
        **{"processors.quiet": {"hold_while_exists": str(hold)}},
    )
    copy_in(videos[0], svc.drop / "clip.mp4")
    record = wait_for(lambda: files(svc).get("clip.mp4"))
    (old,) = jobs_of(svc, record["file_uuid"])
    wait_for(lambda: svc.job(old["task_id"])["processors"]["quiet"]["status"] == "running")

    with psycopg.connect(database_url) as lock, psycopg.connect(database_url) as look:
        lock.execute("SELECT 1 FROM job WHERE task_id = %s FOR UPDATE", (old["task_id"],))

        def finish_waits() -> bool:
            # Any session of this database waiting for a lock: the finish may wait behind the
            # heartbeat's lease renewal, which then, not this lock, is what blocks it.
            waiting = look.execute(
                "SELECT query FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchall()
            look.rollback()  # a fresh snapshot each time
            return any("FOR UPDATE" in q and "SKIP" not in q for (q,) in waiting)

        hold.unlink()  # its run ends on the old content; its finish waits for the lock
        wait_for(finish_waits)
        # Replaced now: the registration finds the job still running and joins it.
        os.replace(copy_in(videos[1], svc.root / "staging.mp4"), svc.drop / "clip.mp4")
        size = videos[1].stat().st_size
        wait_for(lambda: files(svc)["clip.mp4"]["size"] == size)
        lock.rollback()

    assert svc.wait_status(old["task_id"], "completed")["processors"]["quiet"]["attempts"] == 1
    # The new content is queued all the same, and runs.
    newer = wait_for(lambda: len(j := jobs_of(svc, record["file_uuid"])) == 2 and j[1])
    svc.wait_status(newer["task_id"], "completed")


def _rejected(svc: ServiceProcess, name: str) -> dict | None:
    record = files(svc).get(name)
    return record if record and record["state"] == "rejected" else None


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
