"""The queue's hand-written statements (store.execute, store.fetch, store.insert, store.insert_many)
read and write rows exactly as peewee's own queries do, on each database."""

from __future__ import annotations

import peewee as pw
import pytest

from momentry_edge import cluster, jobs, outputs, store
from momentry_edge.store import (
    FileState,
    Job,
    JobStatus,
    MediaFile,
    ProcessorRun,
    QueueState,
    RunStatus,
)


def test_written_out_statements_match_peewee(tmp_path, database_url):
    database = store.connect(database_url, tmp_path / "data")
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

        jobs.start_run(jobs.Claim.of(claimed, "owner"), runs[0], "builtin", None)
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


def _media_files(names: str) -> list[MediaFile]:
    """A file record for each letter of ``names``."""
    return [
        MediaFile.create(
            file_uuid=c * 32, path=f"/drop/{c}.mp4", watch_root="/drop", rel_path=c, name=c
        )
        for c in names
    ]


def test_a_start_rides_on_the_next_write_and_a_finish_claims_the_next_job(tmp_path, database_url):
    database = store.connect(database_url, tmp_path / "data")
    try:
        jobs.init_queue_state(1, False)
        files = _media_files("ab")
        first, _ = jobs.submit(files[0], ["noop", "stamp"], max_retries=0)
        second, _ = jobs.submit(files[1], ["noop"], max_retries=0)
        claimed = jobs.claim("owner", "node", 1, 60)
        assert claimed is not None and claimed.id == first.id
        noop, stamp = jobs.pending_runs(first.id)

        # A run's start carried by its first progress report...
        started = jobs.Started(100.0, "builtin", "m1")
        jobs.report(
            first.id,
            noop.id,
            "owner",
            current=1,
            total=2,
            checkpoint=None,
            lease_seconds=60,
            run_started=started,
        )
        run = ProcessorRun.get_by_id(noop.id)
        assert (run.status, run.attempts, run.started_at, run.backend, run.model) == (
            RunStatus.RUNNING,
            1,
            100.0,
            "builtin",
            "m1",
        )
        jobs.complete_run(jobs.Claim.of(claimed, "owner"), noop, "/out/noop.json")
        assert ProcessorRun.get_by_id(noop.id).attempts == 1

        # ...and by the job's finish, which records the last run and, with a limit of one,
        # can claim the next job only because the same commit ends this one.
        last = jobs.Completion(stamp.id, "/out/stamp.json", jobs.Started(101.0, None, None))
        policy = jobs.RetryPolicy(retry_delay=1, max_crashes=3, lease_seconds=60)
        request = jobs.ClaimRequest("owner", "node", 1, 60)
        status, following = jobs.finish_and_claim(claimed, "owner", policy, request, [last])
        assert status == JobStatus.COMPLETED
        assert following is not None and following.id == second.id
        assert following.__data__ == Job.get_by_id(second.id).__data__
        assert following.status == JobStatus.PROCESSING and following.lease_owner == "owner"
        assert following.file.__data__ == MediaFile.get_by_id(files[1].id).__data__
        run = ProcessorRun.get_by_id(stamp.id)
        assert (run.status, run.attempts, run.started_at, run.output_path) == (
            RunStatus.COMPLETED,
            1,
            101.0,
            "/out/stamp.json",
        )
        assert (run.progress_current, run.progress_total) == (1, 1)
        ended = Job.get_by_id(first.id)
        assert (ended.status, ended.progress, ended.lease_owner) == (JobStatus.COMPLETED, 100, None)

        # A release and a failure carry a start the same way.
        (run,) = jobs.pending_runs(second.id)
        holding = jobs.Claim.of(following, "owner")
        jobs.release_run(holding, run, jobs.Started(102.0, "b", "m"))
        run = ProcessorRun.get_by_id(run.id)
        assert (run.status, run.attempts, run.started_at) == (RunStatus.PENDING, 1, 102.0)
        jobs.fail_run(holding, run, "broke", transient=False, started=jobs.Started(103.0, "b", "m"))
        run = ProcessorRun.get_by_id(run.id)
        assert (run.status, run.attempts, run.started_at, run.error) == (
            RunStatus.FAILED,
            2,
            103.0,
            "broke",
        )
    finally:
        database.close()


