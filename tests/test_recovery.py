"""Crashes, crash loops and time limits: the service recovers and says what happened."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time

import psycopg
from conftest import ServiceProcess, wait_for
from test_cluster import own_login


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
    # steps completed before the crashes: the job is partial, as docs/api.md defines it.
    assert job["status"] == "partial", job
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
    # A timed-out run has failed: its document says so, with the result it had so far
    # (however far a second took it: on a loaded machine, a few steps).
    assert partial["status"] == "failed" and 0 < partial["last_checkpoint"]["frame"] < 400
    assert "timed out after 1 s" in partial["error"]
    assert partial["result"]["done"] == partial["last_checkpoint"]["frame"]
    assert svc.get(f"/api/v1/files/{job['file_uuid']}/results/steps") == partial
    wait_for(lambda: svc.status()["active_count"] == 0)


def _stall(svc, cut) -> None:
    """Suspend the service (SIGSTOP), holding nothing of the queue's: on SQLite it is
    stopped while the test holds the write lock, so never inside a write of its own; on
    PostgreSQL its connections are ended (``cut``), and with them its transactions."""
    if cut is None:
        queue = sqlite3.connect(svc.data_dir / "momentry.db", isolation_level=None, timeout=60)
        try:
            queue.execute("BEGIN IMMEDIATE")
            os.kill(svc.proc.pid, signal.SIGSTOP)
            queue.execute("ROLLBACK")
        finally:
            queue.close()
    else:
        os.kill(svc.proc.pid, signal.SIGSTOP)
        cut(True)


def test_a_worker_stalled_past_its_lease_records_nothing_of_the_job_it_lost(
    start_service, database_url, tmp_path
):
    hold = tmp_path / "hold"
    hold.touch()
    plugins = ["workloads:Noop", "workloads:Quiet"]
    with contextlib.ExitStack() as stack:
        url, cut = database_url, None
        if database_url:
            url, cut = stack.enter_context(own_login(database_url, "stalled"))
        a = start_service(
            "a",
            service={"node_id": "node-a", "plugins": plugins, "database_url": url},
            queue={"lease_seconds": 2},
            **{"processors.quiet": {"hold_while_exists": str(hold), "note": True}},
        )
        task = a.submit("stalled.mp4", ["quiet"])["task_id"]
        wait_for(lambda: a.job(task)["processors"]["quiet"]["status"] == "running")
        # Another service on the same queue and data folder, as a restart beside a hung
        # process would be; its run of the job ends at once.
        b = ServiceProcess(
            tmp_path / "b",
            database_url,
            {
                "service": {"node_id": "node-b", "plugins": plugins, "data_dir": str(a.data_dir)},
                "queue": {"lease_seconds": 2},
                "processors.quiet": {"hold_while_exists": str(tmp_path / "never"), "note": True},
            },
        )
        b.data_dir = a.data_dir
        stack.callback(lambda: b.proc.poll() is None and b.kill())
        b.start()
        _stall(a, cut)
        # Its lease runs out: b takes the job over and completes it.
        job = b.wait_status(task, "completed")
        assert job["node"] == "node-b" and job["processors"]["quiet"]["attempts"] == 2
        out = a.data_dir / "results" / job["file_uuid"] / "quiet.json"
        document = out.read_text()
        assert json.loads(document)["result"] == {"attempt": 2}
        note = out.with_name("quiet.txt")
        assert note.read_text() == "attempt 2\n"

        # The stalled service resumes, its run ends, and it stops.
        hold.unlink()
        if cut is not None:
            cut(False)
        os.kill(a.proc.pid, signal.SIGCONT)
        assert a.stop() == 0
        # The job, its run, its document and the file beside it are b's: a recorded and
        # replaced nothing, and left nothing behind.
        assert b.job(task) == job
        assert out.read_text() == document and note.read_text() == "attempt 2\n"
        assert sorted(p.name for p in out.parent.iterdir()) == ["quiet.json", "quiet.txt"]
        assert f"job {task}: lease lost" in a.log()


def test_a_checkpoint_that_cannot_be_saved_fails_its_run_after_one_attempt(start_service):
    plugins = ["workloads:BadCheckpoint", "workloads:LoadFails"]
    svc = start_service(service={"plugins": plugins}, queue={"max_retries": 0})
    task = svc.submit("set.mp4", ["bad_checkpoint"])["task_id"]
    job = svc.wait_status(task, "failed")
    run = job["processors"]["bad_checkpoint"]
    assert run["attempts"] == 1 and job["retry_count"] == 0, job
    assert "checkpoint cannot be saved" in run["error"] and "set" in run["error"], run
    # A processor whose model never loads ends too: each try is counted, none is free.
    task = svc.submit("corrupt.mp4", ["load_fails"], max_retries=1)["task_id"]
    job = svc.wait_status(task, "failed")
    run = job["processors"]["load_fails"]
    assert run["attempts"] == 2 and job["retry_count"] == 1, job
    assert "the model file is corrupt" in run["error"], run


def test_a_model_put_in_place_after_its_job_failed_is_loaded_for_the_retry(start_service, tmp_path):
    model = tmp_path / "model.bin"
    svc = start_service(
        queue={"worker_threads": 1, "max_concurrent": 1},  # one thread, one instance
        service={"plugins": ["workloads:ModelFile"]},
        **{"processors.model_file": {"model_path": str(model)}},
    )
    task = svc.submit("early.mp4", ["model_file"])["task_id"]
    job = svc.wait_status(task, "failed")
    assert "is not there yet" in job["processors"]["model_file"]["error"], job
    model.write_text("weights v1")
    svc.call("POST", f"/api/v1/jobs/{task}/retry")
    job = svc.wait_status(task, "completed")
    result = svc.get(f"/api/v1/files/{job['file_uuid']}/results/model_file")["result"]
    assert result == {"model": "weights v1"}


def test_a_nan_checkpoint_fails_its_run_for_good(start_service):
    svc = start_service(
        service={"plugins": ["workloads:BadCheckpoint"]},
        **{"processors.bad_checkpoint": {"holds": "nan"}},
    )
    task = svc.submit("nan.mp4", ["bad_checkpoint"])["task_id"]  # max_retries 3
    job = svc.wait_status(task, "failed")
    run = job["processors"]["bad_checkpoint"]
    # The same bug on every try: not retried.
    assert run["attempts"] == 1 and job["retry_count"] == 0, job
    assert "NaN or Infinity" in run["error"], run
    # Its failed document is strict JSON: the checkpoint was never taken.
    text = (svc.data_dir / "results" / job["file_uuid"] / "bad_checkpoint.json").read_text()
    assert json.loads(text, parse_constant=strict)["status"] == "failed"


def strict(constant: str) -> None:
    """json.loads's parse_constant: NaN, Infinity and -Infinity are not JSON."""
    raise AssertionError(f"{constant} is not JSON")


