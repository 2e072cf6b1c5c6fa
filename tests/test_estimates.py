"""Progress and estimates from this machine's measured rate per processor and the media's
duration: a real service process, real videos of known lengths, the steps workload."""

from __future__ import annotations

from datetime import datetime

import pytest
from conftest import wait_for


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_progress_weighs_expected_work_and_estimates_follow_the_media_length(start_service):
    svc = start_service(
        queue={"max_concurrent": 1},
        **{"processors.steps": {"steps": 30, "step_seconds": 0.1}},
    )
    # One job measures the rates: noop takes no time, steps about 3 s for 0.4 s of media.
    svc.add_video("measure.mp4", seconds=0.4)
    first = svc.submit("measure.mp4", ["noop", "steps"])["task_id"]
    svc.wait_status(first, "completed")

    svc.add_video("running.mp4", seconds=0.4)
    running = svc.submit("running.mp4", ["noop", "steps"])["task_id"]
    svc.add_video("short.mp4", seconds=0.4)
    short = svc.submit("short.mp4", ["noop", "steps"])["task_id"]
    svc.add_video("long.mp4", seconds=4.0)
    long = svc.submit("long.mp4", ["noop", "steps"])["task_id"]
    svc.add_video("last.mp4", seconds=0.4)
    last = svc.submit("last.mp4", ["noop", "steps"])["task_id"]

    # noop done and steps under way: the job is as far as steps is, not half done for noop.
    def midway() -> dict | None:
        job = svc.job(running)
        steps = job["processors"]["steps"]
        done = job["processors"]["noop"]["status"] == "completed"
        return job if done and 10 <= steps.get("progress", 0) <= 60 else None

    job = wait_for(midway, interval=0.02)
    assert job["progress"] <= job["processors"]["steps"]["progress"] + 5, job

    status = svc.status()
    entries = {entry["task_id"]: entry for entry in status["queue"]}
    end = at(entries[running]["estimated_end"])  # the running job has a time remaining
    starts = [at(entries[task]["estimated_start"]) for task in (short, long, last)]
    assert starts[0] == pytest.approx(end, abs=1)  # the slot frees when it ends
    # Each waiting job holds the slot for its media's length times the measured rate:
    # the 4 s video ten times as long as the 0.4 s one.
    short_takes, long_takes = starts[1] - starts[0], starts[2] - starts[1]
    assert long_takes == pytest.approx(10 * short_takes, rel=0.05), (short_takes, long_takes)
    # A filtered page (pending only, so each job placed on its own) says the same.
    only = svc.get("/api/v1/queue/status", params={"status": "pending", "limit": 2, "offset": 1})
    shown = {e["task_id"]: e for e in only["queue"] if e["status"] == "pending"}
    assert [shown[task]["position"] for task in (long, last)] == [2, 3]
    for task, start in ((long, starts[1]), (last, starts[2])):
        assert at(shown[task]["estimated_start"]) == pytest.approx(start, abs=1)
    svc.wait_status(last, "completed", timeout=120)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_limit_lowered_below_the_jobs_running_starts_the_line_when_enough_have_ended(
    start_service, tmp_path
):
    hold = tmp_path / "quiet.hold"
    hold.touch()
    plugins = [f"workloads:{name}" for name in ("Noop", "Steps", "Quiet")]
    svc = start_service(
        service={"plugins": plugins},
        **{"processors.quiet": {"hold_while_exists": str(hold)}},
    )
    svc.add_video("measure.mp4", seconds=0.4)
    svc.wait_status(svc.submit("measure.mp4", ["steps"])["task_id"], "completed")
    # Two running jobs expected to end far apart (media of 0.4 s and 4 s), then one slot.
    svc.add_video("short.mp4", seconds=0.4)
    svc.add_video("long.mp4", seconds=4.0)
    running = [svc.submit(name, ["quiet"])["task_id"] for name in ("short.mp4", "long.mp4")]
    for task in running:
        svc.wait_status(task, "processing")
    svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 1})
    waiting = svc.submit("next.mp4", ["steps"])["task_id"]

    entries = {e["task_id"]: e for e in svc.status()["queue"]}
    ends = sorted(at(entries[task]["estimated_end"]) for task in running)
    assert ends[1] > ends[0] + 1, ends
    # Nothing starts until both have ended: one job may run, two do.
    assert at(entries[waiting]["estimated_start"]) == pytest.approx(ends[1], abs=1)
    assert at(svc.job(waiting)["estimated_start"]) == pytest.approx(ends[1], abs=1)
    hold.unlink()
    svc.wait_status(waiting, "completed", timeout=60)
