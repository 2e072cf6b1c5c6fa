"""Every request answered with success is carried out in full, or refused with a 4xx saying why:
callbacks and priority of a deduplicated request, callback URLs, upload-hook fields, and the
per-job max_retries, task_timeout and not_before."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from conftest import wait_for
from receiver import Post, receiving


@pytest.fixture
def receiver():
    with receiving() as rx:
        yield rx.url, rx.posts


def _delivered(received: list[Post], path: str, task_id: str) -> list[dict]:
    bodies = [post.json() for post in received if post.path == path]
    return [body for body in bodies if body["job"]["task_id"] == task_id]


def _startable(job: dict) -> bool:
    at = job["not_before"]
    return at is None or datetime.fromisoformat(at).timestamp() <= time.time()


def _file(svc, name: str) -> dict:
    files = svc.get("/api/v1/files", params={"limit": 1000})["files"]
    return next((f for f in files if f["file_name"] == name), None)


def test_a_deduplicated_request_carries_its_priority_and_callbacks_over(start_service, receiver):
    base, received = receiver
    svc = start_service(
        queue={"max_concurrent": 1}, ingest={"processors": ["cut"], "settle_seconds": 0.3}
    )
    svc.call("POST", "/api/v1/queue/pause")
    svc.add_video("earlier.mp4")  # the watcher queues cut for it: normal, first in line
    wait_for(lambda: (f := _file(svc, "earlier.mp4")) and f["status"])
    earlier = svc.job(_file(svc, "earlier.mp4")["file_uuid"])["task_id"]

    svc.add_video("dropped.mp4")  # and for this one, behind it
    record = wait_for(lambda: (f := _file(svc, "dropped.mp4")) and f["status"] and f)
    scan = f"/api/v1/file/{record['file_uuid']}/deep-scan"
    body = {"processors": ["cut"], "priority": "high", "callback_url": f"{base}/first"}
    first = svc.call("POST", scan, expect=200, json=body)
    assert first["deduplicated"] is True
    second = svc.call("POST", scan, expect=200, json={"callback_url": f"{base}/second"})
    assert second["task_id"] == first["task_id"]

    job = svc.job(first["task_id"])
    assert job["priority"] == "high" and job["position"] == 1
    assert job["options"]["callback_urls"] == [f"{base}/first", f"{base}/second"]
    assert job["options"]["callback_url"] == f"{base}/first"  # the single field still read

    # Each file closed moments ago: its job starts once the file has been quiet
    # settle_seconds (a resumed upload may add a part). Both may start now.
    wait_for(lambda: all(_startable(svc.job(task)) for task in (earlier, first["task_id"])))
    svc.call("POST", "/api/v1/queue/resume")
    dropped = svc.wait_status(first["task_id"], "completed")
    other = svc.wait_status(earlier, "completed")
    assert dropped["started_at"] < other["started_at"], "high priority runs first"
    for path in ("/first", "/second"):
        wait_for(lambda path=path: _delivered(received, path, first["task_id"]))
    assert not [p for p in received if p.json()["job"]["task_id"] == earlier]


def test_an_unchanged_file_registered_again_sends_its_callback(start_service, receiver):
    base, received = receiver
    svc = start_service()
    task = svc.submit("again.mp4", ["noop"])["task_id"]
    svc.wait_status(task, "completed")
    again = svc.submit("again.mp4", ["noop"], expect=200, callback_url=f"{base}/late")
    assert again["task_id"] == task and again["deduplicated"] is True
    [summary] = wait_for(lambda: _delivered(received, "/late", task))
    assert summary["job"]["status"] == "completed"


def test_a_request_the_existing_job_cannot_honour_is_refused(start_service):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    queued = svc.submit("clash.mp4", ["noop"])
    scan = f"/api/v1/file/{queued['file_uuid']}/deep-scan"
    for asked in ({"max_retries": 0}, {"retry_on_failure": False}, {"task_timeout": 30}):
        refused = svc.call("POST", scan, expect=409, json={"processors": ["noop"], **asked})
        assert queued["task_id"] in refused["error"]["message"]
    # More work with other settings goes to a job of its own.
    own = svc.call("POST", scan, expect=202, json={"processors": ["steps"], "max_retries": 0})
    assert own["task_id"] != queued["task_id"]
    # A forced re-run of what waits untouched: the waiting job is made forced.
    forced = svc.call("POST", scan, expect=200, json={"processors": ["noop"], "force": True})
    assert forced["task_id"] == queued["task_id"]
    job = svc.job(queued["task_id"])
    assert job["options"] == {"force": True} and job["max_retries"] == 3
    assert list(job["processors"]) == ["noop"]


BAD_CALLBACKS = [
    "http://[::1",
    "http://127.0.0.1:99999/",
    "http://" + "a" * 3000 + ".example/",
    "http://example.com/a b",
    "http:///no-host",
    "ftp://example.com/",
    "javascript:alert(1)",
    17,
]


def test_callback_urls_that_cannot_be_used_are_refused(start_service):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    queued = svc.submit("urls.mp4", ["noop"])
    scan = f"/api/v1/file/{queued['file_uuid']}/deep-scan"
    for url in BAD_CALLBACKS:
        for path, body in (
            (scan, {"processors": ["steps"]}),
            ("/api/v1/files/register", {"path": "urls.mp4"}),
        ):
            error = svc.call("POST", path, expect=400, json=body | {"callback_url": url})
            assert "callback_url" in error["error"]["message"]
    assert [j["task_id"] for j in svc.get(f"/api/v1/files/{queued['file_uuid']}")["jobs"]] == [
        queued["task_id"]
    ]
    assert svc.job(queued["task_id"])["options"] == {}


def test_a_callback_that_cannot_be_delivered_gives_up(start_service, receiver):
    base, received = receiver
    svc = start_service()
    # Valid as a URL, but its host name cannot be encoded (a label over 63 characters).
    url = "http://" + "a" * 300 + ".example/hook"
    task = svc.submit("nowhere.mp4", ["noop"], callback_url=url)["task_id"]
    svc.wait_status(task, "completed")
    wait_for(lambda: f"job {task}: callback gave up after 6 attempts" in svc.log(), timeout=120)
    # The service keeps running and keeps delivering others.
    assert svc.get("/healthz")["status"] == "ok"
    other = svc.submit("somewhere.mp4", ["noop"], callback_url=f"{base}/ok")["task_id"]
    wait_for(lambda: _delivered(received, "/ok", other))


def test_upload_hook_fields_are_type_checked(start_service):
    svc = start_service()
    svc.add_video("typed.mp4")
    record = wait_for(lambda: _file(svc, "typed.mp4"))  # the watcher registered it
    for bad, field in (
        ({"upload_status": "1"}, "upload_status"),
        ({"upload_status": True}, "upload_status"),
        ({"upload_status": 1.0}, "upload_status"),
        ({"scan": "false"}, "scan"),
        ({"scan": 0}, "scan"),
        ({"processors": "noop"}, "processors"),
        ({"processors": [1]}, "processors"),
        ({"priority": ["high"]}, "priority"),
        ({"priority": "urgent"}, "priority"),
    ):
        body = {"path": "typed.mp4", "processors": ["noop"]} | bad
        error = svc.call("POST", "/api/v1/files/register", expect=400, json=body)
        assert field in error["error"]["message"], error
    detail = svc.get(f"/api/v1/files/{record['file_uuid']}")
    assert detail["state"] == "present" and detail["jobs"] == []


def test_a_failed_upload_report_does_not_reject_a_file_mid_job(start_service):
    svc = start_service(**{"processors.steps": {"steps": 100, "step_seconds": 0.05}})
    queued = svc.submit("busy.mp4", ["steps"])
    svc.wait_status(queued["task_id"], "processing")
    body = {"path": "busy.mp4", "upload_status": 0}
    refused = svc.call("POST", "/api/v1/files/register", expect=409, json=body)
    assert queued["task_id"] in refused["error"]["message"]
    assert svc.wait_status(queued["task_id"], "completed")["error_message"] is None
    assert svc.get(f"/api/v1/files/{queued['file_uuid']}")["state"] == "present"

    # A job still waiting is not run on an upload reported failed: it is cancelled.
    svc.call("POST", "/api/v1/queue/pause")
    waiting = svc.submit("aborted.mp4", ["noop"])
    body = {"path": "aborted.mp4", "upload_status": 0}
    rejected = svc.call("POST", "/api/v1/files/register", expect=201, json=body)
    assert rejected["state"] == "rejected" and rejected["task_id"] is None
    job = svc.job(waiting["task_id"])
    assert job["status"] == "cancelled" and "upload" in job["error_message"]


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_per_job_options_are_validated(start_service):
    svc = start_service()
    svc.add_video("options.mp4")
    record = wait_for(lambda: _file(svc, "options.mp4"))
    scan = f"/api/v1/file/{record['file_uuid']}/deep-scan"
    for bad in (
        {"max_retries": -1},
        {"max_retries": "3"},
        {"max_retries": True},
        {"max_retries": 1.5},
        {"max_retries": 10**6},
        {"task_timeout": 0},
        {"task_timeout": "10"},
        {"task_timeout": False},
        {"not_before": "tomorrow"},
        {"not_before": 1700000000},
        {"not_before": "2026-13-01T00:00:00Z"},
    ):
        field = next(iter(bad))
        error = svc.call("POST", scan, expect=400, json={"processors": ["noop"]} | bad)
        assert field in error["error"]["message"], error
        body = {"path": "options.mp4", "processors": ["noop"]} | bad
        svc.call("POST", "/api/v1/files/register", expect=400, json=body)
    assert svc.get(f"/api/v1/files/{record['file_uuid']}")["jobs"] == []


def test_max_retries_zero_fails_on_the_first_error(start_service):
    svc = start_service()
    svc.marker.touch()  # flaky fails while it exists
    task = svc.submit("once.mp4", ["flaky"], max_retries=0)["task_id"]
    job = svc.wait_status(task, "failed")
    assert job["max_retries"] == 0 and job["retry_count"] == 0
    assert job["processors"]["flaky"]["attempts"] == 1


def test_task_timeout_per_job_ends_a_slow_job(start_service):
    svc = start_service(**{"processors.steps": {"steps": 400, "step_seconds": 0.05}})
    task = svc.submit("slow.mp4", ["steps"], task_timeout=1, max_retries=0)["task_id"]
    assert svc.job(task)["task_timeout"] == 1
    job = svc.wait_status(task, "failed")
    assert "timed out after 1 s (the job's task_timeout)" in job["processors"]["steps"]["error"]
    assert svc.job(task)["processors"]["steps"]["current"] < 400


def test_not_before_holds_a_job_in_line(start_service):
    svc = start_service()
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
    held = svc.submit("later.mp4", ["noop"], not_before=_iso(start))
    job = svc.job(held["task_id"])
    assert job["status"] == "pending" and _parse(job["not_before"]) == start
    assert _parse(job["estimated_start"]) >= start
    entry = next(e for e in svc.status()["queue"] if e["task_id"] == held["task_id"])
    assert _parse(entry["estimated_start"]) >= start

    # It does not hold back the line: a job queued after it runs meanwhile.
    other = svc.submit("now.mp4", ["noop"])["task_id"]
    svc.wait_status(other, "completed")
    if time.time() < start.timestamp():
        assert svc.job(held["task_id"])["status"] == "pending"
    done = svc.wait_status(held["task_id"], "completed", timeout=60)
    assert _parse(done["started_at"]) >= start


def test_a_start_time_past_what_can_be_shown_is_refused_and_a_far_one_waits(start_service):
    svc = start_service()
    too_late = "9999-12-31T23:59:59-14:00"  # 10000-01-01 in UTC
    reply = svc.submit("late.mp4", ["noop"], expect=400, not_before=too_late)
    assert "not_before is out of range" in reply["error"]["message"]
    assert svc.get("/api/v1/jobs")["total"] == 0  # refused: nothing was queued

    far = svc.submit("late.mp4", ["noop"], not_before="9998-01-01T00:00:00Z")
    assert svc.job(far["task_id"])["status"] == "pending"
    assert [e["task_id"] for e in svc.status()["queue"]] == [far["task_id"]]
    now = svc.submit("now.mp4", ["noop"])["task_id"]  # the workers still run the line
    svc.wait_status(now, "completed")
    assert svc.job(far["task_id"])["status"] == "pending"


def test_a_time_before_the_year_1000_is_shown_with_four_year_digits(start_service):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")  # the job stays in line, shown in the queue
    task = svc.submit("early.mp4", ["noop"], not_before="0999-01-01T00:00:00Z")["task_id"]
    assert svc.job(task)["not_before"] == "0999-01-01T00:00:00.000Z"
    entries = svc.status()["queue"]
    assert [e["not_before"] for e in entries] == ["0999-01-01T00:00:00.000Z"]
    # Past, it holds nothing back.
    svc.call("POST", "/api/v1/queue/resume")
    svc.wait_status(task, "completed")


def test_a_scan_asked_while_the_files_job_is_cancelled_gets_a_job_of_its_own(start_service):
    # A report a second: the cancel lands at the next, after the requests below.
    svc = start_service(**{"processors.steps": {"steps": 60, "step_seconds": 1.0}})
    first = svc.submit("cancelled.mp4", ["steps"])
    wait_for(lambda: svc.job(first["task_id"])["processors"]["steps"].get("current", 0) > 0)
    svc.call("POST", f"/api/v1/jobs/{first['task_id']}/cancel")
    priority = f"/api/v1/queue/task/{first['task_id']}/priority"
    refused = svc.call("PUT", priority, expect=409, json={"priority": "high"})
    assert "being cancelled" in refused["error"]["message"]

    scan = f"/api/v1/file/{first['file_uuid']}/deep-scan"
    second = svc.call("POST", scan, expect=202, json={"processors": ["steps"]})
    assert second["deduplicated"] is False and second["task_id"] != first["task_id"]
    assert svc.wait_status(first["task_id"], "cancelled")["status"] == "cancelled"
    svc.wait_status(second["task_id"], "processing")  # it runs: then no minute of steps
    svc.call("DELETE", f"/api/v1/queue/task/{second['task_id']}")
    assert svc.wait_status(second["task_id"], "cancelled")["status"] == "cancelled"


def test_a_retry_that_would_queue_a_files_processor_twice_or_whose_file_is_gone_is_refused(
    start_service,
):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    first = svc.submit("twice.mp4", ["noop", "steps"])
    svc.call("DELETE", f"/api/v1/queue/task/{first['task_id']}")
    scan = f"/api/v1/file/{first['file_uuid']}/deep-scan"
    second = svc.call("POST", scan, expect=202, json={"processors": ["noop"]})

    refused = svc.call("POST", f"/api/v1/jobs/{first['task_id']}/retry", expect=409)
    assert f"job {second['task_id']} (pending) runs noop" in refused["error"]["message"]
    assert svc.job(first["task_id"])["status"] == "cancelled"

    # prioritize by file finds the file's job in line, not its newest (cancelled) one.
    svc.call("DELETE", f"/api/v1/queue/task/{second['task_id']}")
    third = svc.call("POST", scan, expect=202, json={"processors": ["steps"], "max_retries": 0})
    svc.call("DELETE", f"/api/v1/queue/task/{third['task_id']}")
    svc.call("POST", f"/api/v1/jobs/{first['task_id']}/retry")  # nothing else runs noop now
    moved = svc.call("POST", f"/api/v1/queue/prioritize/{first['file_uuid']}")
    assert moved["task_id"] == first["task_id"] and moved["position"] == 1

    svc.call("DELETE", f"/api/v1/queue/task/{first['task_id']}")
    (svc.drop / "twice.mp4").unlink()
    wait_for(lambda: _file(svc, "twice.mp4")["state"] == "missing")
    refused = svc.call("POST", f"/api/v1/jobs/{first['task_id']}/retry", expect=400)
    assert "is missing" in refused["error"]["message"]
    assert svc.job(first["task_id"])["status"] == "cancelled"