def test_a_run_that_returns_after_its_task_timeout_fails_timed_out(start_service):
    svc = start_service(
        service={"plugins": ["workloads:Sleep"]}, **{"processors.sleep": {"seconds": 3}}
    )
    # It never reports, so nothing stops it before it returns: 3 s into a 1 s budget.
    task = svc.submit("long call.mp4", ["sleep"], task_timeout=1, max_retries=1)["task_id"]
    job = svc.wait_status(task, "failed", "completed", timeout=60)
    run = job["processors"]["sleep"]
    assert job["status"] == "failed", job
    assert "timed out after 1 s (the job's task_timeout)" in run["error"], run
    assert run["attempts"] == 2 and job["retry_count"] == 1, job  # retried as a timeout is
    document = svc.get(f"/api/v1/files/{job['file_uuid']}/results/sleep")
    assert document["status"] == "failed" and document["result"] is None, document


def test_a_run_that_never_returns_is_given_up_and_its_job_ends(start_service):
    # A model stuck in a call: past its task_timeout, cancelled, or at shutdown, the job
    # ends as it would have with a run that stopped, and the worker goes on.
    svc = start_service(
        queue={"worker_threads": 1, "max_concurrent": 1},
        service={"plugins": ["workloads:Noop", "workloads:Hang"]},
    )
    timed = svc.submit("hung.mp4", ["noop", "hang"], task_timeout=1, max_retries=0)["task_id"]
    job = svc.wait_status(timed, "partial", "failed", timeout=60)
    assert job["status"] == "partial", job
    assert "timed out after 1 s" in job["processors"]["hang"]["error"], job
    assert job["processors"]["noop"]["status"] == "completed", job

    cancelled = svc.submit("hung again.mp4", ["hang"])["task_id"]
    svc.wait_status(cancelled, "processing")
    svc.call("DELETE", f"/api/v1/queue/task/{cancelled}")
    svc.wait_status(cancelled, "cancelled", timeout=60)
    after = svc.submit("after.mp4", ["noop"])["task_id"]
    svc.wait_status(after, "completed")  # its one worker thread was free again
    assert "its thread is left to it" in svc.log()

    requeued = svc.submit("hung at shutdown.mp4", ["hang"])["task_id"]
    svc.wait_status(requeued, "processing")
    assert svc.stop() == 0
    svc.extra_env["MOMENTRY_WORKER_ENABLED"] = "false"  # to see it waiting in line
    svc.start()
    job = svc.job(requeued)
    # Back in line as a job stopped at shutdown is, not recovered as after a crash.
    assert (job["status"], job["crash_count"]) == ("pending", 0), job


