"""The client commands, run as a user runs them: the console script against a real service."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from broken_server import BrokenServer
from conftest import ServiceProcess, wait_for
from relay import Relay

TASK_ID = re.compile(r"task_[0-9a-f]{12}")


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """cli(*args, expect=0, env={}, cwd=None, input=None, reader_gone=False) -> the finished
    `momentry-edge` process; ``input`` is piped to its stdin; with ``reader_gone`` its
    stdout is a pipe closed before it writes (as `| head` closes it having read enough)."""
    # An empty data dir: no momentry.toml or token of the machine's own leaks into a test.
    home = tmp_path / "cli-home"
    home.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    base["MOMENTRY_DATA_DIR"] = str(home)

    def run(
        *args: str,
        expect: int = 0,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        input: str | None = None,
        reader_gone: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "momentry_edge.cli", *args]
        if reader_gone:
            with subprocess.Popen(
                command,
                env=base | (env or {}),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ) as popen:
                popen.stdout.close()  # type: ignore[union-attr]
                stderr = popen.communicate(timeout=60)[1]
            proc = subprocess.CompletedProcess(command, popen.returncode, "", stderr)
        else:
            proc = subprocess.run(
                command,
                env=base | (env or {}),
                cwd=cwd,
                input=input,
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert proc.returncode == expect, (
            f"{args}: exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    return run


def test_submit_pause_cancel_concurrency(start_service, cli) -> None:
    svc = start_service()
    url = ("--url", svc.url)

    assert "paused" in cli("pause", *url).stdout
    assert svc.status()["paused"] is True

    video = svc.add_video("clip one.mp4")
    out = cli("submit", str(video), "--processors", "noop", "--priority", "high", *url).stdout
    assert "clip one.mp4" in out and "position 1" in out
    task_id = TASK_ID.search(out).group()
    job = svc.job(task_id)
    assert (job["status"], job["priority"], job["file_name"]) == ("pending", "high", "clip one.mp4")
    assert list(job["processors"]) == ["noop"]

    status = json.loads(cli("status", "--json", *url).stdout)
    assert status["pending_count"] == svc.status()["pending_count"] == 1
    table = cli("status", *url).stdout
    assert "queue paused" in table and "1 pending" in table
    assert task_id in table and "clip one.mp4" in table

    refused = cli("retry", task_id, *url, expect=1)
    assert refused.stderr.startswith("error: ")
    assert "only failed, partial or cancelled jobs retry" in refused.stderr

    assert task_id in cli("cancel", task_id, *url).stdout
    assert svc.job(task_id)["status"] == "cancelled"

    cli("concurrency", "1", *url)
    assert svc.status()["max_concurrent"] == 1
    cli("concurrency", "--dynamic", *url)
    assert (svc.status()["max_concurrent"], svc.status()["dynamic_concurrency"]) == (1, True)

    # A relative PATH is resolved against the user's working directory, not the service's.
    svc.add_video("second.mp4")
    cli("submit", "second.mp4", "--processors", "noop", *url, cwd=svc.drop)
    assert "cancelled 1 waiting job" in cli("clear", "--yes", *url).stdout
    assert svc.status()["pending_count"] == 0

    outside = svc.root / "outside.mp4"
    outside.write_bytes(b"not in the drop folder")
    refused = cli("submit", str(outside), *url, expect=1)
    assert "outside.mp4" in refused.stderr and "not inside a watched folder" in refused.stderr

    garbage = svc.drop / "garbage.mp4"
    garbage.write_bytes(b"\0" * 4096)
    refused = cli("submit", str(garbage), *url, expect=1)
    assert "garbage.mp4" in refused.stderr and "rejected" in refused.stderr

    assert "queue running" in cli("resume", *url).stdout
    assert svc.status()["paused"] is False
    # A cancelled job can be retried, and now runs.
    assert "re-queued" in cli("retry", task_id, *url).stdout
    svc.wait_status(task_id, "completed")


def test_cancel_says_a_running_job_is_only_cancelling(start_service, cli) -> None:
    svc = start_service(**{"processors.steps": {"steps": 600, "step_seconds": 0.05}})
    task_id = svc.submit("long run.mp4", ["steps"])["task_id"]
    svc.wait_status(task_id, "processing")
    out = cli("cancel", task_id, "--url", svc.url).stdout
    assert out == f"{task_id}: cancelling, it stops at its next checkpoint\n"
    svc.wait_status(task_id, "cancelled")
    svc.call("POST", "/api/v1/queue/pause")
    waiting = svc.submit("waiting.mp4", ["noop"])["task_id"]
    assert cli("cancel", waiting, "--url", svc.url).stdout == f"{waiting}: cancelled\n"


def test_prioritize_and_priority_reorder_the_line(start_service, cli) -> None:
    svc = start_service()
    url = ("--url", svc.url)
    svc.call("POST", "/api/v1/queue/pause")
    tasks = [svc.submit(f"line {i}.mp4", ["noop"])["task_id"] for i in range(3)]
    last = svc.job(tasks[2])

    # Any id of the job will do: task id, job id or file uuid.
    assert cli("prioritize", str(last["id"]), *url).stdout == f"{tasks[2]}: position 1\n"
    assert svc.job(tasks[2])["priority"] == "high"
    assert cli("priority", tasks[1], "high", *url).stdout == f"{tasks[1]}: position 2\n"
    assert cli("priority", last["file_uuid"], "low", *url).stdout == f"{tasks[2]}: position 3\n"
    order = [e["task_id"] for e in svc.status()["queue"]]
    assert order == [tasks[1], tasks[0], tasks[2]]

    refused = cli("priority", tasks[0], "urgent", *url, expect=2)
    assert "invalid choice: 'urgent'" in refused.stderr
    svc.call("DELETE", f"/api/v1/queue/task/{tasks[0]}")
    refused = cli("prioritize", tasks[0], *url, expect=1)
    assert refused.stderr == f"error: job {tasks[0]} is cancelled, not waiting in line\n"


def test_status_says_why_nothing_starts_on_a_queue_that_is_not_paused(start_service, cli) -> None:
    svc = start_service(queue={"min_free_disk_mb": 10**9})  # the most it takes: 1 PB
    svc.submit("held back.mp4", ["noop"])
    wait_for(lambda: svc.status()["blocked_reason"])
    lines = cli("status", "--url", svc.url).stdout.splitlines()
    assert lines[0].startswith("queue running") and "effective 0" in lines[0], lines
    assert lines[1].startswith("nothing starts: low disk space: "), lines  # the free MB move
    assert lines[1].endswith("below queue.min_free_disk_mb = 1,000,000,000 MB"), lines


def test_jobs_filter_and_retry(start_service, cli) -> None:
    svc = start_service(queue={"max_retries": 0})
    url = ("--url", svc.url)
    svc.marker.touch()  # flaky fails while it exists; with no retries left the job is failed
    bad = svc.submit("bad.mp4", ["flaky"])["task_id"]
    good = svc.submit("good.mp4", ["noop"])["task_id"]
    svc.wait_status(bad, "failed")
    svc.wait_status(good, "completed")

    listed = json.loads(cli("jobs", "--status", "failed", "--json", *url).stdout)
    assert [j["task_id"] for j in listed["jobs"]] == [bad]
    table = cli("jobs", "--status", "failed", *url).stdout
    assert "bad.mp4" in table and "failed: flaky" in table and "good.mp4" not in table
    everything = cli("jobs", *url).stdout
    assert bad in everything and good in everything
    assert "unknown status 'bogus'" in cli("jobs", "--status", "bogus", *url, expect=1).stderr

    svc.marker.unlink()
    assert bad in cli("retry", bad, *url).stdout
    svc.wait_status(bad, "completed")


def test_token(start_service, cli) -> None:
    svc = start_service(service={"token": "s3cret"})
    url = ("--url", svc.url)

    for wrong in ((), ("--token", "guess")):
        refused = cli("status", *wrong, *url, expect=1)
        assert "missing or wrong bearer token" in refused.stderr

    cli("status", *url, env={"MOMENTRY_API_TOKEN": "s3cret"})
    # With no --token the one in the service's own config file is used.
    cli("--config", str(svc.config_path), "status", *url)


def test_without_a_service(cli) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"  # nothing listens here once the socket is closed
    for command in (("status",), ("pause",), ("submit", "x.mp4")):
        failed = cli(*command, "--url", url, expect=3)
        assert url in failed.stderr and "momentry-edge run" in failed.stderr
    # Usage errors are caught before any request is made.
    assert "expected http://" in cli("status", "--url", "localhost:8765", expect=2).stderr
    assert "give N" in cli("concurrency", "--url", url, expect=2).stderr
    for bad in ("http://[::1", "http://host:port"):
        failed = cli("status", "--url", bad, expect=2)
        assert "is not a valid URL" in failed.stderr and "Traceback" not in failed.stderr
    for port in ("0", "99999"):
        assert "a port is 1 to 65535" in cli("status", "--url", f"http://h:{port}", expect=2).stderr
    assert "expected a task id" in cli("cancel", "", "--url", url, expect=2).stderr
    assert "got '  '" in cli("cancel", "  ", "--url", url, expect=2).stderr


def test_a_failed_start_leaves_the_running_services_run_file(start_service, cli) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    # Its config says port 0: the CLI finds it only through <data_dir>/run.json.
    svc = start_service(env={"MOMENTRY_SERVICE_PORT": port})
    config = ("--config", str(svc.config_path))
    data_dir = {"MOMENTRY_DATA_DIR": str(svc.data_dir)}  # the cli fixture sets its own
    assert '"pending_count": 0' in cli(*config, "status", "--json", env=data_dir).stdout

    # Another node on the same data dir, whose start fails (the port is taken) after it
    # opened the database: it stops, and must not remove the running one's run.json.
    failed = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *config, "run"],
        env=svc.env | {"MOMENTRY_NODE_ID": "x2", "MOMENTRY_SERVICE_PORT": port},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode == 1 and "the port is in use" in failed.stderr, failed.stderr
    assert json.loads((svc.data_dir / "run.json").read_text())["pid"] == svc.proc.pid
    assert '"pending_count": 0' in cli(*config, "status", "--json", env=data_dir).stdout

    assert svc.stop() == 0
    assert not (svc.data_dir / "run.json").exists()  # its own, it does remove


def test_of_two_services_on_one_data_dir_the_one_left_running_is_found_again(
    start_service, cli, database_url, tmp_path
) -> None:
    quick = {"lease_seconds": 3}  # a heartbeat a second
    first = start_service("first", queue=quick)
    config = ("--config", str(first.config_path))
    data_dir = {"MOMENTRY_DATA_DIR": str(first.data_dir)}  # the cli fixture sets its own
    second = ServiceProcess(
        tmp_path / "second",
        database_url,
        {"service": {"node_id": "second", "data_dir": str(first.data_dir)}, "queue": quick},
    )
    second.data_dir = first.data_dir
    second.start()  # the CLI finds the newest: run.json is its now
    assert second.stop() == 0
    # The first writes run.json again once it sees it gone.
    run_file = first.data_dir / "run.json"

    def first_has_it() -> bool:
        return run_file.exists() and json.loads(run_file.read_text())["pid"] == first.proc.pid

    wait_for(first_has_it)
    status = json.loads(cli(*config, "status", "--json", env=data_dir).stdout)
    assert status["pending_count"] == 0
    assert first.stop() == 0
    assert not run_file.exists()


def test_rescan_registers_what_no_event_announced(start_service, cli) -> None:
    svc = start_service(ingest={"settle_seconds": 0})
    svc.call("POST", "/api/v1/queue/pause")
    first = cli("rescan", "--url", svc.url)
    assert first.stdout.startswith("new 0,"), first.stdout
    # Written where the watcher cannot see it, then moved in: as if dropped while it was down.
    outside = svc.root / "elsewhere"
    outside.mkdir()
    svc.add_video("late.mp4")
    (svc.drop / "late.mp4").rename(outside / "late.mp4")
    svc.stop()
    (outside / "late.mp4").rename(svc.drop / "late.mp4")
    svc.start()  # its start-up rescan finds the file
    wait_for(lambda: svc.get("/api/v1/files")["total"] == 1)
    (svc.drop / "late.mp4").unlink()
    reply = json.loads(cli("rescan", "--json", "--url", svc.url).stdout)
    # The watcher may have seen the deletion first; either way the file is missing now.
    assert reply["success"] is True and reply["new"] == 0 and reply["missing"] in (0, 1)
    assert svc.get("/api/v1/files", params={"state": "missing"})["total"] == 1


# File names that are terminal commands or Rich markup: shown literally, never obeyed.
HOSTILE = {
    "\x1b[2Jclear.mp4": "\\x1b[2Jclear.mp4",
    "\x1b]0;pwned\x07title.mp4": "\\x1b]0;pwned\\x07title.mp4",
    "[bold red]alarm.mp4": "[bold red]alarm.mp4",
}


def test_names_with_control_characters_are_shown_escaped(start_service, cli) -> None:
    svc = start_service()
    url = ("--url", svc.url)
    svc.call("POST", "/api/v1/queue/pause")  # all three stay in the queue's table
    for name in HOSTILE:
        svc.submit(name, ["noop"])  # a real file of that name in the real drop folder

    for command in ("status", "jobs"):
        out = cli(command, *url).stdout
        assert "\x1b" not in out and "\x07" not in out, repr(out)
        for shown in HOSTILE.values():
            assert shown in out, f"{command}: {shown!r} not in {out!r}"

    # Errors that quote a path: the service's message and the path typed are escaped too.
    outside = svc.root / "\x1b[2Jout.mp4"
    outside.write_bytes(b"not in the drop folder")
    refused = cli("submit", str(outside), *url, expect=1)
    assert "\x1b" not in refused.stderr and "\\x1b[2Jout.mp4" in refused.stderr
    # --json stays exact JSON: the names decode back to what they are.
    listed = json.loads(cli("jobs", "--json", *url).stdout)
    assert sorted(j["file_name"] for j in listed["jobs"]) == sorted(HOSTILE)


def test_options_before_or_after_the_command(start_service, cli) -> None:
    svc = start_service()  # the fixture runs `momentry-edge --config FILE run`
    svc.submit("one.mp4", ["noop"])
    # Client options after the command, or before it: the same answer.
    after = json.loads(cli("status", "--json", "--url", svc.url).stdout)
    before = json.loads(cli("--url", svc.url, "--json", "status").stdout)
    assert after.keys() == before.keys() and "queue" in after
    # An option that does not apply is a usage error, not silently dropped.
    assert "--url does not apply to run" in cli("--url", svc.url, "run", expect=2).stderr
    svc.stop()

    # `run --config FILE`, as people type it, starts the same service.
    run_file = svc.data_dir / "run.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "momentry_edge.cli", "run", "--config", str(svc.config_path)],
        env=svc.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def started() -> dict | None:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                info = json.loads(run_file.read_text())
            except (OSError, ValueError):
                return None
            return info if info["pid"] == proc.pid else None

        url = wait_for(started, timeout=30)["url"]
        jobs = json.loads(
            cli("jobs", "--config", str(svc.config_path), "--url", url, "--json").stdout
        )
        assert [j["file_name"] for j in jobs["jobs"]] == ["one.mp4"]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0


def test_a_second_ctrl_c_during_shutdown_exits_at_once(start_service) -> None:
    # A processor that reports only every 10 minutes: an orderly stop waits for its report.
    svc = start_service(**{"processors.steps": {"steps": 3, "step_seconds": 600}})
    task = svc.submit("slow.mp4", ["steps"])["task_id"]
    svc.wait_status(task, "processing")

    svc.proc.send_signal(signal.SIGINT)

    def http_closed() -> bool:
        try:
            svc.client.get("/healthz", timeout=2)
        except httpx.TransportError:
            return True
        return False

    wait_for(http_closed)  # shutdown has begun; it now waits for the processor
    assert svc.proc.poll() is None
    svc.proc.send_signal(signal.SIGINT)
    assert svc.proc.wait(timeout=30) == 130
    assert "exiting without waiting" in svc.log()


@pytest.fixture
def broken() -> Iterator[BrokenServer]:
    with BrokenServer().running() as server:
        yield server


def test_clear_from_a_pipe_cancels_nothing_unless_told_yes(start_service, cli) -> None:
    svc = start_service()
    url = ("--url", svc.url)
    svc.call("POST", "/api/v1/queue/pause")
    tasks = [svc.submit(f"waiting {i}.mp4", ["noop"])["task_id"] for i in range(3)]

    refused = cli("clear", *url, input="n\n", expect=2)  # echo n | momentry-edge clear
    assert "pass --yes" in refused.stderr and refused.stdout == "", refused
    assert [svc.job(t)["status"] for t in tasks] == ["pending"] * 3

    # The log says which interface cancelled what.
    cli("cancel", tasks[0], *url)
    wait_for(
        lambda: (
            f"job {tasks[0]} (waiting 0.mp4, was pending) cancelled through the CLI" in svc.log()
        )
    )
    assert "cancelled 2 waiting job(s)" in cli("clear", "--yes", *url, input="").stdout
    assert [svc.job(t)["status"] for t in tasks] == ["cancelled"] * 3
    wait_for(lambda: "queue cleared through the CLI: 2 waiting job(s) cancelled" in svc.log())


def test_retry_all_failed_and_cancel_a_folder_are_one_command_each(start_service, cli) -> None:
    svc = start_service(queue={"max_retries": 0})
    url = ("--url", svc.url)
    svc.marker.write_text("down")
    names = ["day 1/a.mp4", "day 1/close-up/b.mp4", "day 2/c.mp4"]
    tasks = [svc.submit(name, ["flaky"])["task_id"] for name in names]
    for task in tasks:
        svc.wait_status(task, "failed")
    svc.call("POST", "/api/v1/queue/pause")
    svc.marker.unlink()

    # A folder, with its subfolders, named as the file list names it.
    retried = cli("retry", "--all-failed", "--folder", "day 1", *url).stdout
    assert "re-queued 2 failed job(s)" in retried, retried
    assert [svc.job(t)["status"] for t in tasks] == ["pending", "pending", "failed"]
    said = "failed jobs in folder 'day 1' retried through the CLI: 2 back in line, 0 refused"
    wait_for(lambda: said in svc.log())
    # The folder's jobs, listed: its waiting ones, then every one of day 2.
    waiting = cli("jobs", "--folder", "day 1", "--status", "pending", "--json", *url).stdout
    assert sorted(j["task_id"] for j in json.loads(waiting)["jobs"]) == sorted(tasks[:2])
    assert "c.mp4" in cli("jobs", "--folder", "day 2", *url).stdout
    assert "no known file is in folder" in cli("jobs", "--folder", "x", *url, expect=1).stderr

    refused = cli("cancel", "--folder", "day 1", *url, input="y\n", expect=2)
    assert "pass --yes" in refused.stderr  # from a pipe, not without --yes
    typo = cli("cancel", "--folder", "day 3", "--yes", *url, expect=1)
    assert "no known file is in folder 'day 3'" in typo.stderr
    cancelled = cli("cancel", "--folder", "day 1/", "--yes", *url).stdout
    assert "cancelled 2 waiting job(s) in 'day 1/'" in cancelled, cancelled
    assert [svc.job(t)["status"] for t in tasks] == ["cancelled", "cancelled", "failed"]

    # Every folder: the one failure left (cancelled jobs are not failures).
    assert "re-queued 1 failed job(s)" in cli("retry", "--all-failed", *url).stdout
    assert svc.job(tasks[2])["status"] == "pending"
    assert svc.call("POST", "/api/v1/queue/retry", json={"foldr": "x"}, expect=400)
    cli("retry", *url, expect=2)  # neither JOB nor --all-failed


def test_a_reader_that_stops_reading_ends_a_command_quietly(start_service, cli) -> None:
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    svc.submit("waiting.mp4", ["noop"])
    for command in (("status", "--json"), ("jobs", "--json"), ("config", "show", "--json")):
        # 141 as a Unix tool killed by SIGPIPE; nothing on stderr (no BrokenPipeError).
        ended = cli(*command, "--url", svc.url, reader_gone=True, expect=141)
        assert ended.stderr == "", (command, ended.stderr)


COMMANDS = (
    ("status",),
    ("jobs",),
    ("pause",),
    ("resume",),
    ("concurrency", "2"),
    ("cancel", "task_000000000000"),
    ("retry", "task_000000000000"),
    ("prioritize", "task_000000000000"),
    ("priority", "task_000000000000", "high"),
    ("clear", "--yes"),
    ("rescan",),
    ("submit", "x.mp4"),
)


@pytest.mark.parametrize(
    "body, headers",
    [
        (b"{}", {}),
        (b'{"success": true, "paused": null, "cleared": null, "new": null}', {}),
        (b'{"success": false, "paused": true}', {}),
        (b"[1, 2]", {}),
        (b'{"success": true}', {"Content_Encoding": "gzip"}),  # not gzip at all
        (b"[" * 100_000 + b"]" * 100_000, {}),  # too deep for the JSON decoder
    ],
    ids=["empty", "nulls", "not-success", "a-list", "bad-gzip", "deep"],
)
def test_a_reply_not_of_the_documented_shape_is_an_error(broken, cli, body, headers) -> None:
    broken.answer(body, **headers)
    for command in COMMANDS:
        failed = cli(*command, "--url", broken.url, expect=1)  # and no traceback
        assert failed.stderr.startswith(f"error: unexpected reply from {broken.url}"), failed
        assert failed.stdout == "", f"{command}: a success message for a broken reply"


@pytest.mark.parametrize("status", [404, 502])
def test_an_error_page_of_another_server_is_an_unexpected_reply(broken, cli, status) -> None:
    page = b"<!DOCTYPE HTML>\n<html><head><title>Not here</title></head><body>x</body></html>\n"
    broken.answer(page, status=status, Content_Type="text/html; charset=utf-8")
    for command in COMMANDS:
        failed = cli(*command, "--url", broken.url, expect=1)  # and no traceback
        assert failed.stderr.startswith(f"error: unexpected reply from {broken.url}"), failed
        assert f"HTTP {status}" in failed.stderr and "text/html" in failed.stderr, failed
        assert "DOCTYPE" not in failed.stderr and failed.stdout == "", failed


def _listing(**changes: object) -> dict:
    """A reply that is both a good queue status and a good job list, with ``changes``."""
    entry = {"task_id": "task_1", "status": "failed", "file_name": "a.mp4", "priority": "normal"}
    entry |= {"processors": ["cut"], "failed": ["cut"], "position": 1, "progress": 40}
    entry |= {"created_at": "2026-12-04T01:02:03Z", "node": "mini-1"}
    entry |= {k: v for k, v in changes.items() if k in entry}
    nodes = [{"id": f"mini-{n}", "active": 0, "max_concurrent": 1} for n in (1, 2)]
    reply = {"paused": False, "active_count": 0, "effective_concurrency": 1}
    reply |= {"max_concurrent": 1, "dynamic_concurrency": False, "pending_count": 1}
    reply |= {"statistics": {"total_processed": 3, "total_failed": 1, "average_time": 2.5}}
    reply |= {"queue": [entry], "jobs": [entry], "total": 1, "nodes": nodes}
    return reply | {k: v for k, v in changes.items() if k not in entry}


@pytest.mark.parametrize(
    "changes, commands",
    [
        ({"statistics": {"total_processed": 3, "average_time": "fast"}}, ["status"]),
        ({"nodes": [{"id": 1}, {"id": 2}]}, ["status"]),
        ({"processors": [1, 2]}, ["status", "jobs"]),
        ({"failed": [1]}, ["status", "jobs"]),
        ({"created_at": 5}, ["status", "jobs"]),
        ({"progress": "half"}, ["status", "jobs"]),
    ],
    ids=["average-time", "nodes", "processors", "failed", "created-at", "progress"],
)
def test_a_reply_whose_entries_are_not_of_the_documented_shape_is_an_error(
    broken, cli, changes, commands
) -> None:
    broken.answer(json.dumps(_listing()).encode())
    for command in ("status", "jobs"):
        assert "a.mp4" in cli(command, "--url", broken.url).stdout  # the good reply is shown
    broken.answer(json.dumps(_listing(**changes)).encode())
    for command in commands:
        failed = cli(command, "--url", broken.url, expect=1)  # and no traceback
        assert failed.stderr.startswith(f"error: unexpected reply from {broken.url}"), failed
        assert failed.stdout == "", f"{command}: part of a broken reply shown"


def test_a_token_no_http_header_can_carry_is_a_usage_error(broken, cli, tmp_path) -> None:
    url = ("--url", broken.url)  # a server that would answer: the request is never made
    for token in ("pässwörd", "a\nb", "two words"):
        failed = cli("status", "--token", token, *url, expect=2)
        assert "the API token from --token cannot be sent" in failed.stderr, failed.stderr
        assert len(failed.stderr.splitlines()) == 1 and failed.stdout == ""
    failed = cli("jobs", *url, env={"MOMENTRY_API_TOKEN": "ü"}, expect=2)
    assert "MOMENTRY_API_TOKEN" in failed.stderr, failed.stderr
    config = tmp_path / "momentry.toml"
    config.write_text('[service]\ntoken = "tök"\n', encoding="utf-8")
    failed = cli("--config", str(config), "pause", *url, expect=2)
    assert "service.token" in failed.stderr, failed.stderr


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_submit_of_a_file_whose_job_ended_says_so_and_how_to_run_it_again(
    start_service, cli
) -> None:
    svc = start_service(queue={"max_retries": 0})
    url = ("--url", svc.url)
    done = svc.submit("done.mp4", ["noop"])["task_id"]
    svc.marker.touch()  # flaky fails while it exists; with no retries left the job is failed
    bad = svc.submit("bad.mp4", ["flaky"])["task_id"]
    svc.wait_status(done, "completed")
    svc.wait_status(bad, "failed")

    out = cli("submit", str(svc.drop / "done.mp4"), "--processors", "noop", *url).stdout
    assert f"{done} is completed: nothing queued" in out and "submit --force" in out, out
    out = cli("submit", str(svc.drop / "bad.mp4"), "--processors", "flaky", *url).stdout
    assert f"{bad} is failed: nothing queued" in out, out
    assert f"momentry-edge retry {bad}" in out, out
    assert svc.get("/api/v1/jobs")["total"] == 2  # as said: nothing was queued


def test_submit_force_is_one_request_so_a_job_starting_meanwhile_changes_nothing(
    start_service, cli
) -> None:
    svc = start_service(**{"processors.steps": {"steps": 40, "step_seconds": 0.05}})
    first = svc.submit("again.mp4", ["noop"])["task_id"]
    svc.wait_status(first, "completed")
    relay = Relay(svc.url)

    def running() -> bool:
        return any(j["status"] == "processing" for j in svc.get("/api/v1/jobs")["jobs"])

    # A request to force the scan waits until a job of the file is running: a job queued
    # by registering it first would have started by then.
    relay.holds["/deep-scan"] = lambda: wait_for(running)
    path = str(svc.drop / "again.mp4")
    with relay.running():
        out = cli(
            "submit",
            path,
            "--processors",
            "steps",
            "--force",
            "--url",
            relay.url,
            "--token",
            svc.token,
        )
    assert "error" not in out.stderr
    task = TASK_ID.search(out.stdout)[0]
    job = svc.wait_status(task, "completed")
    assert job["options"]["force"] is True and job["processors"]["steps"]["status"] == "completed"
    assert svc.get("/api/v1/jobs")["total"] == 2  # the first job and this one

    # Up to date now: forced, it runs again all the same.
    again = cli("submit", path, "--processors", "steps", "--force", "--url", svc.url).stdout
    task = TASK_ID.search(again)[0]
    job = svc.wait_status(task, "completed")
    assert job["processors"]["steps"]["status"] == "completed", job["processors"]["steps"]


def test_status_shows_the_running_jobs_and_the_head_of_a_long_line(start_service, cli) -> None:
    svc = start_service()
    svc.call("POST", "/api/v1/queue/pause")
    names = [f"backlog {i:02d}.mp4" for i in range(1, 61)]
    for name in names:
        svc.submit(name, ["noop"])

    # The API: a page of the line (50 unless asked) and the counts of all of it.
    status = svc.status()
    assert status["pending_count"] == 60 and len(status["queue"]) == 50
    assert [j["position"] for j in status["queue"]] == list(range(1, 51))
    page = svc.get("/api/v1/queue/status?limit=5&offset=55")
    assert [j["file_name"] for j in page["queue"]] == names[55:]
    assert [j["position"] for j in page["queue"]] == [56, 57, 58, 59, 60]
    assert page["pending_count"] == 60
    svc.call("GET", "/api/v1/queue/status?limit=0", expect=400)

    # The CLI: the head of the line, and how to see the rest.
    out = cli("status", "--url", svc.url).stdout
    assert "60 pending" in out and "backlog 20.mp4" in out and "backlog 21.mp4" not in out
    assert "20 of 60 waiting jobs shown" in out
    rest = cli("status", "--url", svc.url, "--offset", "58").stdout
    assert "backlog 59.mp4" in rest and "backlog 60.mp4" in rest and "backlog 58" not in rest


def test_jobs_shows_each_failure_and_a_good_upload_again_resolves_it(start_service, cli) -> None:
    # Files dropped in the folder are queued with flaky, which fails while the marker exists.
    svc = start_service(queue={"max_retries": 0}, ingest={"processors": ["flaky"]})
    svc.marker.write_text("storage down")
    svc.add_video("take.mp4")
    svc.add_video("other.mp4")
    old, other = (newest_job(svc, name, "failed") for name in ("take.mp4", "other.mp4"))
    out = cli("jobs", "--status", "failed", "--url", svc.url).stdout
    assert "upstream storage unavailable" in line_of(out, old["task_id"]), out
    assert "upstream storage unavailable" in line_of(out, other["task_id"]), out

    # The same file uploaded again, whole this time, and done: the old job is resolved.
    svc.marker.unlink()
    video = svc.drop / "take.mp4"
    video.write_bytes(video.read_bytes() + b"uploaded again")
    new = newest_job(svc, "take.mp4", "completed")
    dead = svc.get("/api/v1/queue/dead")
    assert [j["task_id"] for j in dead["jobs"]] == [other["task_id"]] and dead["total"] == 1
    listed = {j["task_id"]: j for j in svc.get("/api/v1/jobs?status=failed")["jobs"]}
    assert listed[old["task_id"]]["resolved_by"] == new["task_id"]
    assert listed[other["task_id"]]["resolved_by"] is None
    out = cli("jobs", "--status", "failed", "--url", svc.url).stdout
    assert f"(resolved: {new['task_id']} completed later)" in line_of(out, old["task_id"]), out
    assert "upstream storage unavailable" in line_of(out, other["task_id"])


def newest_job(svc: ServiceProcess, name: str, status: str) -> dict:
    """The newest job of the file ``name`` once it is ``status``."""

    def done() -> dict | None:
        files = svc.get("/api/v1/files")["files"]
        uuid = next((f["file_uuid"] for f in files if f["file_name"] == name), None)
        job = svc.job(uuid) if uuid and svc.get(f"/api/v1/files/{uuid}")["jobs"] else None
        return job if job and job["status"] == status else None

    return wait_for(done, timeout=60)


def line_of(text: str, needle: str) -> str:
    return next((row for row in text.splitlines() if needle in row), "")
