"""The queue as a user sees it through the HTTP API: order, concurrency, pause, recovery."""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime

from conftest import ServiceProcess, wait_for
from prometheus_client.parser import text_string_to_metric_families


def positions(svc: ServiceProcess) -> dict[str, int]:
    return {e["task_id"]: e["position"] for e in svc.status()["queue"] if e["status"] == "pending"}


def start_order(svc: ServiceProcess, task_ids: list[str]) -> list[str]:
    started = {t: svc.job(t)["started_at"] for t in task_ids}
    return sorted(task_ids, key=lambda t: started[t])


def test_high_priority_starts_next_and_positions_move_exactly(start_service):
    svc = start_service(queue={"max_concurrent": 1})
    svc.call("POST", "/api/v1/queue/pause")
    normal = [svc.submit(f"normal {i}.mp4", ["noop"])["task_id"] for i in range(10)]
    assert [positions(svc)[t] for t in normal] == list(range(1, 11))

    urgent = svc.submit("urgent.mp4", ["noop"], priority="high")
    assert urgent["position"] == 1
    order = positions(svc)
    assert sorted(order.values()) == list(range(1, 12)), "positions are 1..N with no gaps"
    assert [order[t] for t in normal] == list(range(2, 12))

    # Raised to high, a job is placed among the high ones by when it entered the line.
    moved = svc.call("PUT", f"/api/v1/queue/task/{normal[7]}/priority", json={"priority": "high"})
    assert moved["position"] == 1
    assert svc.job(urgent["task_id"])["position"] == 2
    # Lowering one sends it to the back.
    low = svc.call("PUT", f"/api/v1/queue/task/{normal[0]}/priority", json={"priority": "low"})
    assert low["position"] == 11

    # prioritize puts a file's job at position 1, ahead of the other high jobs.
    file_uuid = svc.job(normal[5])["file_uuid"]
    top = svc.call("POST", f"/api/v1/queue/prioritize/{file_uuid}")
    assert top == {"success": True, "task_id": normal[5], "position": 1}
    order = positions(svc)
    assert sorted(order.values()) == list(range(1, 12))
    expected = [normal[5], normal[7], urgent["task_id"]]
    expected += [t for t in normal if t not in expected and t != normal[0]] + [normal[0]]
    assert sorted(order, key=order.get) == expected

    svc.call("POST", "/api/v1/queue/resume")
    for task in expected:
        svc.wait_status(task, "completed")
    assert start_order(svc, expected) == expected, "jobs start in the order the API showed"


def test_lowering_concurrency_live_is_obeyed_and_raising_it_starts_more(start_service):
    svc = start_service(
        queue={"max_concurrent": 3}, **{"processors.steps": {"steps": 12, "step_seconds": 0.1}}
    )
    tasks = [svc.submit(f"clip {i}.mp4", ["steps"])["task_id"] for i in range(9)]
    wait_for(lambda: svc.status()["active_count"] == 3)

    reply = svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 1})
    assert reply["max_concurrent"] == 1
    running_then = {e["task_id"] for e in svc.status()["queue"] if e["status"] == "processing"}
    # The jobs already running finish; from then on never more than one runs.
    for task in running_then:
        svc.wait_status(task, "completed")
    samples = []
    for _ in range(30):
        status = svc.status()
        samples.append(status["active_count"])
        assert status["effective_concurrency"] == 1
        time.sleep(0.05)
    assert max(samples) == 1, samples

    svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 3})
    wait_for(lambda: svc.status()["active_count"] >= 2, timeout=10)
    for task in tasks:
        svc.wait_status(task, "completed")


def test_raising_concurrency_while_a_long_job_runs_starts_more_at_once(start_service):
    # One job running holds the service's only busy worker thread; the raise must start
    # threads for the others then, not when that job ends.
    svc = start_service(
        queue={"max_concurrent": 1}, **{"processors.steps": {"steps": 60, "step_seconds": 0.1}}
    )
    tasks = [svc.submit(f"long {i}.mp4", ["steps"])["task_id"] for i in range(4)]
    wait_for(lambda: svc.status()["active_count"] == 1)
    first = next(e["task_id"] for e in svc.status()["queue"] if e["status"] == "processing")
    svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 3})
    wait_for(lambda: svc.status()["active_count"] == 3, timeout=4)
    assert svc.job(first)["status"] == "processing", "the first job was still running"
    for task in tasks:
        svc.wait_status(task, "completed", timeout=60)


