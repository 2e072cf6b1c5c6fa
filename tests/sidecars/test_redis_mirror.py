"""Job state mirrored into the Momentry system's Redis keys, on a real redis-server.

Each test runs its own redis-server on a free loopback port, so stopping it for
real disturbs nothing else on the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import ServiceProcess, wait_for
from databases import scratch_postgres
from eventstream import EventReader

from momentry_edge import config, jobs, store
from momentry_edge.sidecars import mirror
from momentry_edge.store import Job, JobStatus, MediaFile, ProcessorRun

pytestmark = pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")


class PrivateRedis:
    """redis-server on its own port, without persistence: a restart starts empty."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.password: str | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self, password: str | None = None) -> PrivateRedis:
        self.root.mkdir(parents=True, exist_ok=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.root)]
        self.password = password
        if password:
            args += ["--requirepass", password]
        log = (self.root / "redis.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=20)
        return self

    def _answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=20)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(
            self.url, decode_responses=True, socket_timeout=5, password=self.password
        )


@pytest.fixture
def private_redis(tmp_path: Path):
    server = PrivateRedis(tmp_path / "redis").start()
    yield server
    if server.proc.poll() is None:
        server.stop()


class Subscriber:
    """Every message published on momentry:progress:*, read on a thread."""

    def __init__(self, url: str) -> None:
        # No socket timeout: a quiet channel is not an error.
        self.pubsub = redis.Redis.from_url(url, decode_responses=True).pubsub()
        self.pubsub.psubscribe("momentry:progress:*")
        self.messages: list[tuple[str, dict]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for message in self.pubsub.listen():
                if message["type"] == "pmessage":
                    self.messages.append((message["channel"], json.loads(message["data"])))
        except (redis.ConnectionError, OSError, ValueError):
            pass  # the server went away at the end of the test

    def of(self, task: str) -> list[dict]:
        return [data for channel, data in self.messages if channel == f"momentry:progress:{task}"]


def mirrored(r: redis.Redis, task: str, status: str, processors: list[str]) -> bool:
    """The job's hashes and sets say ``status``, as the job table does."""
    job = r.hgetall(f"momentry:job:{task}")
    if job.get("status") != status:
        return False
    sets = {
        name
        for name in ("active", "completed", "failed")
        if r.sismember(f"momentry:jobs:{name}", task)
    }
    expected = {"processing": {"active"}, "completed": {"completed"}}[status]
    runs = [r.hgetall(f"momentry:job:{task}:processor:{name}") for name in processors]
    done = status != "completed" or all(run.get("status") == "completed" for run in runs)
    return sets == expected and all(runs) and done


def test_a_job_appears_in_the_seed_keys_and_publishes_its_progress(start_service, private_redis):
    r = private_redis.client()
    subscriber = Subscriber(private_redis.url)
    svc = start_service(
        service={"redis_url": private_redis.url},
        **{"processors.steps": {"steps": 25, "step_seconds": 0.1}},
    )
    task = svc.submit("mirrored.mp4", ["steps", "noop"])["task_id"]

    # While it runs: the job hash, its processor hash and the active set.
    wait_for(lambda: mirrored(r, task, "processing", ["steps", "noop"]))
    running = wait_for(
        lambda: (
            (h := r.hgetall(f"momentry:job:{task}:processor:steps")).get("status") == "running"
            and h
        )
    )
    assert running["name"] == "steps"
    job = r.hgetall(f"momentry:job:{task}")
    assert job["uuid"] == task and job["task_id"] == task
    assert job["file_uuid"] == svc.job(task)["file_uuid"]
    assert json.loads(job["processors"]) == ["steps", "noop"]

    svc.wait_status(task, "completed")
    wait_for(lambda: mirrored(r, task, "completed", ["steps", "noop"]))
    job = r.hgetall(f"momentry:job:{task}")
    assert job["progress"] == "100" and json.loads(job["completed"]) == ["steps", "noop"]
    steps = r.hgetall(f"momentry:job:{task}:processor:steps")
    assert steps["progress"] == "100" and steps["current"] == steps["total"] == "25"
    assert steps["output_path"].endswith("steps.json")

    # Progress on the job's channel, at most once a second although steps reported 25 times.
    wait_for(lambda: any(m["status"] == "completed" for m in subscriber.of(task)))
    messages = subscriber.of(task)
    running = [m for m in messages if m["status"] == "processing"]
    assert running and all(m["uuid"] == task for m in messages)
    assert any(0 < m["progress"] < 100 for m in running), running
    assert len(running) < 25
    times = [datetime.fromisoformat(m["at"]) for m in running]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(gap >= 0.9 for gap in gaps), gaps
    assert messages[-1]["processors"]["steps"] == {"status": "completed", "progress": 100}


def test_redis_stopped_mid_job_costs_the_job_nothing_and_the_mirror_catches_up(
    start_service, private_redis
):
    svc = start_service(
        service={"redis_url": private_redis.url},
        **{"processors.steps": {"steps": 30, "step_seconds": 0.1}},
    )
    task = svc.submit("outage.mp4", ["steps"])["task_id"]
    wait_for(lambda: mirrored(private_redis.client(), task, "processing", ["steps"]))

    private_redis.stop()
    done = svc.wait_status(task, "completed", "partial", "failed")
    assert done["status"] == "completed" and done["retry_count"] == 0, done
    assert done["processors"]["steps"]["attempts"] == 1
    # A whole job while Redis is away: queued, run and finished with no mirror at all.
    unseen = svc.submit("unseen.mp4", ["noop"])["task_id"]
    svc.wait_status(unseen, "completed")

    private_redis.start()  # empty: no persistence
    r = private_redis.client()
    wait_for(lambda: mirrored(r, task, "completed", ["steps"]), timeout=30)
    wait_for(lambda: mirrored(r, unseen, "completed", ["noop"]), timeout=30)
    assert r.smembers("momentry:jobs:active") == set()
    assert r.smembers("momentry:jobs:completed") == {task, unseen}
    assert "redis unreachable" in svc.log()


def test_redis_url_comes_from_redis_url_and_a_bad_one_stops_the_service(tmp_path):
    cfg = config.load(env={"MOMENTRY_DATA_DIR": str(tmp_path), "REDIS_URL": "redis://h:6379/2"})
    assert cfg.service.redis_url == "redis://h:6379/2"
    path = tmp_path / "momentry.toml"
    path.write_text(f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\n', encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    done = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(path), "run"],
        env=clean | {"REDIS_URL": "http://not-redis:6379"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "service.redis_url" in done.stderr and "Traceback" not in done.stderr


def _run_with_redis_url(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    """`momentry-edge run` with REDIS_URL set to ``url``, expected to stop at start. Its
    port is 1: should the URL be taken, nothing is written into a real Redis."""
    path = tmp_path / "momentry.toml"
    path.write_text(f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\n', encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(path), "run"],
        env=clean | {"REDIS_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("db", ["x", "l3", "1/2"])
def test_a_database_path_that_is_not_a_number_stops_the_service(tmp_path, db):
    # redis-py would take it for db 0: this queue's keys among another application's.
    for good in ("redis://h:6379", "redis://h:6379/", "redis://h:6379/12"):
        env = {"MOMENTRY_DATA_DIR": str(tmp_path), "REDIS_URL": good}
        assert config.load(env=env).service.redis_url == good
    done = _run_with_redis_url(tmp_path, f"redis://:secret@127.0.0.1:1/{db}")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "momentry-edge: configuration error: service.redis_url: the database (the URL's path) "
        f"must be a number, got '/{db}' (environment variable REDIS_URL)\n"
    )


def test_a_flushed_redis_gets_the_whole_mirror_back_without_waiting_for_a_change(
    start_service, private_redis
):
    svc = start_service(service={"redis_url": private_redis.url})
    task = svc.submit("flushed.mp4", ["noop"])["task_id"]
    svc.wait_status(task, "completed")
    r = private_redis.client()
    wait_for(lambda: mirrored(r, task, "completed", ["noop"]))

    # Emptied while it runs (FLUSHALL, FLUSHDB, a failover to an empty replica): the same
    # server, the same run id, and no job of this service changes afterwards.
    r.flushall()
    wait_for(lambda: mirrored(r, task, "completed", ["noop"]), timeout=30)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_two_machines_with_their_own_queues_share_one_redis(start_service, private_redis):
    r = private_redis.client()

    def leftover(queue: str | None, name: str) -> str:
        """Keys of a job no queue has: as a removed job of ``queue`` (None: an older
        version, which marked nothing) would leave them."""
        task = f"task_{name}"
        fields = {"status": "completed"} | ({"edge_queue": queue} if queue else {})
        r.hset(f"momentry:job:{task}", mapping=fields)
        r.hset(f"momentry:job:{task}:processor:noop", mapping=fields)
        r.sadd("momentry:jobs:completed", task)
        return task

    def kept(task: str) -> bool:
        return bool(
            r.exists(f"momentry:job:{task}", f"momentry:job:{task}:processor:noop") == 2
            and r.sismember("momentry:jobs:completed", task)
        )

    east = start_service("east", service={"redis_url": private_redis.url})
    a = east.submit("east.mp4", ["noop"])["task_id"]
    east.wait_status(a, "completed")
    wait_for(lambda: mirrored(r, a, "completed", ["noop"]))

    # The second machine's start rewrites its own mirror and leaves the first's alone.
    west = start_service("west", service={"redis_url": private_redis.url})
    b = west.submit("west.mp4", ["noop"])["task_id"]
    west.wait_status(b, "completed")
    wait_for(lambda: mirrored(r, b, "completed", ["noop"]))
    assert mirrored(r, a, "completed", ["noop"])
    east_queue = r.hget(f"momentry:job:{a}", "edge_queue")
    west_queue = r.hget(f"momentry:job:{b}", "edge_queue")
    assert east_queue and west_queue and east_queue != west_queue
    assert r.hget(f"momentry:job:{a}:processor:noop", "edge_queue") == east_queue

    # Each full rewrite (here at a restart) drops its own leftovers only.
    older = leftover(None, "older")
    for svc, queue in ((east, east_queue), (west, west_queue)):
        others = leftover(west_queue if svc is east else east_queue, "others")
        gone = leftover(queue, "gone")
        svc.restart()
        wait_for(lambda g=gone: not r.keys(f"momentry:job:{g}*"), timeout=30)
        assert not r.sismember("momentry:jobs:completed", gone)
        assert kept(others) and kept(older)
        assert mirrored(r, a, "completed", ["noop"]) and mirrored(r, b, "completed", ["noop"])
    assert r.smembers("momentry:jobs:completed") == {a, b, older, "task_others"}
    assert r.exists(f"momentry:edge:mirror:{east_queue}", f"momentry:edge:mirror:{west_queue}")

    # Emptied: each machine refills its own jobs, neither one's rewrite passes for the other's.
    r.flushall()
    wait_for(lambda: mirrored(r, a, "completed", ["noop"]), timeout=30)
    wait_for(lambda: mirrored(r, b, "completed", ["noop"]), timeout=30)
    assert r.smembers("momentry:jobs:completed") == {a, b}


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_nodes_of_one_postgresql_queue_mirror_it_as_one(start_service, private_redis):
    r = private_redis.client()
    first = start_service("first", service={"redis_url": private_redis.url, "node_id": "first"})
    second = start_service("second", service={"redis_url": private_redis.url, "node_id": "second"})
    tasks = [first.submit(f"shared{n}.mp4", ["noop"])["task_id"] for n in range(2)]
    for task in tasks:
        first.wait_status(task, "completed")
        wait_for(lambda t=task: mirrored(r, t, "completed", ["noop"]))
    assert len({r.hget(f"momentry:job:{task}", "edge_queue") for task in tasks}) == 1

    second.restart()  # its full rewrite covers the whole queue, whichever node ran each job
    r.flushall()
    for task in tasks:
        wait_for(lambda t=task: mirrored(r, t, "completed", ["noop"]), timeout=30)
    assert r.smembers("momentry:jobs:completed") == set(tasks)


def wait_mirrored(r: redis.Redis, tasks: list[str], status: str, timeout: float = 60) -> None:
    def all_there() -> bool:
        pipe = r.pipeline(transaction=False)
        for task in tasks:
            pipe.hget(f"momentry:job:{task}", "status")
        return all(found == status for found in pipe.execute())

    wait_for(all_there, timeout=timeout)


def test_redis_back_with_another_password_is_said_for_what_it_is(start_service, tmp_path):
    server = PrivateRedis(tmp_path / "redis").start(password="first")
    try:
        url = f"redis://:first@127.0.0.1:{server.port}/0"
        svc = start_service(service={"redis_url": url})
        task = svc.submit("before.mp4", ["noop"])["task_id"]
        wait_for(lambda: mirrored(server.client(), task, "completed", ["noop"]))

        server.stop()
        wait_for(lambda: warnings_naming(svc, "Connection refused"), timeout=30)
        server.start(password="second")
        said = wait_for(lambda: warnings_naming(svc, "AuthenticationError"), timeout=30)
        assert "invalid username-password pair" in said[-1], said
        assert len(warnings_naming(svc, "Connection refused")) == 1
    finally:
        if server.proc.poll() is None:
            server.stop()


def mirror_log(svc) -> list[tuple[str, str]]:
    """(level, message) of each line the mirror logged, from the start (svc.log() is cut)."""
    lines = (svc.data_dir / "logs" / "momentry-edge.log").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    return [
        (e["level"], e["message"])
        for e in entries
        if e["logger"] == "momentry_edge.sidecars.mirror"
    ]


def warnings_naming(svc, text: str) -> list[str]:
    return [message for level, message in mirror_log(svc) if level == "warning" and text in message]


def _failed_job(svc: ServiceProcess, r: redis.Redis, name: str) -> str:
    """The task id of a job of ``name`` that failed, once Redis lists it failed."""
    svc.marker.touch()  # flaky fails
    task = svc.submit(name, ["flaky"], retry_on_failure=False)["task_id"]
    svc.wait_status(task, "failed")
    wait_for(lambda: r.sismember("momentry:jobs:failed", task))
    return task


def test_a_set_key_of_the_wrong_type_is_replaced_and_every_job_stays_mirrored(
    start_service, private_redis
):
    r = private_redis.client()
    svc = start_service(service={"redis_url": private_redis.url})
    failed = _failed_job(svc, r, "failed.mp4")
    # More jobs than one pipeline of a full rewrite holds (200).
    svc.call("POST", "/api/v1/queue/pause")
    tasks = [svc.submit(name, ["noop"])["task_id"] for name in svc.add_copies(205)]
    wait_mirrored(r, tasks, "pending")

    r.set("momentry:jobs:failed", "a string, not a set")  # by hand, or another program
    subscriber = Subscriber(private_redis.url)
    svc.call("POST", "/api/v1/queue/resume")
    # 205 real jobs: on a loaded CI machine (PostgreSQL) their drain took over 20 s.
    wait_for(
        lambda: svc.status()["pending_count"] == 0 and svc.status()["active_count"] == 0,
        timeout=120,
    )
    wait_mirrored(r, tasks, "completed")
    # The set is the mirror's own: replaced by the real one, the failed job in it again.
    wait_for(lambda: r.type("momentry:jobs:failed") == "set")
    assert r.smembers("momentry:jobs:failed") == {failed}
    assert r.smembers("momentry:jobs:completed") == set(tasks)
    # The progress channel kept publishing throughout.
    wait_for(lambda: all(any(m["status"] == "completed" for m in subscriber.of(t)) for t in tasks))
    # Told as what it was, once, and never as an outage.
    assert len(warnings_naming(svc, "momentry:jobs:failed")) == 1, mirror_log(svc)
    assert not warnings_naming(svc, "unreachable")


def test_a_user_who_may_not_run_info_or_publish_still_gets_the_job_keys(
    start_service, private_redis
):
    admin = private_redis.client()
    # Every key under momentry:, every command but INFO, and (Redis 7's default) no channel.
    admin.execute_command("ACL", "SETUSER", "edge", "on", ">pw", "~momentry:*", "+@all", "-info")
    url = private_redis.url.replace("redis://", "redis://edge:pw@")
    svc = start_service(service={"redis_url": url})
    task = svc.submit("acl.mp4", ["noop"])["task_id"]
    svc.wait_status(task, "completed")
    wait_for(lambda: mirrored(admin, task, "completed", ["noop"]))

    # Without INFO a restart is told by the marker alone: emptied, the mirror is refilled.
    admin.flushall()
    wait_for(lambda: mirrored(admin, task, "completed", ["noop"]), timeout=30)
    later = svc.submit("later.mp4", ["noop"])["task_id"]
    svc.wait_status(later, "completed")
    wait_for(lambda: mirrored(admin, later, "completed", ["noop"]))
    # The refused PUBLISH is said once, naming the channel, and not as an outage.
    assert len(warnings_naming(svc, "PUBLISH momentry:progress:")) == 1, mirror_log(svc)
    assert not warnings_naming(svc, "unreachable")


def test_a_retry_falling_due_while_the_queue_is_paused_reaches_redis_and_the_stream(
    start_service, private_redis
):
    r = private_redis.client()
    svc = start_service(service={"redis_url": private_redis.url}, queue={"retry_delay": 2})
    reader = EventReader(svc.url, until=lambda e: e["type"] == "job.retry_due", token=svc.token)
    reader.start()
    assert reader.connected.wait(10)
    svc.marker.touch()  # flaky fails, and is retried
    task = svc.submit("retried.mp4", ["flaky"], max_retries=5)["task_id"]
    svc.wait_status(task, "retrying")
    svc.call("POST", "/api/v1/queue/pause")
    wait_for(lambda: r.hget(f"momentry:job:{task}", "status") == "retrying")

    # Its time comes while the queue is paused: back in line, waiting for the resume.
    svc.wait_status(task, "pending")
    wait_for(lambda: r.hget(f"momentry:job:{task}", "status") == "pending")
    reader.join(20)
    assert {"type": "job.retry_due", "task_id": task}.items() <= reader.events[-1].items()


@pytest.mark.parametrize(
    "how", ["register", "deep-scan", "deep-scan with more processors"], ids=str
)
def test_a_request_raising_a_waiting_jobs_priority_reaches_redis_and_the_stream(
    start_service, private_redis, how
):
    r = private_redis.client()
    svc = start_service(service={"redis_url": private_redis.url})
    svc.call("POST", "/api/v1/queue/pause")
    queued = svc.submit("waiting.mp4", ["noop"])
    task = queued["task_id"]
    wait_for(lambda: r.hget(f"momentry:job:{task}", "priority") == "normal")
    reader = EventReader(svc.url, until=lambda e: e["type"] == "job.priority", token=svc.token)
    reader.start()
    assert reader.connected.wait(10)

    if how == "register":
        again = svc.submit("waiting.mp4", ["noop"], priority="high", expect=200)
    else:
        processors = ["noop", "steps"] if how.endswith("processors") else ["noop"]
        again = svc.call(
            "POST",
            f"/api/v1/file/{queued['file_uuid']}/deep-scan",
            json={"processors": processors, "priority": "high"},
        )
    assert again["task_id"] == task and again["deduplicated"] is True
    assert svc.job(task)["priority"] == "high"
    wait_for(lambda: r.hget(f"momentry:job:{task}", "priority") == "high")
    reader.join(20)
    priority = [e for e in reader.events if e["type"] == "job.priority"]
    assert priority and {"task_id": task, "priority": "high"}.items() <= priority[0].items()


def test_a_full_rewrite_leaves_an_unchanged_jobs_updated_at_alone(start_service, private_redis):
    r = private_redis.client()
    svc = start_service(service={"redis_url": private_redis.url})
    task = _failed_job(svc, r, "unchanged.mp4")
    before = r.hgetall(f"momentry:job:{task}")
    rewrite = f"momentry:edge:mirror:{before['edge_queue']}"
    started = r.get(rewrite)

    svc.restart()  # its start rewrites the whole mirror
    wait_for(lambda: r.get(rewrite) != started)
    assert r.hgetall(f"momentry:job:{task}") == before

    # A change is what moves it.
    svc.marker.unlink()
    svc.call("POST", f"/api/v1/jobs/{task}/retry")
    svc.wait_status(task, "completed")
    wait_for(lambda: r.hget(f"momentry:job:{task}", "status") == "completed")
    assert r.hget(f"momentry:job:{task}", "updated_at") > before["updated_at"]


@pytest.mark.parametrize(
    "query",
    ["db=5", "ssl_cert_reqs=bogus", "socket_timeout=soon"],
)
def test_a_url_whose_query_redis_py_cannot_use_stops_the_service(tmp_path, query):
    done = _run_with_redis_url(tmp_path, f"redis://:secret@127.0.0.1:1/0?{query}")
    assert done.returncode == 2, done.stderr
    assert "service.redis_url" in done.stderr and "Traceback" not in done.stderr
    assert "secret" not in done.stderr


def test_a_parked_jobs_failed_document_reaches_redis_without_waiting_for_a_rewrite(
    start_service, private_redis
):
    r = private_redis.client()
    svc = start_service(service={"redis_url": private_redis.url}, queue={"max_crashes": 1})
    task = svc.submit("poison.mp4", ["crash"])["task_id"]
    assert svc.wait_exit() == -signal.SIGKILL
    svc.start()  # parks the job, then writes the document its crashed worker could not
    job = svc.wait_status(task, "failed")
    path = job["processors"]["crash"]["output_path"]
    assert path and path.endswith("/crash.json")
    key = f"momentry:job:{task}:processor:crash"
    wait_for(lambda: r.hget(key, "output_path") == path, timeout=10)


def test_a_full_rewrite_reads_the_job_table_a_page_at_a_time(private_redis, tmp_path):
    # PostgreSQL hands the client a query's whole result at once: the rewrite every 10
    # minutes read every job of the history in one query (~100 MB at 60,000 jobs).
    with scratch_postgres() as url:
        database = store.connect(url, tmp_path / "data")
        try:
            jobs.init_queue_state(2, False)
            tasks = []
            with database.atomic():
                for i in range(450):  # pages of 200, 200 and 50
                    record = MediaFile.create(
                        file_uuid=f"{i:032x}", path=f"/drop/{i}.mp4", watch_root="/drop",
                        rel_path=f"{i}.mp4", name=f"{i}.mp4",
                    )  # fmt: skip
                    job = Job.create(
                        task_id=f"task_{i:012x}", file=record, status=JobStatus.COMPLETED,
                        seq=i, processors=["noop"], max_retries=0, completed_at=i,
                    )  # fmt: skip
                    ProcessorRun.create(job=job, processor="noop", position=0, status="completed")
                    tasks.append(job.task_id)
            largest = 0  # rows of the job table in one result
            execute_sql = database.execute_sql

            def counting(sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
                nonlocal largest
                cursor = execute_sql(sql, params, *args, **kwargs)
                if sql.startswith("SELECT") and 'FROM "job"' in sql:
                    largest = max(largest, cursor.rowcount)
                return cursor

            database.execute_sql = counting
            rewriter = mirror.RedisMirror(private_redis.url)
            rewriter._queue = store.queue_id()
            rewriter._resync()
            rewriter.stop()
            r = private_redis.client()
            assert all(r.hget(mirror.job_key(task), "status") == "completed" for task in tasks)
            assert r.scard(mirror.set_key("completed")) == 450
            assert 0 < largest <= mirror.BATCH, largest
        finally:
            database.close()


def test_a_forgotten_file_s_jobs_leave_the_mirror(start_service, private_redis):
    r = private_redis.client()
    svc = start_service(service={"redis_url": private_redis.url})
    kept = svc.submit("kept.mp4", ["noop"])["task_id"]
    reply = svc.submit("withdrawn.mp4", ["noop"])
    task = reply["task_id"]
    for each in (kept, task):
        svc.wait_status(each, "completed")
        wait_for(lambda each=each: mirrored(r, each, "completed", ["noop"]))
    (svc.drop / "withdrawn.mp4").unlink()
    svc.call("POST", f"/api/v1/files/{reply['file_uuid']}/forget")
    wait_for(lambda: not r.exists(f"momentry:job:{task}"))
    assert not r.exists(f"momentry:job:{task}:processor:noop")
    assert not r.sismember("momentry:jobs:completed", task)
    named = [key for key in r.scan_iter() if task in key]
    named += [
        key
        for key in r.scan_iter()
        if r.type(key) == "hash" and reply["file_uuid"] in json.dumps(r.hgetall(key))
    ]
    assert named == []
    assert mirrored(r, kept, "completed", ["noop"])  # the other file's job stays
