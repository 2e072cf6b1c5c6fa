"""A person's request that races the workers is carried out in full once answered with
success: cancel, prioritize, clear and retry sent while short jobs start and finish.

Each test fires its requests at a draining backlog many times over, so that some of
them land in the moment a worker claims or finishes the job they name."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import wait_for

# One quick step per job; steps.log in the job's results folder counts its runs.
QUICK = {"processors.steps": {"steps": 1, "step_seconds": 0}, "queue": {"max_concurrent": 4}}
FINAL = ("completed", "partial", "failed", "cancelled")


def _backlog(svc, count: int, prefix: str) -> list[dict]:
    """``count`` jobs of the steps processor waiting in a paused queue."""
    svc.call("POST", "/api/v1/queue/pause")
    return [svc.submit(name, ["steps"]) for name in svc.add_copies(count, prefix)]


def _runs(svc, file_uuid: str) -> int:
    log = Path(svc.data_dir) / "results" / file_uuid / "steps.log"
    return len(log.read_text().split()) if log.exists() else 0


def _settled(svc, tasks: list[str]) -> list[dict]:
    def done() -> list[dict] | None:
        found = [svc.job(task) for task in tasks]
        return found if all(job["status"] in FINAL for job in found) else None

    return wait_for(done, timeout=60, interval=0.2)


def test_a_cancel_answered_during_the_finish_ends_the_job_cancelled(start_service):
    svc = start_service(**QUICK)
    queued = _backlog(svc, 40, "cancel")
    tasks = [q["task_id"] for q in queued]
    svc.call("POST", "/api/v1/queue/resume")

    def cancel(task: str) -> tuple[str, list[tuple[int, dict]]]:
        # Asked again while it runs, so that some ask lands in its finish.
        replies = []
        while True:
            reply = svc.client.delete(f"/api/v1/queue/task/{task}")
            replies.append((reply.status_code, reply.json()))
            if reply.status_code != 200 or reply.json()["status"] == "cancelled":
                return task, replies
            if svc.job(task)["status"] in FINAL:
                return task, replies

    with ThreadPoolExecutor(4) as pool:
        asked = list(pool.map(cancel, tasks))
    ended = {job["task_id"]: job for job in _settled(svc, tasks)}
    for task, replies in asked:
        for code, body in replies:
            assert (code == 200 and body["success"] is True) or code == 409, body
        if replies[0][0] == 200:
            assert ended[task]["status"] == "cancelled", (task, replies, ended[task])
        else:
            assert ended[task]["status"] == "completed", (task, replies, ended[task])


def test_prioritize_during_claims_never_runs_a_job_twice(start_service):
    svc = start_service(**QUICK)
    queued = _backlog(svc, 40, "first")
    svc.call("POST", "/api/v1/queue/resume")

    def prioritize(entry: dict) -> tuple[dict, int, dict]:
        reply = svc.client.post(f"/api/v1/queue/prioritize/{entry['file_uuid']}")
        return entry, reply.status_code, reply.json()

    # One at a time: no other request moves the job from position 1 before the reply.
    replies = [prioritize(entry) for entry in queued]
    _settled(svc, [q["task_id"] for q in queued])
    for entry, code, body in replies:
        if code == 200:
            assert body["task_id"] == entry["task_id"]
            assert body["position"] in (1, None), body  # None: it started since
        else:
            assert code == 409 and body["error"]["code"] == "conflict", body
    ran = {q["task_id"]: _runs(svc, q["file_uuid"]) for q in queued}
    assert set(ran.values()) == {1}, ran
    for q in queued:
        assert svc.job(q["task_id"])["status"] == "completed"


def test_jobs_counted_as_cleared_end_cancelled_without_running(start_service):
    svc = start_service(**QUICK)
    queued = _backlog(svc, 60, "clear")
    tasks = [q["task_id"] for q in queued]
    svc.call("POST", "/api/v1/queue/resume")

    def clear(_: int) -> int:
        return svc.call("POST", "/api/v1/queue/clear")["cleared"]

    with ThreadPoolExecutor(4) as pool:
        cleared = sum(pool.map(clear, range(40)))
    ended = _settled(svc, tasks)
    cancelled = [job for job in ended if job["status"] == "cancelled"]
    assert cleared == len(cancelled)
    for job in cancelled:
        assert _runs(svc, job["file_uuid"]) == 0, job
    for job in ended:
        if job["status"] != "cancelled":
            assert job["status"] == "completed" and _runs(svc, job["file_uuid"]) == 1, job


def test_a_retry_sent_twice_at_once_queues_one_attempt(start_service):
    svc = start_service(**QUICK)
    queued = _backlog(svc, 20, "retry")
    tasks = [q["task_id"] for q in queued]
    for task in tasks:
        svc.call("DELETE", f"/api/v1/queue/task/{task}")
    svc.call("POST", "/api/v1/queue/resume")

    def retry(task: str) -> tuple[str, int]:
        return task, svc.client.post(f"/api/v1/jobs/{task}/retry").status_code

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(retry, [task for task in tasks for _ in range(2)]))
    ended = _settled(svc, tasks)
    for task in tasks:
        codes = sorted(code for t, code in replies if t == task)
        # The second is refused: the job waits, runs or has completed by then.
        assert codes == [200, 409], (task, codes)
    for job in ended:
        assert job["status"] == "completed" and _runs(svc, job["file_uuid"]) == 1, job


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_pause_answered_on_one_node_stops_starts_on_both_mid_drain(start_service):
    a = start_service("a", service={"node_id": "node-a"}, **QUICK)
    b = start_service("b", service={"node_id": "node-b"}, **QUICK)
    _backlog(a, 200, "pause")
    checked = 0
    while checked < 10:
        done = completed(a)
        a.call("POST", "/api/v1/queue/resume")
        wait_for(lambda done=done: completed(a) >= done + 3)
        a.call("POST", "/api/v1/queue/pause")
        # Read after the reply: none of these may start until the queue is resumed.
        listed = b.get("/api/v1/jobs", params={"status": "pending", "limit": 1000})["jobs"]
        waiting = [job["task_id"] for job in listed]
        wait_for(lambda: b.status()["active_count"] == 0)
        if not waiting:
            break  # drained
        started = [t for t in waiting if b.job(t)["status"] != "pending"]
        assert not started, (checked, started)
        checked += 1
    assert checked >= 3, "a backlog left at several pauses"


def completed(svc) -> int:
    return svc.get("/api/v1/jobs", params={"status": "completed", "limit": 1})["total"]