def test_a_claim_heeds_the_queue_state_as_of_its_own_commit(tmp_path, database_url):
    """A worker builds its request, then the queue is paused (or its limit lowered) and
    the API answers: the claim that follows must not start a job all the same."""
    database = store.connect(database_url, tmp_path / "data")
    try:
        cluster.register_node("node", "owner", [])  # its settings row, on PostgreSQL
        jobs.init_queue_state(2, False, "node")
        files = _media_files("abc")
        queued = [jobs.submit(f, ["noop"], max_retries=0)[0] for f in files]

        def limit(state: QueueState) -> int:  # the rule Workers.effective_limit applies
            return 0 if state.paused else state.max_concurrent

        request = jobs.ClaimRequest("owner", "node", limit, 60)
        policy = jobs.RetryPolicy(retry_delay=1, max_crashes=3, lease_seconds=60)
        first = jobs.claim(request.owner, request.node, request.limit, 60)
        assert first is not None and first.id == queued[0].id

        jobs.set_paused(True)
        assert jobs.claim(request.owner, request.node, request.limit, 60) is None
        (run,) = jobs.pending_runs(first.id)
        jobs.complete_run(jobs.Claim.of(first, "owner"), run, "/out/noop.json")
        status, following = jobs.finish_and_claim(first, "owner", policy, request)
        assert (status, following) == (JobStatus.COMPLETED, None)
        assert [Job.get_by_id(j.id).status for j in queued[1:]] == [JobStatus.PENDING] * 2

        jobs.set_paused(False)
        second = jobs.claim(request.owner, request.node, request.limit, 60)
        assert second is not None and second.id == queued[1].id
        jobs.set_concurrency(1, None, ceiling=8, node="node")  # one runs already: no second one now
        assert jobs.claim(request.owner, request.node, request.limit, 60) is None
        assert Job.get_by_id(queued[2].id).status == JobStatus.PENDING
    finally:
        database.close()


def test_a_claim_whose_job_was_given_away_writes_nothing_into_it(tmp_path, database_url):
    database = store.connect(database_url, tmp_path / "data")
    try:
        jobs.init_queue_state(1, False)
        (record,) = _media_files("a")
        jobs.submit(record, ["noop"], max_retries=0)
        old = jobs.claim("owner", "node", 1, 60, now=1000.0)
        policy = jobs.RetryPolicy(retry_delay=1, max_crashes=3, lease_seconds=60)
        # Its lease ran out: the reaper gave it back, and another thread of the same
        # process claimed it again (the same owner, a later claim).
        assert jobs.reap("node", "owner", policy, now=1100.0) == [old.task_id]
        new = jobs.claim("owner", "node", 1, 60, now=1200.0)
        assert new is not None and new.id == old.id
        (run,) = ProcessorRun.select().where(ProcessorRun.job == old.id)
        before = (Job.get_by_id(old.id).__data__, run.__data__)

        lost = jobs.Claim.of(old, "owner")
        folder = tmp_path / "results"
        staged = outputs.stage_result(folder, old, "noop", outputs.COMPLETED, {"by": "old"})
        writes = [
            lambda: jobs.start_run(lost, run, "builtin", None),
            lambda: jobs.complete_run(lost, run, str(staged.path), None, staged),
            lambda: jobs.fail_run(lost, run, "broke", transient=True, document=staged),
            lambda: jobs.skip_run(lost, run, "duplicate", "/elsewhere/noop.json"),
            lambda: jobs.release_run(lost, run, jobs.Started(1.0, None, None), staged),
            lambda: jobs.finish(
                old, "owner", policy, completed=[jobs.Completion(run.id, "/x", None, staged)]
            ),
        ]
        for write in writes:
            with pytest.raises(jobs.LeaseLost):
                write()
        row = ProcessorRun.get_by_id(run.id)
        assert (Job.get_by_id(old.id).__data__, row.__data__) == before
        assert not staged.path.exists(), "its document was not put in place"
        staged.discard()
        assert list(folder.iterdir()) == []

        # The claim that holds the job now writes as ever.
        jobs.complete_run(jobs.Claim.of(new, "owner"), run, "/out/noop.json")
        assert jobs.finish(new, "owner", policy) == JobStatus.COMPLETED
    finally:
        database.close()


