"""Every client mistake gets API.md's JSON error shape with a 4xx, and the service keeps going."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx


def assert_error(reply: httpx.Response, status: int, code: str, *words: str) -> None:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["success"] is False
    assert body["error"]["code"] == code
    for word in words:
        assert word in body["error"]["message"]


def test_client_mistakes_get_json_errors(start_service):
    svc = start_service()
    task = svc.submit("ok.mp4", ["noop"])["task_id"]
    svc.wait_status(task, "completed")
    file_uuid = svc.job(task)["file_uuid"]
    c = svc.client

    # Malformed and wrongly shaped bodies.
    for body in (b"{not json", b"[1, 2]", b'"text"'):
        reply = c.post("/api/v1/files/register", content=body)
        assert_error(reply, 400, "bad_request", "JSON")
    reply = c.put("/api/v1/queue/concurrency", content=b"")
    assert_error(reply, 400, "bad_request", "body")
    assert_error(
        c.post("/api/v1/files/register", content=b"x" * (2 << 20)), 413, "payload_too_large"
    )

    # Unknown ids, in every form a job can be named.
    for ref in ("task_000000000000", "999999", "f" * 32, "nonsense"):
        assert_error(c.get(f"/api/v1/jobs/{ref}"), 404, "not_found", ref)
    assert_error(c.delete("/api/v1/queue/task/task_000000000000"), 404, "not_found")
    assert_error(c.post("/api/v1/queue/prioritize/" + "0" * 32), 404, "not_found")
    assert_error(c.get("/api/v1/files/" + "0" * 32), 404, "not_found")
    assert_error(c.get(f"/api/v1/files/{file_uuid}/results/ocr"), 404, "not_found", "ocr")
    assert_error(c.get(f"/api/v1/files/{file_uuid}/results/nope"), 404, "not_found", "nope")
    assert_error(c.get("/api/v1/no/such/endpoint"), 404, "not_found")
    assert_error(c.patch("/api/v1/queue/status"), 405, "method_not_allowed")
    # POST-only paths that a GET pattern would match too (/api/v1/files/<file_uuid>).
    for path in ("/api/v1/files/register", "/api/v1/files/rescan"):
        for method in ("GET", "DELETE"):
            reply = c.request(method, path)
            assert_error(reply, 405, "method_not_allowed")
            assert reply.headers["Allow"] == "POST"

    # Bad values.
    scan = f"/api/v1/file/{file_uuid}/deep-scan"
    noop = {"processors": ["noop"]}
    assert_error(c.post(scan, json=noop | {"priority": "urgent"}), 400, "bad_request", "priority")
    assert_error(
        c.post(scan, json={"processors": ["noop", "teleport"]}), 400, "bad_request", "teleport"
    )
    assert_error(c.post(scan, json={"processors": "noop"}), 400, "bad_request", "processors")
    assert_error(c.post(scan, json={"processors": []}), 400, "bad_request", "processors")
    assert_error(
        c.post(scan, json=noop | {"callback_url": "file:///etc/passwd"}), 400, "bad_request", "http"
    )
    assert_error(c.post(scan, json=noop | {"force": "yes"}), 400, "bad_request", "force")
    priority = f"/api/v1/queue/task/{task}/priority"
    assert_error(c.put(priority, json={"priority": 3}), 400, "bad_request", "priority")
    nothing = {"max_concurrent": None, "dynamic_concurrency": None}  # would change nothing
    for body in (
        {"max_concurrent": 0},
        {"max_concurrent": "2"},
        {"max_concurrent": 999},
        {},
        nothing,
    ):
        assert_error(c.put("/api/v1/queue/concurrency", json=body), 400, "bad_request")
    assert_error(
        c.put("/api/v1/queue/concurrency", json={"dynamic_concurrency": "no"}), 400, "bad_request"
    )
    assert_error(c.get("/api/v1/jobs?status=weird"), 400, "bad_request", "weird")
    assert_error(c.get("/api/v1/jobs?limit=-1"), 400, "bad_request", "limit")
    assert_error(c.get("/api/v1/files?limit=abc"), 400, "bad_request", "limit")
    # Repeated or odd query values are not passed over in silence.
    assert_error(c.get("/api/v1/jobs?status=weird&status=completed"), 400, "bad_request", "weird")
    for paging in ("limit=1_0", "limit=5&limit=10", "offset=+1"):
        assert_error(c.get(f"/api/v1/jobs?{paging}"), 400, "bad_request", "whole numbers")
    # A misspelt filter is refused, not dropped: the request would list or clear everything.
    assert_error(c.get("/api/v1/jobs?stauts=failed"), 400, "bad_request", "stauts", "status")
    assert_error(c.get("/api/v1/files?status=missing"), 400, "bad_request", "state")
    assert_error(c.post("/api/v1/queue/clear?status=failed"), 400, "bad_request", "none")
    both = c.get("/api/v1/jobs?status=cancelled&status=completed").json()
    assert [job["task_id"] for job in both["jobs"]] == [task]  # each value counts

    # State conflicts.
    assert_error(c.post(f"/api/v1/jobs/{task}/retry"), 409, "conflict", "completed")
    assert_error(c.post(f"/api/v1/jobs/{task}/cancel"), 409, "conflict", "completed")
    assert_error(c.put(priority, json={"priority": "high"}), 409, "conflict")
    assert_error(c.post(f"/api/v1/queue/prioritize/{file_uuid}"), 409, "conflict")

    # Paths outside the watched folder.
    outside = svc.root / "outside.mp4"
    outside.write_bytes(b"not even video")
    for path in (str(outside), "../outside.mp4", "/etc/passwd"):
        reply = c.post("/api/v1/files/register", json={"path": path})
        assert_error(reply, 400, "bad_request", "watched folder")
    assert_error(c.post("/api/v1/files/register", json={"path": "absent.mp4"}), 400, "bad_request")
    register = "/api/v1/files/register"
    assert_error(c.post(register, json={"path": 123}), 400, "bad_request", "non-empty string")
    assert_error(c.post(register, json={"scan": True}), 400, "bad_request", "path is required")

    # None of this hurt the service.
    assert svc.get("/healthz")["status"] == "ok"
    assert svc.status()["paused"] is False
    again = svc.submit("after.mp4", ["noop"])["task_id"]
    svc.wait_status(again, "completed")


def test_token_is_required_on_every_api_route_when_set(start_service):
    svc = start_service(service={"token": "s3cret"})
    anonymous = httpx.Client(base_url=svc.url, timeout=10)
    assert anonymous.get("/healthz").status_code == 200  # probes need no token
    for method, path in (
        ("GET", "/api/v1/queue/status"),
        ("POST", "/api/v1/queue/pause"),
        ("GET", "/api/v1/jobs"),
        ("GET", "/api/v1/jobs/task_000000000000"),
    ):
        assert_error(anonymous.request(method, path), 401, "unauthorized")
        wrong = {"Authorization": "Bearer guess"}
        assert_error(anonymous.request(method, path, headers=wrong), 401, "unauthorized")
    assert svc.status()["paused"] is False, "a refused request changed nothing"
    assert svc.call("POST", "/api/v1/queue/pause")["paused"] is True


def test_one_files_work_is_never_queued_twice(start_service, tmp_path):
    svc = start_service(
        **{
            "processors.steps": {"steps": 40, "step_seconds": 0.1},
            "processors.flaky": {"fail_while_exists": str(tmp_path / "no such marker")},
        }
    )
    svc.call("POST", "/api/v1/queue/pause")
    first = svc.submit("same.mp4", ["noop", "steps"])
    assert first["deduplicated"] is False
    file_uuid = svc.job(first["task_id"])["file_uuid"]
    scan = f"/api/v1/file/{file_uuid}/deep-scan"

    # Asked again, by the hook or the API, in another order or for part of it: that job.
    body = {"path": "same.mp4", "processors": ["noop", "steps"]}
    repeat = svc.call("POST", "/api/v1/files/register", expect=200, json=body)
    assert repeat["task_id"] == first["task_id"] and repeat["deduplicated"] is True
    for processors in (["steps", "noop"], ["noop"]):
        again = svc.call("POST", scan, expect=200, json={"processors": processors})
        assert again["task_id"] == first["task_id"] and again["deduplicated"] is True
    # Asked for more while it waits in line: it takes the rest on, at the higher priority,
    # with the callback asked for.
    more = {
        "processors": ["steps", "cut"],
        "priority": "high",
        "callback_url": "http://127.0.0.1:9/",
    }
    extended = svc.call("POST", scan, expect=200, json=more)
    assert extended["task_id"] == first["task_id"] and extended["deduplicated"] is True
    job = svc.job(first["task_id"])
    assert list(job["processors"]) == ["noop", "steps", "cut"] and job["priority"] == "high"
    # Asked with other choices (force): other work, in a job of its own.
    forced = svc.call("POST", scan, expect=202, json={"processors": ["flaky"], "force": True})
    assert forced["task_id"] != first["task_id"] and forced["deduplicated"] is False
    # Everything asked for is in one active job or another: nothing new.
    shared = svc.call("POST", scan, expect=200, json={"processors": ["noop", "flaky"]})
    assert shared["task_id"] == forced["task_id"] and shared["deduplicated"] is True
    assert svc.status()["pending_count"] == 2

    # Once it runs, it takes nothing on; only what no active job runs makes a new job.
    svc.call("POST", "/api/v1/queue/resume")
    svc.wait_status(first["task_id"], "processing")
    # The forced job out of line too (running or done), or it would take the next ask on.
    svc.wait_status(forced["task_id"], "processing", "completed", "partial", "failed")
    running = svc.call("POST", scan, expect=200, json={"processors": ["cut"]})
    assert running["task_id"] == first["task_id"]
    other = svc.call("POST", scan, expect=202, json={"processors": ["noop", "pose"]})
    assert other["deduplicated"] is False
    assert list(svc.job(other["task_id"])["processors"]) == ["pose"]  # noop is first's
    done = svc.wait_status(first["task_id"], "completed", "partial", "failed", timeout=60)
    assert [run["status"] for run in done["processors"].values()] == ["completed"] * 3


def test_concurrent_requests_for_one_file_queue_one_job(start_service):
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    first = svc.submit("busy.mp4", ["noop"])
    scan = f"/api/v1/file/{svc.job(first['task_id'])['file_uuid']}/deep-scan"

    def ask(_: int) -> str:
        return svc.call("POST", scan, json={"processors": ["noop", "steps"]})["task_id"]

    with ThreadPoolExecutor(8) as pool:
        task_ids = set(pool.map(ask, range(16)))

    assert task_ids == {first["task_id"]}
    assert list(svc.job(first["task_id"])["processors"]) == ["noop", "steps"]
    assert svc.status()["pending_count"] == 1
