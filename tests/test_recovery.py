"""Crashes, crash loops and time limits: the service recovers and says what happened."""

from __future__ import annotations

import json
import signal

from conftest import wait_for


def test_a_job_that_keeps_killing_the_service_is_parked(start_service):
    svc = start_service(queue={"max_crashes": 3})
    task = svc.submit("poison.mp4", ["steps", "crash"])["task_id"]
    good = svc.submit("good.mp4", ["noop"])["task_id"]
    assert svc.wait_exit() == -signal.SIGKILL
    for _ in range(2):
        svc.spawn()
        assert svc.wait_exit() == -signal.SIGKILL, "the poison job ran again and crashed"
    svc.start()
    job = svc.wait_status(task, "partial", "failed")
    assert job["crash_count"] == 3 and job["retry_count"] == 0
    assert "stopped 3 times" in job["error_message"] and "crash" in job["error_message"]
    assert job["processors"]["crash"]["status"] == "failed"
    assert job["processors"]["steps"]["status"] == "completed"
    # No worker was left to write the parked run's document: it is written all the same.
    out = svc.data_dir / "results" / job["file_uuid"] / "crash.json"
    assert job["processors"]["crash"]["output_path"] == str(out)
    document = json.loads(out.read_text())
    assert document["status"] == "failed" and document["task_id"] == task
    assert document["error"] == job["processors"]["crash"]["error"]
    assert "stopped 3 times" in document["error"]
    assert document["last_checkpoint"] == {"frame": 1, "timestamp": 0.5}
    assert document["result"] == {"seen": 1}  # what the run had so far
    assert svc.get(f"/api/v1/files/{job['file_uuid']}/results/crash") == document
    assert [d["task_id"] for d in svc.get("/api/v1/queue/dead")["jobs"]] == [task]
    svc.wait_status(good, "completed")  # the rest of the line was not lost
    assert svc.get("/healthz")["status"] == "ok"


def test_task_timeout_fails_the_job_and_keeps_its_partial_output(start_service):
    svc = start_service(
        queue={"task_timeout": 1, "max_retries": 0},
        **{"processors.steps": {"steps": 400, "step_seconds": 0.05}},
    )
    task = svc.submit("endless.mp4", ["steps"])["task_id"]
    job = svc.wait_status(task, "failed", timeout=20)
    assert "timed out after 1 s" in job["processors"]["steps"]["error"]
    assert "queue.task_timeout" in job["error_message"]
    out = svc.data_dir / "results" / job["file_uuid"] / "steps.json"
    partial = json.loads(out.read_text())
    # A timed-out run has failed: its document says so, with the result it had so far.
    assert partial["status"] == "failed" and 5 < partial["last_checkpoint"]["frame"] < 400
    assert "timed out after 1 s" in partial["error"]
    assert partial["result"]["done"] == partial["last_checkpoint"]["frame"]
    assert svc.get(f"/api/v1/files/{job['file_uuid']}/results/steps") == partial
    wait_for(lambda: svc.status()["active_count"] == 0)