def test_pause_lets_running_jobs_finish_and_starts_none(start_service):
    svc = start_service(
        queue={"max_concurrent": 2}, **{"processors.steps": {"steps": 8, "step_seconds": 0.1}}
    )
    tasks = [svc.submit(f"p{i}.mp4", ["steps"])["task_id"] for i in range(5)]
    wait_for(lambda: svc.status()["active_count"] == 2)
    assert svc.call("POST", "/api/v1/queue/pause") == {"success": True, "paused": True}
    # As the pause found them: on a busy machine a job of 0.8 s may have ended, and the
    # next one started, between the two starts seen above and the pause.
    found = {t: svc.job(t)["status"] for t in tasks}
    running = [t for t in tasks if found[t] == "processing"]
    waiting = [t for t in tasks if found[t] == "pending"]
    assert running and waiting, found
    for task in running:
        svc.wait_status(task, "completed")
    time.sleep(1.0)  # long enough for a worker to have started something if it were going to
    status = svc.status()
    assert status["paused"] is True and status["active_count"] == 0
    assert [svc.job(t)["status"] for t in waiting] == ["pending"] * len(waiting)
    assert sorted(positions(svc), key=positions(svc).get) == waiting, "order is kept"

    assert svc.call("POST", "/api/v1/queue/resume") == {"success": True, "paused": False}
    for task in waiting:
        svc.wait_status(task, "completed")


def test_kill_9_mid_job_resumes_from_checkpoint_and_runs_nothing_twice(start_service):
    svc = start_service(
        queue={"max_concurrent": 2},
        **{"processors.steps": {"steps": 30, "step_seconds": 0.1}},
    )
    victim = svc.submit("long take.mp4", ["cut", "steps"])["task_id"]
    waiting = svc.submit("next.mp4", ["noop"])["task_id"]
    svc.wait_status(waiting, "completed")
    wait_for(lambda: svc.job(victim)["processors"]["steps"].get("current", 0) >= 8)
    svc.kill()

    svc.start()
    job = svc.wait_status(victim, "completed", timeout=30)
    assert job["crash_count"] == 1 and job["retry_count"] == 0
    steps = job["processors"]["steps"]
    assert steps["attempts"] == 2 and steps["status"] == "completed"
    out = svc.data_dir / "results" / job["file_uuid"]
    result = json.loads((out / "steps.json").read_text())
    resumed_from = result["result"]["resumed_from"]
    assert resumed_from >= 8, "resumed from the checkpoint, not from the start"
    executed = [int(n) for n in (out / "steps.log").read_text().split()]
    # Every step ran; only the one in flight at the kill may have run twice.
    assert sorted(set(executed)) == list(range(30))
    assert len(executed) - 30 <= 1
    # cut had completed before the kill and was not run again.
    assert job["processors"]["cut"]["attempts"] == 1
    jobs = svc.get("/api/v1/jobs")
    assert jobs["total"] == 2 and {j["status"] for j in jobs["jobs"]} == {"completed"}


def test_a_run_that_does_not_report_shows_running_and_is_counted_once(start_service, tmp_path):
    # A run's start is written with its next write, or on its own when none comes soon.
    hold = tmp_path / "quiet.hold"
    hold.touch()
    svc = start_service(
        service={"plugins": ["workloads:Quiet"]},
        **{"processors.quiet": {"hold_while_exists": str(hold)}},
    )
    task = svc.submit("quiet.mp4", ["quiet"])["task_id"]
    run = wait_for(lambda: (r := svc.job(task)["processors"]["quiet"])["status"] == "running" and r)
    assert run["attempts"] == 1 and run["started_at"]
    hold.unlink()
    job = svc.wait_status(task, "completed")
    done = job["processors"]["quiet"]
    assert (done["attempts"], done["started_at"]) == (1, run["started_at"])
    result = json.loads((svc.data_dir / "results" / job["file_uuid"] / "quiet.json").read_text())
    assert result["result"] == {"attempt": 1}