def _file_row(name: str, **extra: object) -> dict:
    return {
        "file_uuid": name.encode().hex()[:32].ljust(32, "0"),
        "path": f"/drop/{name}.mp4",
        "watch_root": "/drop",
        "rel_path": f"{name}.mp4",
        "name": f"{name}.mp4",
        "size": 5_000_000_000,  # past 32 bits
        "mtime": 1764563000.123456,
        "state": FileState.PRESENT,
        "fingerprint": "5000000000:0f1e",
        "registered_at": 1764563001.5,
        "updated_at": 1764563001.5,
        **extra,
    }


def test_written_out_bulk_insert_matches_peewee(tmp_path, database_url):
    database = store.connect(database_url, tmp_path / "data")
    try:
        jobs.init_queue_state(2, False)
        names = ["ü 東京", "a'b", "c?d %s"]  # quotes and placeholder look-alikes are data
        written = [MediaFile(**_file_row(name)) for name in names]
        store.insert_many(written, key="path")
        MediaFile.insert_many([_file_row("peewee " + name) for name in names]).execute()
        different = {"id", "file_uuid", "path", "rel_path", "name"}
        for name, record in zip(names, written, strict=True):
            stored = MediaFile.get_by_id(record.id)
            assert stored.__data__ == record.__data__, "the instance holds what was stored"
            by_peewee = MediaFile.get(MediaFile.path == f"/drop/peewee {name}.mp4")
            assert {k: v for k, v in stored.__data__.items() if k not in different} == {
                k: v for k, v in by_peewee.__data__.items() if k not in different
            }
        assert stored.transient is False and stored.content_hash is None
        # Its errors are peewee's, as its queries' are (the watcher tells an outage by them).
        with pytest.raises(pw.IntegrityError), database.atomic():
            store.insert_many([MediaFile(**_file_row(names[0]))], key="path")

        # More rows than one statement's parameters allow: several statements, ids right.
        many = [MediaFile(**_file_row(f"many {i:04d}")) for i in range(3_200)]
        store.insert_many(many, key="path")
        ids = dict(
            MediaFile.select(MediaFile.path, MediaFile.id)
            .where(MediaFile.path.startswith("/drop/many "))
            .tuples()
        )
        assert {r.path: r.id for r in many} == ids and len(ids) == 3_200

        # The jobs of a batch, against a job peewee inserts with the same settings.
        queued = jobs.submit_new(written, ["noop", "stamp"], priority=2, max_retries=3)
        assert [job.file_id for job in queued] == [r.id for r in written]
        by_peewee = Job.create(
            task_id="task_peewee",
            file=many[0].id,
            priority=2,
            seq=1,
            processors=["noop", "stamp"],
            max_retries=3,
        )
        by_peewee = Job.get_by_id(by_peewee.id)
        different = {"id", "task_id", "file", "seq", "created_at", "queued_at"}
        for job in queued:
            stored = Job.get_by_id(job.id)
            assert stored.__data__ == job.__data__
            assert {k: v for k, v in stored.__data__.items() if k not in different} == {
                k: v for k, v in by_peewee.__data__.items() if k not in different
            }
            runs = ProcessorRun.select().where(ProcessorRun.job == job.id)
            assert sorted((r.processor, r.position, r.status, r.attempts) for r in runs) == [
                ("noop", 0, RunStatus.PENDING, 0),
                ("stamp", 1, RunStatus.PENDING, 0),
            ]
        in_line = [job.id for job in jobs.pending_in_order() if job.task_id != "task_peewee"]
        assert in_line == [job.id for job in queued], "in line in the order given"
    finally:
        database.close()
