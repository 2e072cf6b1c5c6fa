"""Several service processes (nodes) sharing one PostgreSQL queue."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from conftest import ServiceProcess, wait_for
from receiver import receiving

from momentry_edge.upkeep import backup

pytestmark = pytest.mark.parametrize("database_url", ["postgres"], indirect=True)

ALL = [f"workloads:{name}" for name in ("Noop", "Steps", "Flaky", "Crash")]


def node(start_service, name, **settings):
    service = {"node_id": f"node-{name}"} | settings.pop("service", {})
    return start_service(name, service=service, **settings)


def completed(svc) -> int:
    return svc.get("/api/v1/jobs", params={"status": "completed", "limit": 1})["total"]


def test_two_nodes_drain_500_jobs_each_exactly_once(start_service):
    quick = {"processors.steps": {"steps": 1, "step_seconds": 0}, "queue": {"max_concurrent": 3}}
    a = node(start_service, "a", **quick)
    b = node(start_service, "b", **quick)
    a.call("POST", "/api/v1/queue/pause")
    names = a.add_copies(500)
    tasks = [a.submit(name, ["steps"])["task_id"] for name in names]
    assert len(set(tasks)) == 500
    status = b.status()
    assert status["pending_count"] == 500 and status["paused"] is True
    assert {n["id"] for n in status["nodes"]} == {"node-a", "node-b"}

    b.call("POST", "/api/v1/queue/resume")
    wait_for(lambda: completed(a) == 500, timeout=180, interval=0.5)

    runs: dict[str, int] = {}
    per_node = {}
    for svc in (a, b):
        logs = list((svc.data_dir / "results").glob("*/steps.log"))
        per_node[svc.root.name] = len(logs)
        for log in logs:
            runs[log.parent.name] = runs.get(log.parent.name, 0) + len(log.read_text().split())
    assert len(runs) == 500, "no job lost"
    assert set(runs.values()) == {1}, "no job ran twice"
    assert per_node["a"] > 0 and per_node["b"] > 0, per_node
    assert a.get("/api/v1/jobs", params={"limit": 1})["total"] == 500


def test_kill_9_of_one_node_lets_the_other_finish_from_the_checkpoint(start_service):
    slow = {
        # Long enough that node b is up before node a could finish, even on a busy machine.
        "processors.steps": {"steps": 150, "step_seconds": 0.1},
        "queue": {"lease_seconds": 2},
    }
    a = node(start_service, "a", **slow)
    task = a.submit("shared.mp4", ["steps"])["task_id"]
    wait_for(lambda: a.job(task)["processors"]["steps"].get("current", 0) >= 10)
    assert a.job(task)["node"] == "node-a"
    b = node(start_service, "b", **slow)
    a.kill()

    job = b.wait_status(task, "completed", timeout=60)
    assert job["node"] == "node-b" and job["crash_count"] == 1
    result = json.loads((b.data_dir / "results" / job["file_uuid"] / "steps.json").read_text())
    assert result["result"]["resumed_from"] >= 10
    done_on_a = (a.data_dir / "results" / job["file_uuid"] / "steps.log").read_text().split()
    done_on_b = (b.data_dir / "results" / job["file_uuid"] / "steps.log").read_text().split()
    assert sorted(set(map(int, done_on_a + done_on_b))) == list(range(150))
    assert len(done_on_a) + len(done_on_b) <= 151, "at most the step in flight ran twice"


def test_a_job_needing_a_processor_only_node_b_has_runs_on_b(start_service):
    a = node(start_service, "a", service={"plugins": ALL[:2]}, queue={"max_concurrent": 4})
    b = node(
        start_service,
        "b",
        service={"plugins": ALL},
        queue={"max_concurrent": 1},
        **{"processors.steps": {"steps": 5, "step_seconds": 0.1}},
    )
    nodes = {n["id"]: n for n in a.status()["nodes"]}
    assert "flaky" not in nodes["node-a"]["processors"]
    assert "flaky" in nodes["node-b"]["processors"]

    # Node b's jobs take 0.5 s each (steps), so the others wait long enough in line for
    # node a to take them: noop jobs alone, b could run them all before a heard of them.
    only_b = [b.submit(f"b{i}.mp4", ["steps", "flaky"])["task_id"] for i in range(4)]
    anyone = [b.submit(f"x{i}.mp4", ["noop"])["task_id"] for i in range(4)]
    for task in only_b:
        job = b.wait_status(task, "completed")
        assert job["node"] == "node-b" and job["retry_count"] == 0
        assert job["processors"]["flaky"]["attempts"] == 1, "node-a never tried it"
    for task in anyone:
        b.wait_status(task, "completed")
    assert "node-a" in {b.job(t)["node"] for t in anyone}, "the idle node took the others"


def test_pause_through_one_node_stops_admission_on_both(start_service):
    a = node(start_service, "a")
    b = node(start_service, "b")
    assert a.call("POST", "/api/v1/queue/pause")["paused"] is True
    tasks = [b.submit(f"p{i}.mp4", ["noop"])["task_id"] for i in range(4)]
    tasks += [a.submit(f"q{i}.mp4", ["noop"])["task_id"] for i in range(4)]
    wait_for(lambda: b.status()["pending_count"] == 8)
    time.sleep(1.5)  # both nodes had time to start something if they were going to
    assert {a.job(t)["status"] for t in tasks} == {"pending"}
    assert b.status()["paused"] is True and b.status()["active_count"] == 0

    b.call("POST", "/api/v1/queue/resume")
    for task in tasks:
        a.wait_status(task, "completed")


SKEWED_CLOCK = Path(__file__).resolve().parent / "skewed_clock"


def skewed(seconds: float) -> dict[str, str]:
    """The environment of a node whose machine's clock is ``seconds`` off."""
    path = [str(SKEWED_CLOCK), str(SKEWED_CLOCK.parent), os.environ.get("PYTHONPATH", "")]
    return {"CLOCK_SKEW_SECONDS": str(seconds), "PYTHONPATH": os.pathsep.join(filter(None, path))}