def overlapping(svc: ServiceProcess, task_ids: list[str]) -> int:
    """How many of the jobs ran while an earlier-started one was still running."""
    spans = sorted(
        (datetime.fromisoformat(j["started_at"]), datetime.fromisoformat(j["completed_at"]))
        for j in map(svc.job, task_ids)
    )
    busy_until, count = None, 0
    for begin, end in spans:
        if busy_until is not None and begin < busy_until:
            count += 1
        busy_until = end if busy_until is None else max(busy_until, end)
    return count


def test_jobs_over_at_once_run_one_after_another_and_one_that_runs_on_gets_one_beside_it(
    start_service, tmp_path
):
    # Two may run at once. Jobs that end at once drain on one thread (a second beside
    # them would only cost CPU); a job that runs on, reporting or not, soon has a second
    # job beside it.
    hold = tmp_path / "quiet.hold"
    svc = start_service(
        queue={"max_concurrent": 2},
        service={"plugins": [f"workloads:{name}" for name in ("Noop", "Steps", "Quiet")]},
        **{
            "processors.quiet": {"hold_while_exists": str(hold)},
            "processors.steps": {"steps": 600, "step_seconds": 0.1},
        },
    )
    svc.call("POST", "/api/v1/queue/pause")
    instant = [svc.submit(f"instant {i}.mp4", ["noop"])["task_id"] for i in range(12)]
    svc.call("POST", "/api/v1/queue/resume")
    for task in instant:
        svc.wait_status(task, "completed")
    # A job slowed past a moment by a busy machine may rightly get one beside it; the
    # code before ran nearly every one of these beside another.
    assert overlapping(svc, instant) < len(instant) // 2

    for first in ("steps", "quiet"):  # one that reports, one that never does
        hold.touch()
        task = svc.submit(f"long {first}.mp4", [first])["task_id"]
        svc.wait_status(task, "processing")
        beside = svc.submit(f"beside {first}.mp4", ["noop"])["task_id"]
        svc.wait_status(beside, "completed")
        assert svc.job(task)["status"] == "processing", "the long job was still running"
        svc.call("DELETE", f"/api/v1/queue/task/{task}")  # the quiet one ends with its hold
        hold.unlink()
        svc.wait_status(task, "cancelled")


def test_transient_failures_back_off_then_dead_list_then_retry_reruns_only_failed(start_service):
    # Each retrying state lasts its whole backoff step (1, 2, 4 s and a jitter), long
    # enough to be seen by polling on a loaded machine; a 0.3 s step could pass unseen.
    first_step = 1.0
    svc = start_service(queue={"max_retries": 3, "retry_delay": first_step})
    svc.marker.write_text("storage is down")
    task = svc.submit("flaky.mp4", ["cut", "flaky"])["task_id"]

    # Seconds from each failure to the attempt it scheduled: the backoff step, plus the
    # time the service took from recording the failure to scheduling the retry.
    delays: dict[int, float] = {}

    def record_delays() -> bool:
        job = svc.job(task)
        if job["status"] == "retrying":
            failed_at = _ts(job["processors"]["flaky"]["completed_at"])
            delays[job["retry_count"]] = _ts(job["next_attempt_at"]) - failed_at
        return job["status"] in ("partial", "failed")

    wait_for(record_delays, timeout=90, interval=0.02)
    assert sorted(delays) == [1, 2, 3]
    for retry, delay in delays.items():
        assert delay >= first_step * 2 ** (retry - 1), delays  # never sooner than its step
    assert delays[1] < delays[2] < delays[3], delays  # the steps double

    job = svc.job(task)
    assert job["status"] == "partial"
    assert job["processors"]["flaky"]["attempts"] == 4
    assert "storage unavailable" in job["processors"]["flaky"]["error"]
    dead = svc.get("/api/v1/queue/dead")
    assert [d["task_id"] for d in dead["jobs"]] == [task]
    assert "storage unavailable" in dead["jobs"][0]["failed"]["flaky"]["error"]
    cut_done_at = job["processors"]["cut"]["completed_at"]

    svc.marker.unlink()  # the person fixes the cause, then retries
    svc.call("POST", f"/api/v1/jobs/{task}/retry")
    job = svc.wait_status(task, "completed")
    assert job["processors"]["cut"]["completed_at"] == cut_done_at, "cut was not re-run"
    assert job["processors"]["cut"]["attempts"] == 1
    assert job["processors"]["flaky"]["attempts"] == 1
    assert svc.get("/api/v1/queue/dead")["total"] == 0


