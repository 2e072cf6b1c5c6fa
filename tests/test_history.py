"""A long history of finished jobs: the lists stay pages, and a page costs what it shows."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

from conftest import wait_for

from momentry_edge import store
from momentry_edge.http import metrics
from momentry_edge.jobs import views
from momentry_edge.store import Job, JobStatus, MediaFile, ProcessorRun, RunStatus


def test_the_dead_list_is_paged_newest_first(start_service):
    # Failed jobs pile up with the history: the whole list in one answer took seconds
    # and megabytes once there were thousands of them.
    svc = start_service(queue={"max_concurrent": 2})
    svc.marker.write_text("storage is down")
    names = svc.add_copies(55, prefix="dead")
    tasks = [svc.submit(name, ["flaky"], max_retries=0)["task_id"] for name in names]
    wait_for(lambda: svc.get("/api/v1/queue/dead", params={"limit": 1})["total"] == 55, 60)

    first = svc.get("/api/v1/queue/dead")
    assert first["total"] == 55 and len(first["jobs"]) == 50  # the lists' default page
    rest = svc.get("/api/v1/queue/dead", params={"limit": 50, "offset": 50})
    assert rest["total"] == 55 and len(rest["jobs"]) == 5
    listed = first["jobs"] + rest["jobs"]
    assert sorted(d["task_id"] for d in listed) == sorted(tasks)
    finished = [d["completed_at"] for d in listed]
    assert finished == sorted(finished, reverse=True)  # newest first
    for dead in listed:  # each with its own runs' errors
        assert list(dead["failed"]) == ["flaky"]
        assert "storage unavailable" in dead["failed"]["flaky"]["error"]
    whole = svc.get("/api/v1/queue/dead", params={"limit": 1000})["jobs"]
    assert [d["task_id"] for d in whole] == [d["task_id"] for d in listed]
    for bad in ({"limit": 0}, {"offset": -1}, {"status": "failed"}):
        svc.call("GET", "/api/v1/queue/dead", expect=400, params=bad)


def _finish_jobs(start: int, count: int) -> None:
    """``count`` finished jobs, each with its file and a run: completed, failed, cancelled."""
    statuses = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
    with Job._meta.database.atomic():
        for i in range(start, start + count):
            record = MediaFile.create(
                file_uuid=f"{i:032x}", path=f"/drop/{i}.mp4", watch_root="/drop",
                rel_path=f"{i}.mp4", name=f"{i}.mp4",
            )  # fmt: skip
            status = statuses[i % 3]
            job = Job.create(
                task_id=f"task_{i:012x}", file=record, status=status, seq=i,
                processors=["noop"], max_retries=0, started_at=i, completed_at=i + 1,
            )  # fmt: skip
            run_status = RunStatus.COMPLETED if status == JobStatus.COMPLETED else RunStatus.FAILED
            ProcessorRun.create(
                job=job, processor="noop", position=0, status=run_status, error="x",
                started_at=i, completed_at=i + i % 90,
            )  # fmt: skip


def _vm_steps(action: Callable[[], Any]) -> int:
    """SQLite virtual machine instructions ``action`` takes on this thread's connection:
    how much of the database it reads, counted, whatever the machine's speed."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    connection = Job._meta.database.connection()
    connection.set_progress_handler(count, 1)
    try:
        action()
    finally:
        connection.set_progress_handler(None, 1)
    return steps


def test_a_page_of_finished_jobs_costs_no_more_per_job_in_history_than_counting_them(tmp_path):
    # The TUI lists the newest ten finished and failed jobs every second. The page was
    # read by joining and sorting every job of those statuses; the answer's total needs
    # a count of them anyway, and that is all a page may add per job of history.
    database = store.connect("", tmp_path / "data")
    try:
        finished = [JobStatus.COMPLETED, JobStatus.CANCELLED]

        def listing() -> None:
            page = views.list_jobs(finished, 10, 0)
            assert len(page["jobs"]) == 10

        def counting() -> None:
            Job.select().where(Job.status.in_(finished)).count()

        _finish_jobs(0, 600)
        listed, counted = _vm_steps(listing), _vm_steps(counting)
        _finish_jobs(600, 1200)
        more_listed, more_counted = _vm_steps(listing) - listed, _vm_steps(counting) - counted
        assert more_counted > 0
        assert more_listed <= 2 * more_counted, (more_listed, more_counted)
    finally:
        database.close()


def _peak_bytes(action: Callable[[], Any]) -> int:
    """The most memory ``action`` held at once (Python's allocations, counted)."""
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_metrics_scrape_holds_no_row_per_run_of_history(tmp_path, database_url):
    # The duration histogram read every completed run into Python at each scrape: with
    # 180,000 runs, 0.4 s and tens of MB every 15 s, growing with the history.
    database = store.connect(database_url, tmp_path / "data")
    try:

        def scrape() -> None:
            text = metrics.render_metrics(lambda: 2)[0].decode()
            assert 'momentry_processor_duration_seconds_count{processor="noop"}' in text

        _finish_jobs(0, 300)
        scrape()  # the first: imports, statement caches
        held = _peak_bytes(scrape)
        _finish_jobs(300, 3000)  # 1,000 more completed runs
        more = _peak_bytes(scrape) - held
        assert more < 32 * 1024, more
    finally:
        database.close()
