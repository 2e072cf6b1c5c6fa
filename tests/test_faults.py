"""Faults under running jobs: a locked or lost database, a full disk.

Afterwards every job has ended or runs again: none is stuck in processing, none is
lost or run as a second job, and a cancel asked meanwhile is honoured.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import ServiceProcess, wait_for
from disks import fill, small_filesystem
from eventstream import EventReader
from pgproxy import PLAIN_ENV, CuttingProxy

from momentry_edge import store

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
on_postgres = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

BUSY_TIMEOUT = 1.0  # service.database_timeout in these tests
# How long a state change keeps trying across a locked database before it gives up.
RETRY_WINDOW = BUSY_TIMEOUT * (len(store.RETRY_DELAYS) + 1) + sum(store.RETRY_DELAYS)
# How long a storm of cut connections lasts: within the pauses between a state change's
# tries, so the last try always comes after it.
STORM = sum(store.RETRY_DELAYS) / 2
STEPS = 30


def steps_done(svc: ServiceProcess, task_id: str) -> int:
    """How many steps the job's ``steps`` processor has executed (over all its runs)."""
    log = svc.data_dir / "results" / svc.job(task_id)["file_uuid"] / "steps.log"
    try:
        return len(log.read_text().split())
    except OSError:
        return 0


def logged(svc: ServiceProcess, text: str) -> bool:
    try:
        return text in (svc.data_dir / "logs" / "momentry-edge.log").read_text(errors="replace")
    except OSError:
        return False