def test_a_cleared_retrying_job_ends_cancelled_with_no_attempt_due(start_service):
    svc = start_service(queue={"max_retries": 3, "retry_delay": 600})
    svc.marker.write_text("storage is down")
    task = svc.submit("cleared.mp4", ["flaky"])["task_id"]
    assert svc.wait_status(task, "retrying")["next_attempt_at"] is not None
    assert svc.call("POST", "/api/v1/queue/clear")["cleared"] == 1
    job = svc.job(task)
    assert (job["status"], job["next_attempt_at"]) == ("cancelled", None), job


def test_cancel_stops_a_running_job_within_seconds_and_keeps_partial_output(start_service):
    svc = start_service(
        queue={"max_concurrent": 1}, **{"processors.steps": {"steps": 200, "step_seconds": 0.05}}
    )
    running = svc.submit("running.mp4", ["cut", "steps"])["task_id"]
    pending = [svc.submit(f"wait {i}.mp4", ["noop"])["task_id"] for i in range(3)]
    wait_for(lambda: svc.job(running)["processors"]["steps"].get("current", 0) >= 5)

    asked = time.monotonic()
    reply = svc.call("DELETE", f"/api/v1/queue/task/{running}")
    assert reply["success"] is True
    job = svc.wait_status(running, "cancelled", timeout=10)
    assert time.monotonic() - asked < 5
    out = svc.data_dir / "results" / job["file_uuid"]
    assert json.loads((out / "cut.json").read_text())["status"] == "completed"
    partial = json.loads((out / "steps.json").read_text())
    assert partial["status"] == "partial"
    assert partial["last_checkpoint"]["frame"] >= 5
    assert partial["result"]["done"] == partial["last_checkpoint"]["frame"]

    svc.call("POST", "/api/v1/queue/pause")
    more = [svc.submit(f"more {i}.mp4", ["noop"])["task_id"] for i in range(2)]
    leftover = [t for t in pending + more if svc.job(t)["status"] == "pending"]
    cleared = svc.call("POST", "/api/v1/queue/clear")
    assert cleared == {"success": True, "cleared": len(leftover)}
    assert {svc.job(t)["status"] for t in leftover} == {"cancelled"}
    assert svc.status()["pending_count"] == 0
    # A cancelled job can be retried; it resumes from its checkpoint.
    svc.call("POST", "/api/v1/queue/resume")
    svc.call("POST", f"/api/v1/jobs/{running}/retry")
    job = svc.wait_status(running, "completed", timeout=30)
    assert job["processors"]["cut"]["attempts"] == 1


def test_settings_and_order_survive_a_restart(start_service):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 1})
    svc.call("PUT", "/api/v1/queue/concurrency", json={"dynamic_concurrency": True})
    for i, priority in enumerate(["low", "normal", "high", "normal", "high"]):
        svc.submit(f"r{i}.mp4", ["noop"], priority=priority)
    before = positions(svc)
    assert svc.stop() == 0

    svc.start()
    status = svc.status()
    assert status["paused"] is True
    assert status["max_concurrent"] == 1
    assert status["dynamic_concurrency"] is True
    assert positions(svc) == before


def test_a_kept_concurrency_above_fewer_worker_threads_is_cut_to_them(start_service):
    svc = start_service()  # queue.worker_threads 8
    svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 6})
    assert svc.stop() == 0

    # The same database and data folder, now with 2 threads: 2 is what can run.
    svc = start_service(queue={"worker_threads": 2})
    status = svc.status()
    assert (status["max_concurrent"], status["effective_concurrency"]) == (2, 2)
    metrics = text_string_to_metric_families(svc.client.get("/metrics").text)
    samples = {m.name: m.samples[0].value for m in metrics if m.name.endswith("_concurrency")}
    assert samples["momentry_effective_concurrency"] == 2
    svc.call("PUT", "/api/v1/queue/concurrency", expect=400, json={"max_concurrent": 6})
    assert (
        svc.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 2})["max_concurrent"]
        == 2
    )
    said = "max_concurrent 6 (set through the API) is more than queue.worker_threads 2: now 2"
    log_file = svc.data_dir / "logs" / "momentry-edge.log"
    assert log_file.read_text().count(said) == 1
    svc.restart()  # cut once: nothing to say again
    assert svc.status()["max_concurrent"] == 2
    assert log_file.read_text().count(said) == 1