def steps_run(job: dict, *nodes) -> list[int]:
    """The steps a job's run executed, on any node, in order of step."""
    logs = [svc.data_dir / "results" / job["file_uuid"] / "steps.log" for svc in nodes]
    return sorted(int(step) for log in logs if log.exists() for step in log.read_text().split())


def steps_at(svc, job: dict) -> dict[int, float]:
    """When each step of the job's run on ``svc`` ended (the machine's monotonic clock)."""
    path = svc.data_dir / "results" / job["file_uuid"] / "steps.at"
    lines = path.read_text().splitlines() if path.exists() else []
    return {int(step): float(at) for step, at in (line.split() for line in lines)}


@pytest.mark.parametrize("skew", [-300, 300])
def test_a_node_whose_clock_is_minutes_off_keeps_the_queue_right(start_service, skew):
    settings = {
        "processors.steps": {"steps": 40, "step_seconds": 0.05},
        "queue": {"max_concurrent": 1, "lease_seconds": 2},
    }
    a = node(start_service, "a", **settings)
    a.call("POST", "/api/v1/queue/pause")
    first = a.submit("first.mp4", ["steps"])["task_id"]
    b = node(start_service, "b", env=skewed(skew), **settings)
    second = b.submit("second.mp4", ["steps"])["task_id"]
    # The order in line is the order of submission, whichever node's clock stamped it.
    assert [b.job(t)["position"] for t in (first, second)] == [1, 2]
    # Each node sees the other as live.
    for svc in (a, b):
        assert {n["id"] for n in svc.status()["nodes"]} == {"node-a", "node-b"}

    # One job on each node: neither takes the one the other runs and renews the lease of.
    a.call("POST", "/api/v1/queue/resume")
    ran = [a.wait_status(task, "completed") for task in (first, second)]
    assert {job["node"] for job in ran} == {"node-a", "node-b"}
    for job in ran:
        assert job["crash_count"] == 0, job
        assert steps_run(job, a, b) == list(range(40)), "no step ran twice"

    # A job the skewed node held when it died is recovered once its lease has run out.
    a.stop()
    third = b.submit("third.mp4", ["steps"])["task_id"]
    wait_for(lambda: b.job(third)["progress"] >= 10)
    b.kill()
    a.start()
    job = a.wait_status(third, "completed")
    assert job["node"] == "node-a" and job["crash_count"] == 1


