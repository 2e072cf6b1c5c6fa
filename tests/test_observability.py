"""What observers see: /metrics agrees with the API, and /api/v1/events streams a job's life."""

from __future__ import annotations

import time
from typing import Any

from conftest import wait_for
from eventstream import EventReader
from prometheus_client.parser import text_string_to_metric_families

STATUSES = ("pending", "processing", "retrying", "completed", "partial", "failed", "cancelled")


def scrape(svc) -> dict[str, dict[tuple, float]]:
    """/metrics parsed by Prometheus' own parser: sample name -> {sorted labels: value}."""
    reply = svc.client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def total(svc, status: str) -> int:
    return svc.get("/api/v1/jobs", params={"status": status, "limit": 1})["total"]


def test_metrics_match_the_api(start_service) -> None:
    svc = start_service(
        queue={"max_retries": 0, "max_concurrent": 2},
        **{"processors.steps": {"steps": 200, "step_seconds": 0.1}},
    )
    svc.marker.touch()  # flaky fails while the marker exists; no retries: failed at once
    # Distinct contents: a copy of a file already scanned would be skipped, not run.
    finished = [svc.submit(name, ["noop"])["task_id"] for name in svc.add_copies(3, "done")]
    finished.append(svc.submit("broken.mp4", ["flaky"])["task_id"])
    for task in finished:
        svc.wait_status(task, "completed", "failed")
    running = svc.submit("long.mp4", ["steps"])["task_id"]  # ~20 s: stays running throughout
    svc.wait_status(running, "processing")
    effective = scrape(svc)["momentry_effective_concurrency"][()]
    assert effective == svc.status()["effective_concurrency"] == 2
    svc.call("POST", "/api/v1/queue/pause")
    waiting = [svc.submit(f"later {i}.mp4", ["noop"])["task_id"] for i in range(3)]
    svc.call("POST", f"/api/v1/jobs/{waiting[0]}/cancel")

    metrics = scrape(svc)
    status = svc.status()
    jobs = {dict(labels)["status"]: value for labels, value in metrics["momentry_jobs"].items()}
    assert set(STATUSES) <= set(jobs)
    assert jobs == {s: total(svc, s) for s in jobs}
    assert (jobs["completed"], jobs["failed"], jobs["processing"]) == (3, 1, 1)
    assert (jobs["pending"], jobs["cancelled"]) == (2, 1)
    assert metrics["momentry_queue_depth"][()] == status["pending_count"] == 2
    assert metrics["momentry_active_jobs"][()] == status["active_count"] == 1
    # Paused: nothing may start, and both say so.
    assert metrics["momentry_effective_concurrency"][()] == status["effective_concurrency"] == 0

    # Durations: one histogram per processor, over completed runs only.
    count = metrics["momentry_processor_duration_seconds_count"]
    assert count[(("processor", "noop"),)] == 3
    assert (("processor", "flaky"),) not in count  # failed runs have no duration
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for labels, value in metrics["momentry_processor_duration_seconds_bucket"].items()
        if dict(labels)["processor"] == "noop"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets) and buckets[-1] == (
        float("inf"),
        3,
    )

    files = {dict(labels)["state"]: value for labels, value in metrics["momentry_files"].items()}
    listed = svc.get("/api/v1/files", params={"state": "present", "limit": 1})["total"]
    assert files["present"] == listed == 8


def test_event_stream_follows_a_job_while_the_server_answers_others(start_service) -> None:
    svc = start_service(**{"processors.steps": {"steps": 10, "step_seconds": 0.15}})
    # One job in this test: its job.finished is the last event we need.
    reader = EventReader(
        svc.url, until=lambda event: event["type"] == "job.finished", token=svc.token
    )
    reader.start()
    assert reader.connected.wait(10), "the event stream never said it was connected"

    task = svc.submit("watched.mp4", ["steps"])["task_id"]
    job_id = svc.job(task)["id"]

    def answered_promptly_until_finished() -> bool:
        # While the stream is open the server keeps answering everyone else, promptly.
        started = time.monotonic()
        status = svc.job(task)["status"]
        assert svc.status()["queue"] is not None and time.monotonic() - started < 2
        return status in ("completed", "partial", "failed")

    wait_for(answered_promptly_until_finished, timeout=30)

    def mine(event: dict[str, Any]) -> bool:
        # job.progress names the job by its integer id; the other job events by task_id.
        return event.get("task_id") == task or event.get("job_id") == job_id

    reader.join(timeout=10)
    assert not reader.is_alive(), f"no job.finished event; saw {reader.events}"
    assert reader.content_type.startswith("text/event-stream")
    events = [e for e in reader.events if mine(e) and e["type"].startswith("job.")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "job.queued" and kinds[1] == "job.started", kinds
    assert kinds[-1] == "job.finished" and events[-1]["status"] == "completed", kinds
    progress = [e["progress"] for e in events if e["type"] == "job.progress"]
    assert kinds[2:-1] == ["job.progress"] * len(progress) and len(progress) >= 5, kinds
    assert progress == sorted(progress) and progress[-1] == 100
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