def test_graceful_stop_returns_running_job_to_the_line(start_service):
    svc = start_service(**{"processors.steps": {"steps": 100, "step_seconds": 0.05}})
    task = svc.submit("stop me.mp4", ["steps"])["task_id"]
    wait_for(lambda: svc.job(task)["processors"]["steps"].get("current", 0) >= 3)
    assert svc.stop() == 0
    svc.start()
    job = svc.wait_status(task, "completed", timeout=30)
    assert job["crash_count"] == 0, "a clean stop is not a crash"
    assert job["processors"]["steps"]["attempts"] == 2


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_low_disk_space_holds_jobs_and_the_status_says_why(start_service):
    svc = start_service(queue={"min_free_disk_mb": 10**9})  # the most it takes: 1 PB
    task = svc.submit("waits.mp4", ["noop"])["task_id"]
    time.sleep(1.0)
    status = svc.status()
    assert "low disk space" in status["blocked_reason"]
    assert status["effective_concurrency"] == 0 and status["paused"] is False
    assert svc.job(task)["status"] == "pending"


def test_estimated_start_follows_the_line_once_there_is_history(start_service):
    svc = start_service(
        queue={"max_concurrent": 1}, **{"processors.steps": {"steps": 20, "step_seconds": 0.1}}
    )
    svc.call("POST", "/api/v1/queue/pause")
    first = svc.submit("history.mp4", ["steps"])
    assert svc.job(first["task_id"])["estimated_start"] is None, "no timing history yet"
    svc.call("POST", "/api/v1/queue/resume")
    svc.wait_status(first["task_id"], "completed")

    blocker = svc.submit("blocker.mp4", ["steps"])["task_id"]
    svc.wait_status(blocker, "processing")
    for i in range(3):
        svc.submit(f"eta {i}.mp4", ["steps"])
    status = svc.status()
    average = status["statistics"]["average_time"]
    pending = [e for e in status["queue"] if e["status"] == "pending"]
    assert [e["position"] for e in pending] == [1, 2, 3]
    starts = [_ts(e["estimated_start"]) for e in pending]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(abs(gap - average) < 0.02 for gap in gaps), (gaps, average)
    assert starts[0] > time.time() - 1, "the first waits for the running job to end"

    svc.call("POST", "/api/v1/queue/pause")
    pending = [e for e in svc.status()["queue"] if e["status"] == "pending"]
    assert [e["estimated_start"] for e in pending] == [None] * 3, "paused: nothing will start"


def test_a_paused_queue_gives_no_start_time_to_a_job_held_until_a_time(start_service):
    # A dropped file's job waits for its file to settle (not_before), so nearly every job
    # has one: while paused it must not read as starting then.
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    not_before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 600))
    task = svc.submit("held.mp4", ["noop"], not_before=not_before)["task_id"]
    [entry] = [e for e in svc.status()["queue"] if e["task_id"] == task]
    assert entry["estimated_start"] is None and entry["not_before"] is not None, entry
    assert svc.job(task)["estimated_start"] is None

    svc.call("POST", "/api/v1/queue/resume")
    assert svc.job(task)["estimated_start"] == svc.job(task)["not_before"]


def test_a_rescan_with_the_same_model_is_up_to_date_unless_forced(start_service):
    svc = start_service()
    first = svc.submit("again.mp4", ["cut"])
    svc.wait_status(first["task_id"], "completed")
    scan = f"/api/v1/file/{first['file_uuid']}/deep-scan"

    second = svc.call("POST", scan, expect=202, json={"processors": ["cut"]})["task_id"]
    cut = svc.wait_status(second, "completed")["processors"]["cut"]
    assert cut["status"] == "skipped" and cut["reason"] == "up to date"
    assert cut["attempts"] == 0

    forced = svc.call("POST", scan, expect=202, json={"processors": ["cut"], "force": True})
    cut = svc.wait_status(forced["task_id"], "completed")["processors"]["cut"]
    assert cut["status"] == "completed" and cut["attempts"] == 1