@contextlib.contextmanager
def own_login(database_url: str, name: str) -> Iterator[tuple[str, Callable[[bool], None]]]:
    """A login role of its own for one node: (its database URL, cut(on)). ``cut(True)``
    ends its connections and refuses new ones, as a network partition would for that
    node alone; ``cut(False)`` lets it back in."""
    role = f"{name}_{secrets.token_hex(3)}"
    admin = psycopg.connect(database_url, autocommit=True)
    admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')

    def cut(on: bool) -> None:
        admin.execute(f'ALTER ROLE "{role}" {"NOLOGIN" if on else "LOGIN"}')
        if on:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )

    try:
        yield database_url.replace("://postgres@", f"://{role}@", 1), cut
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
        admin.execute(f'DROP ROLE "{role}"')
        admin.close()


def test_a_node_cut_off_past_its_lease_stops_before_another_takes_its_job(
    start_service, database_url
):
    total = 150
    settings = {
        "processors.steps": {"steps": total, "step_seconds": 0.1},
        # Heartbeats every lease/3: with 2 s, a runner loaded by the whole suite once let
        # node b's own lease run out too (a second takeover); 4 s keeps one takeover.
        "queue": {"lease_seconds": 4},
    }
    with own_login(database_url, "node_a") as (url, cut):
        a = node(start_service, "a", service={"database_url": url}, **settings)
        task = a.submit("cut.mp4", ["steps"])["task_id"]
        wait_for(lambda: a.job(task)["processors"]["steps"].get("current", 0) >= 10)
        b = node(start_service, "b", **settings)
        cut(True)
        # Node b takes the job over once node a's lease has run out, from its checkpoint.
        wait_for(lambda: b.job(task)["node"] == "node-b")
        wait_for(lambda: len(steps_at(b, b.job(task))) >= 10)
        cut(False)
        job = b.wait_status(task, "completed")
        # Node a is back at work.
        after = a.submit("after.mp4", ["noop"])["task_id"]
        a.wait_status(after, "completed")
    assert job["node"] == "node-b" and job["crash_count"] == 1
    on_a, on_b = (steps_at(svc, job) for svc in (a, b))
    assert sorted(set(on_a) | set(on_b)) == list(range(total))
    # Steps node a did while cut off were not saved and ran again on b, but not at once:
    # a stopped (but for the step in flight) before b began.
    assert sorted(on_a.values())[-2] < min(on_b.values()), "the job ran on both nodes at once"
    assert min(on_b) <= max(on_a) + 1, "node b went on from node a's checkpoint"