@contextlib.contextmanager
def exclusive_lock(svc: ServiceProcess) -> Iterator[None]:
    """A second real connection holding the SQLite file's write lock (BEGIN EXCLUSIVE)."""
    conn = sqlite3.connect(svc.data_dir / "momentry.db", isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def all_jobs(svc: ServiceProcess) -> list[dict[str, Any]]:
    listing = svc.get("/api/v1/jobs", params={"limit": 100})
    assert listing["total"] == len(listing["jobs"])
    return listing["jobs"]


def assert_nothing_lost_or_doubled(svc: ServiceProcess, tasks: list[str]) -> None:
    """One job per request, each with its one run, none left processing."""
    jobs = all_jobs(svc)
    assert sorted(j["task_id"] for j in jobs) == sorted(tasks)
    assert not [j for j in jobs if j["status"] == "processing"]
    for task in tasks:
        assert list(svc.job(task)["processors"]) == ["steps"]
    assert svc.status()["active_count"] == 0


@on_sqlite
def test_a_database_locked_longer_than_every_timeout_leaves_no_job_stuck(start_service):
    svc = start_service(
        service={"database_timeout": BUSY_TIMEOUT},
        queue={"max_concurrent": 1, "lease_seconds": 3},
        **{"processors.steps": {"steps": STEPS, "step_seconds": 0.1}},
    )
    tasks = [svc.submit(f"{name}.mp4", ["steps"])["task_id"] for name in ("a", "b", "c")]
    first, second, third = tasks

    # 1. The run ends while the lock is held, and recording it fails for longer than
    # every retry. Once the lock lifts the job is recovered and runs again.
    wait_for(lambda: svc.job(first)["progress"] >= 17)
    with exclusive_lock(svc):
        wait_for(lambda: steps_done(svc, first) >= STEPS, timeout=60)
        # The fault: held past every timeout, until the worker gives up recording it.
        wait_for(lambda: logged(svc, f"job {first}: the worker failed"), timeout=RETRY_WINDOW * 3)
    job = svc.wait_status(first, "completed", timeout=60)
    assert job["crash_count"] == 1, job
    assert job["processors"]["steps"]["status"] == "completed"

    # 2. The same fault on the next job, and a cancel asked while the lock is held:
    # it waits out the lock and takes effect, though the job's worker has given up.
    wait_for(lambda: svc.job(second)["progress"] >= 17, timeout=30)
    with exclusive_lock(svc):
        wait_for(lambda: steps_done(svc, second) >= STEPS, timeout=60)
        wait_for(lambda: logged(svc, f"job {second}: the worker failed"), timeout=RETRY_WINDOW * 3)
        reply: dict[str, Any] = {}
        cancel = threading.Thread(
            target=lambda: reply.update(
                svc.client.post(f"/api/v1/jobs/{second}/cancel", timeout=60).json()
            )
        )
        cancel.start()
        wait_for(lambda: logged(svc, "cancel: database is locked"), timeout=30)
    cancel.join(timeout=60)
    assert reply.get("success") is True, reply
    assert svc.wait_status(second, "cancelled", timeout=60)["error_message"] == (
        "cancelled by user"
    )

    # 3. Another job starts and completes; nothing is stuck, lost or doubled.
    svc.wait_status(third, "completed", timeout=60)
    assert_nothing_lost_or_doubled(svc, tasks)


@on_sqlite
def test_a_short_lock_is_ridden_out(start_service):
    svc = start_service(
        service={"database_timeout": BUSY_TIMEOUT},
        queue={"max_concurrent": 1, "lease_seconds": 3},
        **{"processors.steps": {"steps": 20, "step_seconds": 0.1}},
    )
    task = svc.submit("short.mp4", ["steps"])["task_id"]
    wait_for(lambda: svc.job(task)["progress"] >= 17)
    with exclusive_lock(svc):
        wait_for(lambda: steps_done(svc, task) >= 20, timeout=60)
        # Held for longer than one busy timeout (a try gave up), but shorter than the retries.
        wait_for(lambda: logged(svc, "trying again in"), timeout=RETRY_WINDOW)
    job = svc.wait_status(task, "completed", timeout=60)
    assert job["crash_count"] == 0 and job["retry_count"] == 0, job
    assert steps_done(svc, task) == 20  # ran once


def test_a_cancel_asked_before_a_kill_9_ends_the_job_cancelled(start_service):
    # Long steps: the worker does not get to see the cancel before the kill.
    svc = start_service(**{"processors.steps": {"steps": 3, "step_seconds": 5}})
    task = svc.submit("doomed.mp4", ["steps"])["task_id"]
    svc.wait_status(task, "processing")
    svc.call("POST", f"/api/v1/jobs/{task}/cancel")
    svc.kill()
    svc.start()
    job = svc.wait_status(task, "cancelled", "completed", timeout=60)
    assert job["status"] == "cancelled" and job["error_message"] == "cancelled by user"
    assert job["processors"]["steps"]["status"] == "pending"  # retry resumes it
    assert svc.status()["active_count"] == 0


@pytest.fixture(params=["data dir", "results folder"])
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A real 16 MiB filesystem (tmpfs) as the data dir of the service named "node", or as
    its results folder alone (results on a disk of their own, as the README suggests)."""
    folder = tmp_path / "node" / "data"
    if request.param == "results folder":
        folder /= "results"
    with small_filesystem(folder) as disk:
        yield disk


def test_a_full_disk_holds_jobs_back_and_loses_none(small_disk, start_service):
    svc = start_service(
        queue={"max_concurrent": 1, "lease_seconds": 3, "min_free_disk_mb": 1},
        **{"processors.steps": {"steps": 40, "step_seconds": 0.1}},
    )
    tasks = [svc.submit(f"{name}.mp4", ["steps"])["task_id"] for name in ("a", "b", "c")]
    first = tasks[0]
    wait_for(lambda: svc.job(first)["progress"] >= 10)
    filler = fill(small_disk)
    # No new job is admitted, and the status says why.
    reason = wait_for(lambda: svc.status()["blocked_reason"])
    assert "low disk space" in reason and "queue.min_free_disk_mb" in reason
    # The running job ends its steps and cannot write its result.
    wait_for(lambda: steps_done(svc, first) >= 40, timeout=60)
    time.sleep(RETRY_WINDOW + 3)  # the fault lasts past every retry
    assert [svc.job(t)["status"] for t in tasks[1:]] == ["pending", "pending"]

    filler.unlink()
    for task in tasks:
        job = svc.wait_status(task, "completed", timeout=90)
        assert job["processors"]["steps"]["status"] == "completed"
    job = svc.job(first)
    assert job["retry_count"] == 0, job  # a full disk is not the job's fault: no retry spent
    assert svc.status()["blocked_reason"] is None
    assert_nothing_lost_or_doubled(svc, tasks)


def _run_jobs_until_the_log_is_full(svc) -> Path:
    """Jobs, each logging a few lines, until the log's last page fills up; the service's
    stderr, where it says so."""
    stderr = svc.root / "service.log"
    for n in range(200):
        svc.wait_status(svc.submit(f"{n}.mp4", ["noop"])["task_id"], "completed")
        if "cannot write to" in stderr.read_text():
            break
    return stderr


@on_sqlite
def test_a_full_log_disk_is_said_once_and_the_log_goes_on_once_there_is_room(
    tmp_path, start_service
):
    with small_filesystem(tmp_path / "node" / "data" / "logs", size="1m") as logs:
        svc = start_service(service={"plugins": PLUGINS})
        filler = fill(logs)
        stderr = _run_jobs_until_the_log_is_full(svc)
        for n in range(5):  # lines lost while the disk stays full
            svc.wait_status(svc.submit(f"more{n}.mp4", ["noop"])["task_id"], "completed")
        filler.unlink()
        after = svc.submit("after.mp4", ["noop"])["task_id"]
        svc.wait_status(after, "completed")
        log_file = logs / "momentry-edge.log"
        wait_for(lambda: after in log_file.read_text())
        lines = log_file.read_text().splitlines()
        stderr = stderr.read_text()
    assert stderr.count("cannot write to") == 1 and "No space left on device" in stderr, stderr
    assert "writing to" in stderr and "again" in stderr, stderr
    assert "Logging error" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    for line in lines:  # no line cut short is left behind
        json.loads(line)


@on_sqlite
def test_a_full_log_disk_does_not_flap_between_failing_and_writing(tmp_path, start_service):
    with small_filesystem(tmp_path / "node" / "data" / "logs", size="1m") as logs:
        svc = start_service(service={"plugins": PLUGINS})
        filler = fill(logs)
        stderr = _run_jobs_until_the_log_is_full(svc)
        # A little room comes free (less than the log keeps in reserve), and is used up
        # by the lines of these jobs: the log waits for more rather than write a few
        # lines and fail again.
        os.truncate(filler, filler.stat().st_size - 16 * 1024)
        for n in range(60):
            svc.wait_status(svc.submit(f"little{n}.mp4", ["noop"])["task_id"], "completed")
        filler.unlink()
        after = svc.submit("after.mp4", ["noop"])["task_id"]
        svc.wait_status(after, "completed")
        log_file = logs / "momentry-edge.log"
        wait_for(lambda: after in log_file.read_text())
        lines = [json.loads(line) for line in log_file.read_text().splitlines()]
        stderr = stderr.read_text()
    assert stderr.count("cannot write to") == 1, stderr
    assert stderr.count("writing to") == 1 and "again (" in stderr, stderr
    gaps = [line for line in lines if "log lines lost" in line["message"]]
    assert len(gaps) == 1 and gaps[0]["level"] == "warning", gaps
    assert int(gaps[0]["message"].split()[0]) > 0, gaps
    # Said where the gap is: before the lines written once there was room again.
    assert lines.index(gaps[0]) < next(i for i, line in enumerate(lines) if after in str(line))


@on_postgres
def test_postgres_connections_cut_mid_job_leave_no_job_stuck(start_service, database_url):
    svc = start_service(
        queue={"max_concurrent": 1, "lease_seconds": 3},
        **{"processors.steps": {"steps": STEPS, "step_seconds": 0.1}},
    )
    tasks = [svc.submit(f"{name}.mp4", ["steps"])["task_id"] for name in ("a", "b")]
    first = tasks[0]
    wait_for(lambda: svc.job(first)["progress"] >= 17)
    # Every connection the service holds is ended by the server, again and again, as a
    # database restart or a failover would.
    with psycopg.connect(database_url, autocommit=True) as admin:
        for _ in range(10):
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            time.sleep(0.2)
    for task in tasks:
        svc.wait_status(task, "completed", timeout=60)
    assert_nothing_lost_or_doubled(svc, tasks)


@on_sqlite
def test_a_request_during_a_long_lock_is_503_and_changes_nothing(start_service):
    svc = start_service(service={"database_timeout": BUSY_TIMEOUT})
    with exclusive_lock(svc):
        reply = svc.client.post("/api/v1/queue/pause", timeout=60)
    assert reply.status_code == 503, reply.text
    assert reply.json()["error"]["code"] == "unavailable" and reply.headers["Retry-After"]
    assert svc.status()["paused"] is False  # nothing half done
    svc.call("POST", "/api/v1/queue/pause")  # and it is carried out once the lock is gone
    assert svc.status()["paused"] is True


def answered(svc: ServiceProcess, path: str) -> Any:
    """GET ``path``, asked again while the service answers 503: a pooled connection the
    server ended is found broken by the request that uses it."""

    def get() -> Any:
        reply = svc.client.get(path)
        assert reply.status_code in (200, 503), reply.text
        return reply.status_code == 200 and reply.json()

    return wait_for(get, timeout=30)


def ended(svc: ServiceProcess, task_id: str) -> bool:
    status = answered(svc, f"/api/v1/jobs/{task_id}")["status"]
    return status in ("completed", "failed", "partial", "cancelled")


@on_postgres
def test_postgres_connections_cut_while_a_backlog_drains_lose_and_double_nothing(
    start_service, database_url
):
    # Two parts per job on two threads, each reporting: connections are cut while a
    # part reports, and as a worker finishes one job and claims the next in one commit.
    svc = start_service(
        queue={"max_concurrent": 1, "lease_seconds": 3, "job_threads": 2},
        **{"processors.steps": {"steps": 4, "step_seconds": 0.02}},
    )
    svc.call("POST", "/api/v1/queue/pause")
    tasks = [svc.submit(f"b{i}.mp4", ["steps", "noop"])["task_id"] for i in range(8)]
    svc.call("POST", "/api/v1/queue/resume")

    def storm() -> None:
        """Cut every connection the service holds, again and again, for less than the
        time a state change keeps trying (a failover, not a database gone for good)."""
        with psycopg.connect(database_url, autocommit=True) as admin:
            end = time.monotonic() + STORM
            while time.monotonic() < end:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                time.sleep(0.03)

    def ended_count() -> int:
        return sum(ended(svc, t) for t in tasks)

    # A storm, then the next only once a job has ended after it: however slow the
    # machine, a state change caught in a storm has its last try after it, with the
    # database back.
    for _ in range(4):
        storm()
        before = ended_count()
        if before == len(tasks):
            break
        wait_for(lambda before=before: ended_count() > before, timeout=120)
    wait_for(lambda: all(ended(svc, t) for t in tasks), timeout=60)
    for task in tasks:
        job = answered(svc, f"/api/v1/jobs/{task}")
        assert job["status"] == "completed", (job["error_message"], job["processors"], job)
        assert {p["status"] for p in job["processors"].values()} == {"completed"}, job
        out = svc.data_dir / "results" / job["file_uuid"]
        assert (out / "steps.json").exists() and (out / "noop.json").exists()
        # Each cut is ridden out: no job was given back or retried, none ran its steps twice.
        assert (job["crash_count"], job["retry_count"]) == (0, 0), job["error_message"]
        assert len((out / "steps.log").read_text().split()) == 4
    listing = answered(svc, "/api/v1/jobs?limit=100")
    assert sorted(j["task_id"] for j in listing["jobs"]) == sorted(tasks)
    wait_for(lambda: answered(svc, "/api/v1/queue/status")["active_count"] == 0)


@pytest.fixture
def proxied(
    start_service: Callable[..., ServiceProcess], database_url: str
) -> Iterator[tuple[CuttingProxy, Callable[..., ServiceProcess]]]:
    """A CuttingProxy in front of the test database, and ``start_service`` for services
    that reach the database only through it."""
    proxy = CuttingProxy(database_url)

    def start(service: dict[str, Any] | None = None, **settings: Any) -> ServiceProcess:
        through = {**(service or {}), "database_url": proxy.url}
        return start_service(service=through, env=PLAIN_ENV, **settings)

    yield proxy, start
    proxy.close()


@on_postgres
def test_postgres_connections_cut_as_transactions_begin_leave_every_request_answered(proxied):
    proxy, start = proxied
    svc = start()
    # A restart or failover landing just after a transaction has begun, again and
    # again: the queue status (one snapshot read) meanwhile is 503, asked to retry.
    proxy.cut_after_begin.set()
    for _ in range(40):
        reply = svc.client.get("/api/v1/queue/status")
        assert reply.status_code in (200, 503), reply.text
    proxy.cut_after_begin.clear()
    assert proxy.cuts >= 40
    # The database whole again: every request is answered, none kept failing on a
    # connection the cuts ended or waiting for one, and a job runs.
    for _ in range(40):
        reply = svc.client.get("/api/v1/queue/status")
        assert reply.status_code == 200, reply.text
    task = svc.submit("after.mp4", ["noop"])["task_id"]
    svc.wait_status(task, "completed")


@on_postgres
def test_postgres_a_stalled_database_leaves_healthz_answering_and_requests_refused(proxied):
    # The database's connections stay open but nothing answers (a frozen server or path):
    # the health check still answers, a request that needs the database ends in a 503 to
    # retry, and once the database answers again all is as before.
    proxy, start = proxied
    proxy.url += "?connect_timeout=2"  # the URL's own, over the service's 10 s
    svc = start(service={"database_timeout": BUSY_TIMEOUT})
    svc.wait_status(svc.submit("before.mp4", ["noop"])["task_id"], "completed")
    proxy.answering.clear()
    try:
        with contextlib.suppress(httpx.TimeoutException):  # a request caught in the stall
            svc.client.get("/api/v1/queue/status", timeout=1)
        assert svc.client.get("/healthz", timeout=15).json()["status"] == "ok"
        reply = svc.client.get("/api/v1/queue/status", timeout=120)
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "unavailable"
        assert reply.headers["Retry-After"] == "5"
        assert svc.client.get("/healthz", timeout=15).status_code == 200
    finally:
        proxy.answering.set()
    wait_for(lambda: svc.client.get("/api/v1/queue/status").status_code == 200, timeout=120)
    svc.wait_status(svc.submit("after.mp4", ["noop"])["task_id"], "completed", timeout=60)


@on_postgres
@pytest.mark.parametrize("taken_by", ["claim", "finish_and_claim"])
def test_postgres_a_job_claimed_by_a_commit_whose_answer_was_lost_runs_at_once(proxied, taken_by):
    # The server commits a claim, then the connection ends before the service hears so:
    # the claim's worker saw it fail, yet the job is held. The next claim takes it up,
    # rather than leave it idle until its lease runs out and count a crash.
    proxy, start = proxied
    claim_statement = b"UPDATE job SET status = $1, lease_owner = $2, node = $3"
    svc = start(
        queue={"max_concurrent": 1, "lease_seconds": 5},
        **{"processors.steps": {"steps": 4, "step_seconds": 0.3}},
    )
    svc.call("POST", "/api/v1/queue/pause")
    tasks = [svc.submit(f"c{i}.mp4", ["steps"])["task_id"] for i in range(2)]
    if taken_by == "claim":
        proxy.lose_commit_answer(claim_statement)  # the first job's own claim
    svc.call("POST", "/api/v1/queue/resume")
    if taken_by == "finish_and_claim":
        # The second job is claimed in the first one's finish.
        svc.wait_status(tasks[0], "processing")
        proxy.lose_commit_answer(claim_statement)
    for task in tasks:
        job = svc.wait_status(task, "completed", timeout=60)
        assert (job["crash_count"], job["retry_count"]) == (0, 0), job
        assert steps_done(svc, task) == 4  # run once
    assert proxy.commit_answers_lost == 1
    assert logged(svc, "claimed by a commit whose answer was lost")


@on_postgres
def test_postgres_a_finish_whose_commit_answer_was_lost_is_announced(proxied):
    # The job's ending is committed, its answer lost: the finish's next try finds the job
    # ended by itself and says so (the event stream, Redis and alerts hear of it), rather
    # than take it for a job another worker took.
    proxy, start = proxied
    svc = start()
    reader = EventReader(
        svc.url, until=lambda event: event["type"] == "job.finished", token=svc.token
    )
    reader.start()
    assert reader.connected.wait(10)
    proxy.lose_commit_answer(b"UPDATE job SET status = $1, completed_at = $2")
    task = svc.submit("end.mp4", ["noop"])["task_id"]
    job = svc.wait_status(task, "completed", timeout=60)
    assert proxy.commit_answers_lost == 1
    reader.join(timeout=30)
    finished = [e for e in reader.events if e["type"] == "job.finished"]
    assert [(e["task_id"], e["status"]) for e in finished] == [(task, "completed")]
    assert (job["crash_count"], job["retry_count"]) == (0, 0), job
    assert not logged(svc, "lease lost")


@on_postgres
def test_postgres_a_cancel_whose_commit_answer_was_lost_is_answered_done(proxied):
    # The cancel is committed, its answer lost: its next try finds the job cancelled by
    # itself and answers so, not 409 "already cancelled" for a request it carried out.
    proxy, start = proxied
    svc = start()
    svc.call("POST", "/api/v1/queue/pause")
    task = svc.submit("cancelled.mp4", ["noop"])["task_id"]
    proxy.lose_commit_answer(b"UPDATE job SET status = $1, completed_at = $2")
    reply = svc.client.delete(f"/api/v1/queue/task/{task}")
    assert proxy.commit_answers_lost == 1
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "cancelled"
    assert svc.job(task)["status"] == "cancelled"


@on_postgres
def test_postgres_a_start_whose_commit_answer_was_lost_counts_one_attempt(proxied):
    # The write that carries a run's start is committed, its answer lost: the next write
    # carries the start again, and the run still shows its one attempt.
    proxy, start = proxied
    svc = start(**{"processors.steps": {"steps": 4, "step_seconds": 0.3}})
    proxy.lose_commit_answer(b"attempts = attempts + ")
    task = svc.submit("start.mp4", ["steps"])["task_id"]
    job = svc.wait_status(task, "completed", timeout=60)
    assert proxy.commit_answers_lost == 1
    assert job["processors"]["steps"]["attempts"] == 1, job
    assert (job["crash_count"], job["retry_count"]) == (0, 0), job
    assert steps_done(svc, task) == 4


PLUGINS = [
    f"workloads:{name}" for name in ("Noop", "Steps", "Flaky", "Crash", "Raise", "RaiseInFeed")
]


@on_sqlite
@pytest.mark.parametrize(
    "raises", ["MemoryError", "SystemExit", "KeyboardInterrupt", "GeneratorExit", "Unprintable"]
)
def test_a_model_that_runs_out_of_memory_or_exits_fails_its_job_and_the_service_goes_on(
    start_service, raises
):
    svc = start_service(
        service={"plugins": PLUGINS},
        queue={"max_retries": 1, "lease_seconds": 2},
        **{"processors.raise": {"raises": raises}},
    )
    task = svc.submit("heavy.mp4", ["raise"])["task_id"]
    job = svc.wait_status(task, "failed", timeout=30)
    assert raises in job["processors"]["raise"]["error"], job
    assert job["processors"]["raise"]["attempts"] == 2, job  # tried again once, then ended
    document = svc.get(f"/api/v1/files/{job['file_uuid']}/results/raise")
    assert document["status"] == "failed" and raises in document["error"], document
    # The worker that ran it goes on: the next jobs complete.
    for name in ("after1.mp4", "after2.mp4"):
        svc.wait_status(svc.submit(name, ["noop"])["task_id"], "completed", timeout=30)
    assert svc.get("/healthz")["status"] == "ok"
    wait_for(lambda: svc.status()["active_count"] == 0)


@on_sqlite
@pytest.mark.parametrize("raises", ["SystemExit", "KeyboardInterrupt"])
def test_a_frame_model_that_exits_beside_another_part_ends_its_job_not_a_thread(
    start_service, raises
):
    # A frame pass (this member and cut) beside steps, on two threads: a sys.exit in the
    # pass must not end the thread it ran on, with its job left running or its runs undone.
    svc = start_service(
        service={"plugins": PLUGINS},
        queue={"max_crashes": 2, "lease_seconds": 2, "job_threads": 2},
        **{
            "processors.raise_in_feed": {"raises": raises, "at": 2},
            "processors.steps": {"steps": 3, "step_seconds": 0.05},
        },
    )
    task = svc.submit("exits.mp4", ["steps", "raise_in_feed", "cut"])["task_id"]
    # The member's own failure, not a crash of the service: the other member of its pass
    # and the other part complete, so the job is partial.
    job = svc.wait_status(task, "partial", timeout=60)
    assert job["crash_count"] == 0, job
    failed = job["processors"]["raise_in_feed"]
    assert failed["status"] == "failed" and f"{raises}: the frame model gave up" in failed["error"]
    assert job["processors"]["steps"]["status"] == "completed", job
    assert job["processors"]["cut"]["status"] == "completed", job
    for name in ("after1.mp4", "after2.mp4"):
        svc.wait_status(svc.submit(name, ["noop"])["task_id"], "completed", timeout=30)
    assert svc.get("/healthz")["status"] == "ok"


@on_sqlite
def test_a_read_only_database_file_while_draining_is_recovered_from(start_service, unprivileged):
    svc = start_service(
        wrapper=unprivileged,
        service={"database_timeout": BUSY_TIMEOUT},
        queue={"max_concurrent": 1, "lease_seconds": 3, "job_threads": 2},
        **{"processors.steps": {"steps": 4, "step_seconds": 0.05}},
    )
    tasks = [svc.submit(f"r{i}.mp4", ["steps", "noop"])["task_id"] for i in range(6)]
    files = [svc.data_dir / f"momentry.db{tail}" for tail in ("", "-wal", "-shm")]
    wait_for(lambda: ended(svc, tasks[0]))
    for path in files:
        path.chmod(0o444)
    time.sleep(RETRY_WINDOW + 2)  # the fault: past every retry
    for path in files:
        path.chmod(0o644)
    for task in tasks:
        job = wait_for(lambda t=task: ended(svc, t) and answered(svc, f"/api/v1/jobs/{t}"), 90)
        assert job["status"] == "completed", (job["error_message"], job["processors"])
    wait_for(lambda: answered(svc, "/api/v1/queue/status")["active_count"] == 0)


@on_sqlite
def test_a_full_database_disk_is_reported_full_and_nothing_is_said_registered(
    tmp_path, start_service
):
    # The SQLite file on a disk of its own, filled; the logs are on another, so what the
    # service says about it can be read.
    with small_filesystem(tmp_path / "dbdisk") as disk:
        svc = start_service(
            service={"database_url": f"sqlite://{disk}/momentry.db"},
            ingest={"processors": ["noop"], "settle_seconds": 1},
        )
        filler = fill(disk)
        # The watcher cannot record a dropped file, and says why; it never says the file
        # was registered.
        svc.add_video("dropped.mp4")
        wait_for(lambda: logged(svc, "file(s) (database or disk is full); trying again"))
        assert not logged(svc, "registered dropped.mp4")
        # Nor can a request: the answer says why.
        svc.add_video("api.mp4")
        body = {"path": "api.mp4", "processors": ["noop"]}
        reply = svc.client.post("/api/v1/files/register", json=body)
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["message"] == (
            "the queue database is unavailable: database or disk is full"
        )
        assert "no transaction is active" not in svc.log()

        filler.unlink()
        reply = svc.client.post("/api/v1/files/register", json=body)
        assert reply.status_code in (200, 201), reply.text  # the watcher may be first
        svc.wait_status(reply.json()["task_id"], "completed")
        dropped = wait_for(
            lambda: [j for j in all_jobs(svc) if j["file_name"] == "dropped.mp4"], timeout=60
        )
        svc.wait_status(dropped[0]["task_id"], "completed")
        # Said once, of the job that exists.
        log = (svc.data_dir / "logs" / "momentry-edge.log").read_text()
        assert log.count("registered dropped.mp4 (new)") == 1
        assert f"registered dropped.mp4 (new): {dropped[0]['task_id']}" in log
        svc.stop()


@pytest.mark.parametrize("nested", [False, True], ids=["transaction", "savepoint"])
def test_a_write_that_fills_the_disk_fails_saying_so(tmp_path, nested):
    # SQLite rolls back the whole transaction itself on a full disk: what is raised is
    # that error, not the failure of the ROLLBACK (TO SAVEPOINT) that follows it.
    with small_filesystem(tmp_path / "disk", "1m") as disk:
        database = store.sqlite(disk / "momentry.db", busy_timeout=1)
        database.execute_sql("CREATE TABLE t (b BLOB)")
        blob = os.urandom(3 << 20)  # more than the disk and the page cache hold
        with pytest.raises(store.OUTAGE_ERRORS) as raised, store.write_transaction(database):
            inner = store.write_transaction(database) if nested else contextlib.nullcontext()
            with inner:
                database.execute_sql("INSERT INTO t VALUES (?)", (blob,))
        assert str(raised.value) == "database or disk is full"
        assert not database.in_transaction()
        database.execute_sql("INSERT INTO t VALUES (x'00')")  # and the connection goes on
        assert database.execute_sql("SELECT COUNT(*) FROM t").fetchone() == (1,)
        database.close()


@on_sqlite
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_file_deleted_or_replaced_under_the_service_stops_it(start_service, how):
    # Serving on would mean two databases: the file its threads opened before (gone, or
    # no longer at the path) and the one now at the path, which threads opened since see.
    svc = start_service(**{"processors.steps": {"steps": 400, "step_seconds": 0.05}})
    path = svc.data_dir / "momentry.db"
    done = svc.submit("done.mp4", ["noop"])["task_id"]
    svc.wait_status(done, "completed")
    copy = svc.root / "copy.db"
    with (
        contextlib.closing(sqlite3.connect(path)) as live,
        contextlib.closing(sqlite3.connect(copy)) as kept,
    ):
        live.backup(kept)  # a consistent copy, as `momentry-edge backup` takes
    running = svc.submit("running.mp4", ["steps"])["task_id"]
    wait_for(lambda: svc.job(running)["progress"] > 0)
    for name in ("momentry.db", "momentry.db-wal", "momentry.db-shm"):
        (svc.data_dir / name).unlink(missing_ok=True)
    if how == "replaced":
        copy.rename(path)

    # It stops by itself, saying why once, with an exit code its service manager
    # restarts it after.
    assert svc.wait_exit(timeout=60) == 1
    lines = (svc.data_dir / "logs" / "momentry-edge.log").read_text().splitlines()
    errors = [entry["message"] for entry in map(json.loads, lines) if entry["level"] == "error"]
    assert errors == [
        f"the database file {path} was {how}; stopping, to be started again on the file now there"
    ], svc.log()
    # Started again, it serves the file now at the path, and only that.
    svc.start()
    if how == "deleted":
        assert all_jobs(svc) == []
    else:
        assert [(j["task_id"], j["status"]) for j in all_jobs(svc)] == [(done, "completed")]
    after = svc.submit("after.mp4", ["noop"])["task_id"]
    svc.wait_status(after, "completed")
    assert svc.stop() == 0
