"""What the job views show of a run's checkpoint, on each database."""

from __future__ import annotations

from momentry_edge import jobs, store
from momentry_edge.jobs import views
from momentry_edge.store import MediaFile, ProcessorRun


def test_a_job_shows_where_each_run_is_not_its_partial_result(tmp_path, database_url):
    database = store.connect(database_url, tmp_path / "data")
    try:
        jobs.init_queue_state(2, False)
        record = MediaFile.create(
            file_uuid="e" * 32, path="/drop/a.mp4", watch_root="/drop", rel_path="a.mp4", name="a"
        )
        job, _ = jobs.submit(record, ["pose", "cut", "asr"], max_retries=2)
        pose, cut, _asr = (
            ProcessorRun.select().where(ProcessorRun.job == job.id).order_by(ProcessorRun.position)
        )
        frames = [{"frame": i, "keypoints": [[1.5, 2.25, 0.9]] * 33} for i in range(200)]
        pose.last_checkpoint = {"frame": 500, "timestamp": 20.0, "partial": {"frames": frames}}
        pose.save()
        cut.last_checkpoint = {"timestamp": 1e-05, "cuts_frames": [3]}  # no frame
        cut.save()

        shown = views.job_detail(job, 1)["processors"]
        assert shown["pose"]["last_checkpoint"] == {"frame": 500, "timestamp": 20.0}
        assert type(shown["pose"]["last_checkpoint"]["frame"]) is int
        assert shown["cut"]["last_checkpoint"] == {"timestamp": 1e-05}
        assert "last_checkpoint" not in shown["asr"]  # none saved yet
        # The runs themselves keep their whole checkpoints.
        assert ProcessorRun.get_by_id(pose.id).last_checkpoint["partial"]["frames"] == frames
        summary = views.list_jobs([], 10, 0)["jobs"][0]
        assert summary["completed"] == [] and summary["processors"] == ["pose", "cut", "asr"]
    finally:
        database.close()