def test_a_node_whose_housekeeping_is_held_up_keeps_its_heartbeat_and_its_job(
    start_service, database_url, tmp_path
):
    # Node a's scheduled backup (pg_dump, on its own thread) waits for a lock
    # the test holds, for several leases, while a job that never reports runs on node a.
    lease = 2
    hold = tmp_path / "quiet.hold"
    hold.touch()
    settings = {
        "queue": {"lease_seconds": lease},
        "processors.quiet": {"hold_while_exists": str(hold)},
    }
    plugins = [*ALL, "workloads:Quiet"]
    a = node(start_service, "a", service={"plugins": plugins, "backup_interval": 1}, **settings)
    task = a.submit("held.mp4", ["quiet"])["task_id"]
    wait_for(lambda: a.job(task)["processors"]["quiet"]["status"] == "running")
    assert a.job(task)["node"] == "node-a"
    b = node(start_service, "b", service={"plugins": plugins}, **settings)
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE held_up (n integer)")  # in the schema pg_dump copies
        with admin.transaction():
            admin.execute("LOCK TABLE held_up IN ACCESS EXCLUSIVE MODE")
            waiting = (
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'held_up'::regclass"
            )
            wait_for(lambda: admin.execute(waiting).fetchone()[0] > 0)
            held_until = time.monotonic() + 3 * lease
            # Less than a scheduled backup waits for a lock before it gives up.
            assert 3 * lease < backup.SCHEDULED_LOCK_WAIT
            while time.monotonic() < held_until:
                job = b.job(task)
                assert (job["status"], job["node"], job["crash_count"]) == (
                    "processing",
                    "node-a",
                    0,
                ), "node b left node a's job alone"
                live = {n["id"] for n in b.status()["nodes"]}
                assert "node-a" in live, "node b sees node a alive: its last_seen is fresh"
                time.sleep(0.2)
    hold.unlink()
    job = a.wait_status(task, "completed")
    assert job["node"] == "node-a" and job["crash_count"] == 0
    assert job["processors"]["quiet"]["attempts"] == 1
    a.stop()  # its heartbeat ends before it leaves: it does not look alive again
    time.sleep(lease)
    assert {n["id"] for n in b.status()["nodes"]} == {"node-b"}


def test_results_a_node_wrote_are_served_by_the_api_of_every_node(start_service):
    # Node a serves the API and runs no jobs; node b, with its own data dir, runs them.
    a = node(start_service, "a", queue={"worker_enabled": False})
    b = node(start_service, "b")
    task = a.submit("served.mp4", ["steps"])["task_id"]
    job = a.wait_status(task, "completed")
    assert job["node"] == "node-b"
    written = b.get(f"/api/v1/files/{job['file_uuid']}/results/steps")
    assert written["status"] == "completed" and written["task_id"] == task
    assert a.get(f"/api/v1/files/{job['file_uuid']}/results/steps") == written


def test_one_node_steers_jobs_that_run_or_wait_on_another(start_service):
    # Node a serves the API and runs no jobs; node b runs one at a time.
    a = node(start_service, "a", queue={"worker_enabled": False})
    b = node(
        start_service,
        "b",
        queue={"max_concurrent": 1},
        **{"processors.steps": {"steps": 200, "step_seconds": 0.05}},
    )
    running, second, third = (a.submit(f"s{i}.mp4", ["steps"])["task_id"] for i in range(3))
    wait_for(lambda: a.job(running)["progress"] > 0)
    # The view from node a shows the job node b runs, and the line behind it.
    queue = a.status()["queue"]
    assert [(e["task_id"], e["status"], e.get("node"), e.get("position")) for e in queue] == [
        (running, "processing", "node-b", None),
        (second, "pending", None, 1),
        (third, "pending", None, 2),
    ]
    nodes = {n["id"]: n for n in a.status()["nodes"]}
    assert nodes["node-b"]["active"] == 1 and nodes["node-a"]["active"] == 0
    # So does `momentry-edge status` asked of node a: which node runs the job, too.
    shown = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--url", a.url, "status"],
        env=a.env | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {word: line.split() for line in shown.splitlines() for word in line.split()}
    assert rows[running][-1] == "node-b" and "processing" in rows[running]
    assert rows[second][0] == "1" and rows[third][0] == "2"
    assert "nodes: node-a 0/" in shown and "node-b 1/1" in shown

    # Through node a: the last job to the front, the running one cancelled.
    reply = a.call("POST", f"/api/v1/queue/prioritize/{a.job(third)['file_uuid']}")
    assert reply["position"] == 1
    assert a.call("DELETE", f"/api/v1/queue/task/{running}")["status"] == "cancelling"
    job = a.wait_status(running, "cancelled")
    assert job["processors"]["steps"]["status"] == "pending"  # kept to do, with its checkpoint
    assert 0 < job["processors"]["steps"]["current"] < 200
    # Node b stopped it and went on with the job put first.
    wait_for(lambda: a.job(third)["status"] == "processing")
    assert a.job(third)["node"] == "node-b" and a.job(second)["position"] == 1
    assert b.status()["active_count"] == 1


