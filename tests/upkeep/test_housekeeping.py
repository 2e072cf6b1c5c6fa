"""The retention sweep removes only what finished longer ago than the retention, and the
temp files a crash left behind, only ours and only once no writer can still place them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import wait_for

from momentry_edge import jobs, outputs, store, weights
from momentry_edge.store import FileState, Job, JobStatus, MediaFile
from momentry_edge.upkeep import backup, housekeeping

DAY = 86400.0


def make_file(name: str) -> MediaFile:
    return MediaFile.create(
        file_uuid=name.ljust(32, "0"),
        path=f"/drop/{name}",
        watch_root="/drop",
        rel_path=name,
        name=name,
    )


def test_sweep_keeps_recent_and_active_work(tmp_path, database_url):
    data = tmp_path / "data"
    store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    done_file, waiting_file = make_file("aa"), make_file("bb")
    finished, _ = jobs.submit(done_file, ["noop"], max_retries=0)
    waiting, _ = jobs.submit(waiting_file, ["noop"], max_retries=0)
    jobs.cancel(finished)
    # Gone from the drop folder: results of a file still there are kept (the next test).
    MediaFile.update(state=FileState.MISSING).where(MediaFile.id == done_file.id).execute()
    for record in (done_file, waiting_file):
        (data / "results" / record.file_uuid).mkdir(parents=True)
        (data / "results" / record.file_uuid / "noop.json").write_text("{}")
    (data / "logs").mkdir(parents=True)
    (data / "logs" / "momentry-edge.log").write_text("current\n")
    (data / "logs" / "momentry-edge.log.1").write_text("rotated\n")

    counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 29 * DAY)
    nothing = {"jobs": 0, "files": 0, "results": 0, "logs": 0, "temp_files": 0, "backups": 0}
    assert counts == nothing, "nothing is past retention yet"

    counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 31 * DAY)
    # The file gone from disk goes too, once its last job has.
    assert counts == {"jobs": 1, "files": 1, "results": 1, "logs": 1, "temp_files": 0, "backups": 0}
    assert Job.get_or_none(Job.id == finished.id) is None
    assert Job.get_by_id(waiting.id).status == JobStatus.PENDING, "active jobs are never swept"
    assert not (data / "results" / done_file.file_uuid).exists()
    assert (data / "results" / waiting_file.file_uuid / "noop.json").exists()
    assert (data / "logs" / "momentry-edge.log").exists(), "the live log stays"
    assert sorted(os.listdir(data / "logs")) == ["momentry-edge.log"]
    store.Job._meta.database.close()


def test_sweep_removes_the_records_of_files_gone_from_disk_once_their_jobs_are_gone(
    tmp_path, database_url
):
    # A drop folder emptied after processing left a record per upload for good: read by
    # every rescan and listed by /api/v1/files, long after retention took their jobs.
    data = tmp_path / "data"
    store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    gone, waiting, lately, never_queued, _on_disk = map(make_file, ("g1", "g2", "g3", "g4", "p1"))
    finished, _ = jobs.submit(gone, ["noop"], max_retries=0)
    jobs.cancel(finished)
    jobs.submit(waiting, ["noop"], max_retries=0)
    now = time.time()
    missing = {"state": FileState.MISSING, "reason": "gone from disk"}
    ids = [gone.id, waiting.id, never_queued.id]
    MediaFile.update(missing, updated_at=now).where(MediaFile.id.in_(ids)).execute()
    MediaFile.update(missing, updated_at=now + 20 * DAY).where(MediaFile.id == lately.id).execute()

    counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=now + 31 * DAY)
    assert (counts["jobs"], counts["files"]) == (1, 2)
    # Kept: one with a job still waiting, one gone only lately, and one still on disk.
    assert sorted(f.name for f in MediaFile.select()) == ["g2", "g3", "p1"]
    store.Job._meta.database.close()


def test_sweep_keeps_the_results_of_a_file_still_in_the_drop_folder(tmp_path, database_url):
    # Swept, the file would stay known with no results, and nothing would make them again.
    data = tmp_path / "data"
    store.connect(database_url, data)
    jobs.init_queue_state(2, False)
    present, gone = make_file("pr"), make_file("go")
    for record in (present, gone):
        older, _ = jobs.submit(record, ["noop"], max_retries=0)
        jobs.cancel(older)
        newest, _ = jobs.submit(record, ["noop"], max_retries=0)
        jobs.cancel(newest)
        (data / "results" / record.file_uuid).mkdir(parents=True)
        (data / "results" / record.file_uuid / "noop.json").write_text("{}")
    MediaFile.update(state=FileState.MISSING).where(MediaFile.id == gone.id).execute()

    counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 31 * DAY)
    assert (counts["jobs"], counts["results"]) == (3, 1)
    assert (data / "results" / present.file_uuid / "noop.json").exists()
    assert not (data / "results" / gone.file_uuid).exists()
    kept = [job.id for job in Job.select()]
    assert kept == [newest_job.id for newest_job in [_newest(present)]], "its newest job stays"
    store.Job._meta.database.close()


def _newest(record: MediaFile) -> Job:
    return Job.select().where(Job.file == record.id).order_by(Job.id.desc()).get()


# -- the temp files a crash left ---------------------------------------------------------------

OLD = time.time() - 2 * DAY  # older than housekeeping.TEMP_FILE_AGE


def leftover(path: Path, when: float = OLD) -> Path:
    """A temp file of ``path`` as outputs.py writes it (``.<name>.<hex>``), never placed."""
    fd, tmp, _ = outputs._temp_file(path)
    os.write(fd, b"{}\n")
    os.close(fd)
    os.utime(tmp, (when, when))
    return Path(tmp)


def aged(path: Path, when: float = OLD) -> Path:
    if not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    os.utime(path, (when, when), follow_symlinks=False)
    return path


def test_sweep_removes_old_temp_files_and_only_ours(tmp_path):
    data = tmp_path / "data"
    folder = outputs.results_dir(data, "a" * 32)
    debris = [
        leftover(outputs.document_path(folder, "asr")),
        leftover(folder / "asr.srt"),
        aged(folder / ".cut.thumbnails.work" / ".0000000042.jpg.tmp"),
        aged(data / "models" / "whisper-base" / f"{weights.RECORD}.tmp"),
    ]
    link = folder / f".asr.json.{os.getpid()}.link"  # as outputs._link_outputs makes it
    link.symlink_to("asr.json")
    debris.append(aged(link))
    fresh = leftover(outputs.document_path(folder, "cut"), when=time.time() - 3600)
    kept = [
        aged(folder / "asr.json"),
        aged(folder / ".notes.txt"),
        aged(folder / ".DS_Store"),
        aged(folder / ".asr.json.12345"),  # too few digits
        aged(folder / ".asr.json.0123456789abc"),  # too many
        aged(folder / ".asr.json.0123456789AB"),  # not as _temp_file spells them
        aged(folder / "asr.json.0123456789ab"),  # not hidden
        aged(folder / ".asr.json.tmp"),
        aged(folder / ".cut.thumbnails.work" / "0000000042.jpg"),
        aged(data / "models" / "whisper-base" / ".partial" / "model.bin.part"),  # resumed
        aged(data / "models" / "whisper-base" / ".asr.json.0123456789ab"),  # not in results
        aged(data / "logs" / ".momentry-edge.log.0123456789ab"),
    ]
    (folder / ".x.json.0123456789ab").mkdir()  # a folder: not ours

    counts = housekeeping.sweep(data, retention_seconds=None)
    assert counts == {
        **{"jobs": 0, "files": 0, "results": 0, "logs": 0},
        **{"temp_files": len(debris), "backups": 0},
    }
    assert not [p for p in debris if p.exists() or p.is_symlink()]
    assert fresh.exists(), "a temp file younger than a day may still be placed"
    assert [p for p in kept if p.exists()] == kept
    assert (folder / ".x.json.0123456789ab").is_dir()
    assert housekeeping.sweep(data, retention_seconds=None)["temp_files"] == 0


def test_sweep_removes_work_folders_a_crash_left_with_all_in_them(tmp_path):
    data = tmp_path / "data"
    folder = outputs.results_dir(data, "a" * 32)
    outside = aged(tmp_path / "outside" / "0000000001.jpg")
    left = [folder / f".cut.thumbnails.{kind}" for kind in ("work", "new", "old")]
    for work in left:
        for n in range(3):
            aged(work / f"{n:010d}.jpg")
        os.utime(work, (OLD, OLD))
    running = aged(outputs.results_dir(data, "b" * 32) / ".cut.thumbnails.work" / "0.jpg")
    linked = folder / ".asr.notes.work"  # a link named like one: removed as a link at most
    linked.symlink_to(outside.parent, target_is_directory=True)

    counts = housekeeping.sweep(data, retention_seconds=None)
    assert counts["temp_files"] == 9
    assert not [work for work in left if work.exists()]
    assert running.exists(), "a folder a run still adds to is kept"
    assert outside.exists() and linked.is_symlink()


def test_sweep_removes_links_named_like_temp_files_and_never_follows_them(tmp_path):
    data = tmp_path / "data"
    folder = outputs.results_dir(data, "a" * 32)
    outside = tmp_path / "outside"
    target = aged(outside / "notes.json")
    inner = aged(outside / "elsewhere" / ".asr.json.0123456789ab")
    to_file = folder / ".asr.json.0123456789ab"
    to_folder = outputs.results_dir(data, "b" * 32)  # a results folder that is a link
    folder.mkdir(parents=True)
    to_file.symlink_to(target)
    to_folder.symlink_to(outside / "elsewhere", target_is_directory=True)
    aged(to_file)

    counts = housekeeping.sweep(data, retention_seconds=None)
    assert counts["temp_files"] == 1
    assert not to_file.is_symlink(), "the link goes"
    assert target.read_text() == "x", "its target stays"
    assert to_folder.is_symlink() and inner.exists(), "a linked folder is not looked into"


def test_a_temp_file_that_cannot_be_removed_is_logged_and_the_sweep_goes_on(tmp_path, unprivileged):
    data = tmp_path / "data"
    locked = outputs.results_dir(data, "a" * 32)
    unreadable = outputs.results_dir(data, "b" * 32)
    stuck = leftover(outputs.document_path(locked, "asr"))
    hidden = leftover(outputs.document_path(unreadable, "asr"))
    gone = leftover(outputs.document_path(outputs.results_dir(data, "c" * 32), "asr"))
    locked.chmod(0o555)
    unreadable.chmod(0)
    try:
        swept = subprocess.run(
            [
                *unprivileged,
                sys.executable,
                "-c",
                "import sys; from pathlib import Path;"
                " from momentry_edge.upkeep import housekeeping;"
                " print(housekeeping.sweep(Path(sys.argv[1]), None)['temp_files'])",
                str(data),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        locked.chmod(0o750)
        unreadable.chmod(0o750)
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip() == "1"
    assert not gone.exists()
    assert stuck.exists() and hidden.exists()
    assert f"cannot remove {stuck}" in swept.stderr
    assert f"cannot read {unreadable}" in swept.stderr


def test_a_service_start_removes_what_a_crash_left_also_keeping_all_results(
    start_service, tmp_path
):
    folder = outputs.results_dir(tmp_path / "node" / "data", "a" * 32)
    debris = leftover(outputs.document_path(folder, "asr"))
    document = aged(outputs.document_path(folder, "asr"))
    notes = aged(folder / ".notes.txt")

    svc = start_service(service={"retention_days": 0})  # keep all results
    wait_for(lambda: not debris.exists())
    assert document.exists() and notes.exists()
    assert "0 result folders, 0 log files, 1 temp files" in svc.log()


def test_sweep_removes_unfinished_backups_no_backup_is_writing(tmp_path):
    data = tmp_path / "data"
    folder = backup.backups_dir(data)
    left = aged(folder / "20260101T000000Z.partial" / "momentry.db").parent
    aged(left / "manifest.json")  # cut off between its manifest and its rename
    complete = aged(folder / "20260101T000100Z" / "manifest.json").parent
    early = aged(folder / "mine.partial" / "momentry.db").parent  # cut off before its manifest
    (folder / "not-a-folder.partial").write_text("x")
    writing = backup._claim(folder / "20260102T000000Z.partial")  # a backup writing now
    try:
        counts = housekeeping.sweep(data, retention_seconds=None)
        assert counts["backups"] == 2
        assert not left.exists() and not early.exists()
        assert (folder / "20260102T000000Z.partial").is_dir(), "a backup under way stays"
        assert complete.is_dir() and (folder / "not-a-folder.partial").is_file()
    finally:
        os.close(writing)
    assert housekeeping.sweep(data, retention_seconds=None)["backups"] == 1
    assert sorted(p.name for p in folder.iterdir()) == [complete.name, "not-a-folder.partial"]