def test_a_model_whose_load_never_returns_is_given_up_too(start_service):
    svc = start_service(
        queue={"worker_threads": 1, "max_concurrent": 1},
        service={"plugins": ["workloads:Noop", "workloads:HangOnLoad"]},
    )
    task = svc.submit("stuck load.mp4", ["noop", "hangload"], task_timeout=1, max_retries=0)
    job = svc.wait_status(task["task_id"], "partial", "failed", timeout=60)
    assert job["status"] == "partial", job
    assert "timed out after 1 s" in job["processors"]["hangload"]["error"], job
    after = svc.submit("after.mp4", ["noop"])["task_id"]
    svc.wait_status(after, "completed")  # its one worker thread was free again


def _set_node_pid(svc: ServiceProcess, database_url: str, pid: int) -> None:
    statement = f"UPDATE node SET pid = {int(pid)}"
    if database_url:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(statement)
    else:
        with contextlib.closing(sqlite3.connect(svc.data_dir / "momentry.db")) as conn:
            conn.execute(statement)
            conn.commit()


def test_a_node_id_held_by_a_running_service_is_refused_but_not_one_whose_pid_was_reused(
    start_service, database_url
):
    svc = start_service()
    registered = time.time()  # the node row is written before the service is up
    second = ServiceProcess(svc.root, database_url, {})
    second.spawn()
    # Exit 1, as for a port in use: the holder may be an instance still stopping, and the
    # service manager starts it again (after exit 2, a setting to change, systemd does not).
    assert second.wait_exit(timeout=60) == 1
    said = (svc.root / "service.log").read_text()
    node = svc.status()["nodes"][0]["id"]
    assert f"momentry-edge: cannot start: service.node_id: node id {node!r} is in use" in said
    assert f"in use by process {svc.proc.pid} on this host" in said

    # Killed (or the machine cut off), its pid may be another program's at the next start,
    # after a reboot say: the node row still names that pid.
    svc.kill()
    # A process started within a second or two of the row cannot be told from its writer
    # (start times read on Linux are cut to whole seconds of the boot time, and the check
    # allows a second): a pid is not given again that soon.
    wait_for(lambda: time.time() > registered + 2.5)
    other = subprocess.Popen(["sleep", "120"])
    try:
        _set_node_pid(svc, database_url, other.pid)
        svc.start()
        assert svc.get("/healthz")["status"] == "ok"
    finally:
        other.kill()
        other.wait()