def test_a_node_whose_connections_are_cut_briefly_keeps_its_job(start_service, database_url):
    total = 60
    settings = {
        "processors.steps": {"steps": total, "step_seconds": 0.05},
        "queue": {"lease_seconds": 2},
    }
    with own_login(database_url, "node_a") as (url, cut):
        a = node(start_service, "a", service={"database_url": url}, **settings)
        task = a.submit("brief.mp4", ["steps"])["task_id"]
        b = node(start_service, "b", **settings)
        wait_for(lambda: a.job(task)["processors"]["steps"].get("current", 0) >= 5)
        for _ in range(3):  # a server restart's worth: every connection ended, then back
            cut(True)
            cut(False)
        job = b.wait_status(task, "completed")
    assert job["node"] == "node-a" and job["crash_count"] == 0
    assert steps_run(job, a, b) == list(range(total)) and not steps_at(b, job)


def test_restore_from_a_machine_whose_clock_is_ahead_still_sees_the_live_node(
    start_service, database_url, tmp_path
):
    a = node(start_service, "a")
    backup = tmp_path / "backup"
    run = [sys.executable, "-m", "momentry_edge.cli", "--config", str(a.config_path)]
    subprocess.run([*run, "backup", str(backup)], env=a.env, check=True, capture_output=True)
    # The restore is asked on another machine, whose clock is five minutes ahead.
    other = ServiceProcess(tmp_path / "other", database_url, {})
    refused = subprocess.run(
        [*run[:-1], str(other.config_path), "restore", str(backup)],
        env=other.env | skewed(300),
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "nodes are working" in refused.stderr and "node-a" in refused.stderr


def running_on(svc) -> dict[str, int]:
    """How many jobs each node runs now, as the queue's status shows them."""
    counts: dict[str, int] = {}
    for entry in svc.status()["queue"]:
        if entry["status"] == "processing":
            counts[entry["node"]] = counts.get(entry["node"], 0) + 1
    return counts


def test_each_node_keeps_its_own_concurrency_across_restarts_and_changes(start_service):
    # Jobs that run until the end of the test: each node holds as many as its limit lets it.
    long = {"processors.steps": {"steps": 100_000, "step_seconds": 0.05}}
    big = node(start_service, "a", queue={"max_concurrent": 2}, **long)
    small = node(start_service, "b", queue={"max_concurrent": 1}, **long)  # started last
    small.call("POST", "/api/v1/queue/pause")
    for i in range(8):
        small.submit(f"c{i}.mp4", ["steps"])
    small.call("POST", "/api/v1/queue/resume")

    def each_keeps(a: int, b: int) -> None:
        wait_for(lambda: running_on(big) == {"node-a": a, "node-b": b})
        assert (big.status()["max_concurrent"], small.status()["max_concurrent"]) == (a, b)
        # Each node's heartbeat reports its own limit to the others.
        wait_for(
            lambda: (
                {n["id"]: n["max_concurrent"] for n in big.status()["nodes"]}
                == {"node-a": a, "node-b": b}
            )
        )

    each_keeps(2, 1)
    big.restart()  # its config value does not become the other node's
    each_keeps(2, 1)
    small.restart()
    each_keeps(2, 1)

    # A change through one node is that node's alone, and survives its restart.
    reply = small.call("PUT", "/api/v1/queue/concurrency", json={"max_concurrent": 3})
    assert (reply["max_concurrent"], reply["effective_concurrency"]) == (3, 3)
    each_keeps(2, 3)
    small.restart()
    each_keeps(2, 3)
    big.restart()
    each_keeps(2, 3)

    # An edited config file wins over the earlier change, on that node alone.
    small.config_path.write_text(
        small.config_path.read_text().replace("max_concurrent = 1", "max_concurrent = 2")
    )
    small.restart()
    each_keeps(2, 2)


def test_a_dead_node_and_a_stalled_job_say_so_in_status(start_service, tmp_path):
    # Node a runs no jobs; node b runs one that never reports, then is killed (kill -9).
    hold = tmp_path / "quiet.hold"
    hold.touch()
    settings = {
        "service": {"plugins": [*ALL, "workloads:Quiet"]},
        "processors.quiet": {"hold_while_exists": str(hold)},
    }
    queue = {"lease_seconds": 2, "stall_seconds": 1}
    a = node(start_service, "a", queue=queue | {"worker_enabled": False}, **settings)
    b = node(start_service, "b", queue=queue, **settings)
    task = a.submit("held.mp4", ["quiet"])["task_id"]
    a.wait_status(task, "processing")

    def shown() -> str:
        return subprocess.run(
            [sys.executable, "-m", "momentry_edge.cli", "--url", a.url, "status"],
            env=a.env | {"COLUMNS": "200"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    # No progress for stall_seconds: flagged, with its node, start and last progress.
    entry = wait_for(lambda: next((e for e in a.status()["queue"] if e.get("stalled")), None))
    assert entry["task_id"] == task and entry["node"] == "node-b" and entry["progress_at"]
    said = next(line for line in shown().splitlines() if line.startswith("held.mp4 on node-b"))
    assert "started 20" in said and "last progress 20" in said and said.endswith("STALLED")
    wait_for(lambda: f"job {task} (held.mp4) on node node-b has reported no progress" in a.log())

    b.kill()
    nodes = wait_for(
        lambda: (n := {n["id"]: n for n in a.status()["nodes"]}) and not n["node-b"]["online"] and n
    )
    assert nodes["node-a"]["online"] and nodes["node-b"]["last_seen"]
    said = next(line for line in shown().splitlines() if line.startswith("node node-b"))
    assert ": OFFLINE, last heartbeat 20" in said and " UTC (" in said, said


def test_a_drained_node_finishes_its_job_and_starts_no_other(start_service):
    steps = {"processors.steps": {"steps": 30, "step_seconds": 0.1}}
    a = node(start_service, "a", queue={"worker_enabled": False}, **steps)
    b = node(start_service, "b", queue={"max_concurrent": 1}, **steps)
    running = a.submit("first.mp4", ["steps"])["task_id"]
    wait_for(lambda: a.job(running)["progress"] > 0)

    drained = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--url", b.url, "drain"],
        env=b.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "node node-b drained: its 1 running job(s) finish" in drained, drained
    assert b.status()["drained"] is True and b.status()["effective_concurrency"] == 0
    waiting = a.submit("second.mp4", ["steps"])["task_id"]
    job = a.wait_status(running, "completed")  # what it ran finishes
    assert job["node"] == "node-b"
    wait_for(lambda: "node node-b drained through the CLI" in b.log())
    assert a.job(waiting)["status"] == "pending"  # and nothing new starts there

    b.call("DELETE", "/api/v1/node/drain")
    assert a.wait_status(waiting, "completed")["node"] == "node-b"
    assert b.status()["drained"] is False


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_estimates_follow_the_nodes_that_run_jobs_and_a_job_none_can_run_says_so(
    start_service, tmp_path
):
    # Node a serves the API and runs no jobs; node b runs one at a time.
    hold = tmp_path / "quiet.hold"
    hold.touch()
    settings = {
        "service": {"plugins": [*ALL, "workloads:Quiet"]},
        "processors.quiet": {"hold_while_exists": str(hold)},
    }
    queue = {"lease_seconds": 2}
    with receiving() as rx:
        off = queue | {"worker_enabled": False}
        a = node(start_service, "a", queue=off, alerts={"url": f"{rx.url}/alerts"}, **settings)
        b = node(start_service, "b", queue=queue | {"max_concurrent": 1}, **settings)
        a.wait_status(a.submit("measure.mp4", ["steps"])["task_id"], "completed")  # a history
        running = a.submit("held.mp4", ["quiet"])["task_id"]
        a.wait_status(running, "processing")
        first, second = (a.submit(f"w{i}.mp4", ["steps"])["task_id"] for i in (1, 2))

        # Asked of node a: the line waits for node b's one slot, not for a's two.
        status = a.status()
        entries = {e["task_id"]: e for e in status["queue"]}
        end = at(entries[running]["estimated_end"])
        starts = [at(entries[task]["estimated_start"]) for task in (first, second)]
        assert starts[0] == pytest.approx(end, abs=1) and starts[1] > starts[0] + 0.1, starts
        assert entries[first]["stranded"] is None
        nodes = {n["id"]: n for n in status["nodes"]}
        assert nodes["node-a"]["worker"] == "off" and nodes["node-a"]["processors"] == []
        assert status["effective_concurrency"] == 0 and status["worker_enabled"] is False

        b.kill()  # kill -9: after its lease no live node takes jobs
        said = wait_for(lambda: a.job(first)["stranded"], timeout=30)
        assert said.startswith("no node can run this: no live node takes jobs"), said
        assert "node-a runs no jobs (queue.worker_enabled = false)" in said, said
        assert "node-b is offline since 20" in said, said
        entries = {e["task_id"]: e for e in a.status()["queue"]}
        assert entries[second]["stranded"] == said and entries[second]["estimated_start"] is None
        shown = subprocess.run(
            [sys.executable, "-m", "momentry_edge.cli", "--url", a.url, "status"],
            env=a.env | {"COLUMNS": "300"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "nodes: node-a 0/0 (runs no jobs)" in shown, shown
        assert "waiting job(s) shown: no node can run this: no live node takes jobs" in shown

        def stranded_alerts() -> list:
            return [p for p in rx.posts if "no node can run" in p.headers.get("Title", "")]

        (alert,) = wait_for(stranded_alerts, timeout=30)
        assert "waiting job(s) of steps: no node can run this" in alert.body.decode()
        wait_for(lambda: "waiting job(s) of steps: no node can run this" in a.log())

        hold.unlink()
        b.start()  # back: the line runs, and the alert was said once
        for task in (running, first, second):
            a.wait_status(task, "completed", timeout=60)
        assert a.job(first)["stranded"] is None
        assert len(stranded_alerts()) == 1


def test_a_jobs_log_reads_on_every_node_also_once_the_node_that_ran_it_is_off(start_service):
    # Node a runs no jobs; node b, with its own data dir (no shared disk), runs the job.
    a = node(start_service, "a", queue={"worker_enabled": False})
    b = node(start_service, "b")
    task = a.submit("elsewhere.mp4", ["steps"])["task_id"]
    assert a.wait_status(task, "completed")["node"] == "node-b"
    ran = f"job {task}: steps completed"
    wait_for(lambda: any(ran in line for line in a.get(f"/api/v1/jobs/{task}/log")["lines"]))
    b.kill()  # off, and its disk out of reach

    command = [sys.executable, "-m", "momentry_edge.cli", "--config", str(a.config_path)]
    shown = subprocess.run(
        [*command, "logs", "--job", task],
        env=a.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(ran in line for line in lines), shown.stdout
    assert all(task in line for line in lines)
    stamps = [line[:19] for line in lines]
    assert stamps == sorted(stamps), "one log, in the order of its times"
    # The page's log (the console reads this route) says the same.
    assert a.get(f"/api/v1/jobs/{task}/log", params={"limit": 1000})["lines"] == lines
