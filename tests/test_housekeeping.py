"""The retention sweep removes only what finished longer ago than the retention."""

from __future__ import annotations

import os
import time

from momentry_edge import db, housekeeping, jobs
from momentry_edge.db import Job, JobStatus, MediaFile

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
    db.connect(database_url, data)
    jobs.init_queue_state(2, False)
    done_file, waiting_file = make_file("aa"), make_file("bb")
    finished, _ = jobs.submit(done_file, ["noop"], max_retries=0)
    waiting, _ = jobs.submit(waiting_file, ["noop"], max_retries=0)
    jobs.cancel(finished)
    for record in (done_file, waiting_file):
        (data / "results" / record.file_uuid).mkdir(parents=True)
        (data / "results" / record.file_uuid / "noop.json").write_text("{}")
    (data / "logs").mkdir(parents=True)
    (data / "logs" / "momentry-edge.log").write_text("current\n")
    (data / "logs" / "momentry-edge.log.1").write_text("rotated\n")

    counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 29 * DAY)
    assert counts == {"jobs": 0, "results": 0, "logs": 0}, "nothing is past retention yet"

    counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 31 * DAY)
    assert counts == {"jobs": 1, "results": 1, "logs": 1}
    assert Job.get_or_none(Job.id == finished.id) is None
    assert Job.get_by_id(waiting.id).status == JobStatus.PENDING, "active jobs are never swept"
    assert not (data / "results" / done_file.file_uuid).exists()
    assert (data / "results" / waiting_file.file_uuid / "noop.json").exists()
    assert (data / "logs" / "momentry-edge.log").exists(), "the live log stays"
    assert sorted(os.listdir(data / "logs")) == ["momentry-edge.log"]
    db.Job._meta.database.close()
