"""The queue's hand-written statements (db.execute, db.fetch, db.insert) read and write
rows exactly as peewee's own queries do, on each database."""

from __future__ import annotations

from momentry_edge import db, jobs
from momentry_edge.db import Job, JobStatus, MediaFile, ProcessorRun, RunStatus


def test_written_out_statements_match_peewee(tmp_path, database_url):
    database = db.connect(database_url, tmp_path / "data")
    try:
        jobs.init_queue_state(2, False)
        record = MediaFile.create(
            file_uuid="d" * 32, path="/drop/ü.mp4", watch_root="/drop", rel_path="ü.mp4", name="ü"
        )
        options = {"callback_url": "http://h/", "retry_on_failure": False, "task_timeout": 9.5}
        job, created = jobs.submit(record, ["noop", "stamp"], max_retries=2, options=options)
        assert created

        # Inserted with peewee's defaults filled in, read back the same by both.
        stored = Job.get_by_id(job.id)
        assert jobs.get(job.id).__data__ == stored.__data__
        assert all(stored.__data__[k] == v for k, v in job.__data__.items())
        assert stored.options == {
            "retry_on_failure": False,
            "callback_url": "http://h/",
            "callback_urls": ["http://h/"],
        }
        assert stored.task_timeout == 9.5 and stored.cancel_requested is False
        runs = list(
            ProcessorRun.select().where(ProcessorRun.job == job.id).order_by(ProcessorRun.id)
        )
        assert [(r.processor, r.position, r.status, r.attempts) for r in runs] == [
            ("noop", 0, RunStatus.PENDING, 0),
            ("stamp", 1, RunStatus.PENDING, 0),
        ]
        assert [r.__data__ for r in jobs.pending_runs(job.id)] == [r.__data__ for r in runs]

        claimed = jobs.claim("owner", "node", 2, 60)
        assert claimed is not None and claimed.id == job.id
        assert claimed.__data__ == Job.get_by_id(job.id).__data__
        assert claimed.status == JobStatus.PROCESSING and claimed.lease_owner == "owner"
        assert claimed.file.__data__ == MediaFile.get_by_id(record.id).__data__

        jobs.start_run(runs[0], "builtin", None)
        assert (
            jobs.report(
                job.id,
                runs[0].id,
                "owner",
                current=1,
                total=4,
                checkpoint={"frame": 1},
                lease_seconds=60,
                started_at=claimed.started_at,
            )
            is False
        )
        run = ProcessorRun.get_by_id(runs[0].id)
        assert (run.status, run.attempts, run.last_checkpoint) == (
            RunStatus.RUNNING,
            1,
            {"frame": 1},
        )
        assert Job.get_by_id(job.id).progress == 12  # a quarter of one of two runs
    finally:
        database.close()
