"""What the service writes is its account's alone: another account (nobody) reads neither
the queue database nor its WAL, results, logs or backups; a done run's checkpoint keeps
no result content; results are shared with a group only when a setting names it."""

from __future__ import annotations

import grp
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServiceProcess, wait_for

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another account needs root")
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def open_root(database_url: str) -> Iterator[Callable[..., ServiceProcess]]:
    """start(**settings): a service under a folder every account may pass through (pytest's
    own temp folders are 0700, which would hide a careless mode), stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="momentry-privacy-"))
    root.chmod(0o755)
    started: list[ServiceProcess] = []

    def start(**settings: dict[str, Any]) -> ServiceProcess:
        svc = ServiceProcess(root / f"node{len(started)}", database_url, settings)
        started.append(svc)
        return svc.start()

    try:
        yield start
    finally:
        for svc in started:
            if svc.proc and svc.proc.poll() is None:
                svc.proc.kill()
                svc.proc.wait()
        shutil.rmtree(root)


def as_nobody(*command: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*NOBODY, *command], capture_output=True, timeout=30)


def readable_by_nobody(path: Path) -> bool:
    command = ("ls", str(path)) if path.is_dir() else ("head", "-c", "1", str(path))
    return as_nobody(*command).returncode == 0


def cli(svc: ServiceProcess, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(svc.config_path), *args],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc


def closed_said(svc: ServiceProcess) -> list[str]:
    """The lines of the service's log file (not its stderr) saying it closed the data dir."""
    logged = svc.log().split("--- stderr ---")[0]
    return [line for line in logged.splitlines() if "made the data dir's files private" in line]


def modes(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` (itself included): its mode, octal."""
    found = {".": f"{stat.S_IMODE(root.stat().st_mode):04o}"}
    for here, folders, files in os.walk(root):
        for name in folders + files:
            path = Path(here, name)
            found[str(path.relative_to(root))] = f"{stat.S_IMODE(path.lstat().st_mode):04o}"
    return found


@SQLITE
def test_another_account_reads_nothing_the_service_wrote(open_root):
    svc = open_root(service={"backup_interval": 0.5})
    svc.add_video("client footage.mp4")
    assert readable_by_nobody(svc.drop / "client footage.mp4")  # the folders let it through
    task = svc.submit("client footage.mp4", ["steps"])["task_id"]
    svc.wait_status(task, "completed")
    cli(svc, "backup", "--results")
    # One taken by hand, one or more by the schedule.
    wait_for(lambda: len(list((svc.data_dir / "backups").glob("*/manifest.json"))) >= 2)
    data = svc.data_dir
    database = data / "momentry.db"
    assert (data / "momentry.db-wal").exists()  # the service still runs: its WAL is there
    private = [
        data,
        database,
        data / "momentry.db-wal",
        data / "momentry.db-shm",
        data / "logs" / "momentry-edge.log",
        data / "results",
        data / "backups",
        data / "run.json",
    ]
    assert [p for p in private if readable_by_nobody(p)] == []
    # Not through a folder's own mode either: each is private in its own right.
    svc.stop()
    table = modes(data)
    open_ones = {path: mode for path, mode in table.items() if int(mode, 8) & 0o077}
    assert open_ones == {}, json.dumps(table, indent=1)
    for path, mode in table.items():
        kind = "d" if (data / path).is_dir() else "f"
        print(f"{kind} {mode} {path}")  # the table of modes (pytest -s)
    assert any(path.endswith("steps.json") for path in table)
    assert sum(path.endswith("manifest.json") for path in table) >= 2


@SQLITE
def test_a_done_run_keeps_no_result_content_in_its_checkpoint(open_root):
    svc = open_root()
    task = svc.submit("talk.mp4", ["steps"])["task_id"]
    svc.wait_status(task, "completed")
    svc.stop()
    with sqlite3.connect(svc.data_dir / "momentry.db") as conn:
        rows = conn.execute("SELECT last_checkpoint FROM processor_run").fetchall()
    kept = [json.loads(row[0]) for row in rows]
    # The steps processor saves {"frame", "timestamp", "partial"} after each step.
    assert kept == [{"frame": 5, "timestamp": pytest.approx(0.25)}]


@SQLITE
def test_a_data_dir_left_open_is_made_private_at_start(open_root, tmp_path):
    svc = open_root()
    svc.stop()
    data = svc.data_dir
    data.chmod(0o755)  # as an earlier version left it
    (data / "momentry.db").chmod(0o644)
    (data / "logs" / "momentry-edge.log").chmod(0o644)
    assert readable_by_nobody(data / "momentry.db")
    svc.start()
    assert not readable_by_nobody(data / "momentry.db")
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "momentry.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "logs" / "momentry-edge.log").stat().st_mode) == 0o600
    said = closed_said(svc)
    assert len(said) == 1 and "0755 -> 0700" in said[0] and "momentry.db 0644 -> 0600" in said[0]
    svc.restart()
    said = closed_said(svc)
    assert len(said) == 1  # said once: nothing was open the second time


@SQLITE
def test_results_are_shared_with_the_group_a_setting_names(open_root):
    group = grp.getgrgid(65534).gr_name  # nobody's own group
    svc = open_root(service={"share_group": group})
    task = svc.submit("shared.mp4", ["steps"])["task_id"]
    job = svc.wait_status(task, "completed")
    document = Path(job["processors"]["steps"]["output_path"])
    assert readable_by_nobody(document), json.dumps(modes(svc.data_dir))  # in the group
    assert document.stat().st_gid == 65534 and stat.S_IMODE(document.stat().st_mode) == 0o640
    assert not readable_by_nobody(svc.data_dir / "momentry.db")  # the queue is not shared
    assert not readable_by_nobody(svc.data_dir / "logs" / "momentry-edge.log")
    assert not readable_by_nobody(svc.data_dir)  # passed through, not listed


@SQLITE
def test_a_share_group_that_does_not_exist_stops_the_start_with_its_name(open_root):
    with pytest.raises(AssertionError, match=r"service\.share_group: no group named 'no-such-grp'"):
        open_root(service={"share_group": "no-such-grp"})


def test_doctor_warns_of_a_data_dir_other_accounts_may_reach(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    config = tmp_path / "momentry.toml"
    config.write_text(f'[service]\ndata_dir = "{data}"\nport = 0\nwatch = []\n')

    said = doctor_checks(config)["data dir privacy"]
    assert said["level"] == "warning" and "mode 0755" in said["detail"], said
    data.chmod(0o700)
    assert doctor_checks(config)["data dir privacy"]["level"] == "ok"


def test_doctor_warns_of_a_redis_mirror_without_a_password(tmp_path):
    config = tmp_path / "momentry.toml"

    def redis_check(url: str) -> dict[str, str]:
        config.write_text(
            f'[service]\ndata_dir = "{tmp_path / "data"}"\nport = 0\nwatch = []\n'
            f'redis_url = "{url}"\n'
        )
        return doctor_checks(config)["redis mirror"]

    said = redis_check("redis://127.0.0.1:6379/0")
    assert said["level"] == "warning" and "no password" in said["detail"], said
    said = redis_check("redis://:s3cret-pass@127.0.0.1:6379/0")
    assert said["level"] == "ok" and "s3cret-pass" not in said["detail"], said


def doctor_checks(config: Path) -> dict[str, dict[str, str]]:
    """`doctor --json` with ``config``: its checks by name."""
    command = ["--config", str(config), "doctor", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {c["check"]: c for c in json.loads(proc.stdout)["checks"]}
