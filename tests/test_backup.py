"""Backup, restore and the database check at start-up, through the CLI and a real service."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ServiceProcess, wait_for
from databases import scratch_postgres
from disks import fill, small_filesystem
from receiver import receiving


def momentry(svc: ServiceProcess, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """`momentry-edge --config <the service's> ARGS`, as the operator of that service runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(svc.config_path), *args],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == expect, f"{args}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def task_ids(svc: ServiceProcess) -> list[str]:
    reply = svc.get("/api/v1/jobs", params={"limit": 1000})
    assert reply["total"] == len(reply["jobs"])
    return sorted(job["task_id"] for job in reply["jobs"])


def submit_steps(svc: ServiceProcess, count: int) -> list[str]:
    names = svc.add_copies(count)
    return sorted(svc.submit(name, ["steps"])["task_id"] for name in names)


def test_a_backup_taken_while_jobs_run_restores_every_job(start_service, database_url, tmp_path):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    # Each job takes about 2 s, two at a time: the backup is taken mid-queue.
    svc = start_service(**{"processors.steps": {"steps": 40, "step_seconds": 0.05}})
    submitted = submit_steps(svc, 10)
    wait_for(lambda: svc.status()["active_count"] == 2)

    out = momentry(svc, "backup", str(tmp_path / "backup")).stdout

    assert "backup written to" in out and "settings" in out
    assert svc.status()["active_count"] >= 1  # the service went on working meanwhile
    manifest = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert manifest["database"] == ("postgresql" if database_url else "sqlite")
    svc.stop()

    if database_url:  # into a scratch database, as on a new machine
        with scratch_postgres() as scratch:
            target = ServiceProcess(tmp_path / "restored", scratch, {})
            out = momentry(target, "restore", str(tmp_path / "backup")).stdout
            assert "restored" in out and "10 jobs" in out
            target.start()
            try:
                assert task_ids(target) == submitted
            finally:
                target.stop()
    else:  # in place: the database it replaces is kept
        out = momentry(svc, "restore", str(tmp_path / "backup")).stdout
        assert "restored" in out and "10 jobs" in out and "kept as" in out
        assert list(svc.data_dir.glob("momentry.db.before-restore-*"))
        svc.start()
        assert task_ids(svc) == submitted
    # The jobs the backup caught running go on from their checkpoints.
    if not database_url:
        for task_id in submitted:
            assert svc.wait_status(task_id, "completed", timeout=60)


def test_restore_refuses_while_the_service_runs(start_service, database_url, tmp_path):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    svc = start_service()
    submitted = submit_steps(svc, 2)
    momentry(svc, "backup", str(tmp_path / "backup"))

    refused = momentry(svc, "restore", str(tmp_path / "backup"), expect=2)

    assert "service is running" in refused.stderr and "stop it first" in refused.stderr
    assert task_ids(svc) == submitted  # untouched, still serving
    assert not list(svc.data_dir.glob("*before-restore*"))


def test_restore_refuses_while_another_data_dir_s_service_uses_the_database(
    start_service, database_url, tmp_path
):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    svc = start_service()
    submitted = submit_steps(svc, 1)
    momentry(svc, "backup", str(tmp_path / "backup"))
    # Another machine's config for a shared PostgreSQL queue; for SQLite, a second config
    # naming the same file. Neither has the running service's run.json.
    shared = database_url or f"sqlite:///{svc.data_dir / 'momentry.db'}"
    other = ServiceProcess(tmp_path / "other", shared, {})

    refused = momentry(other, "restore", str(tmp_path / "backup"), expect=2)

    assert "stop" in refused.stderr
    assert ("nodes are working" if database_url else "in use by another process") in refused.stderr
    assert task_ids(svc) == submitted


# The file check is SQLite's; PostgreSQL guards its own files.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("damage", ["middle", "header"])
def test_a_damaged_database_stops_the_start_with_the_restore_command(start_service, damage):
    svc = start_service()
    submitted = sorted(svc.submit(name, ["noop"])["task_id"] for name in svc.add_copies(60))
    for task_id in submitted:
        svc.wait_status(task_id, "completed")
    backup = Path(json.loads(momentry(svc, "backup", "--json").stdout)["path"])
    svc.stop()
    database = svc.data_dir / "momentry.db"
    with sqlite3.connect(database) as conn:  # fold the WAL in, so the file holds every page
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with database.open("r+b") as f:
        page = 4096
        f.seek(0 if damage == "header" else (database.stat().st_size // 2 // page) * page)
        f.write(os.urandom(100 if damage == "header" else page))

    svc.spawn()
    code = svc.wait_exit()

    said = (svc.root / "service.log").read_text()
    assert code == 2, said
    assert "Traceback" not in said
    assert str(database) in said and "damaged" in said
    hint = f"momentry-edge --config {svc.config_path} restore {backup}"
    assert hint in said
    # The hint works as printed.
    momentry(svc, *hint.split()[1:])
    svc.start()
    assert task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_damaged_database_without_a_backup_says_how_to_take_one(start_service):
    svc = start_service()
    svc.stop()
    database = svc.data_dir / "momentry.db"
    with database.open("r+b") as f:
        f.write(b"\0" * 100)

    svc.spawn()
    code = svc.wait_exit()

    said = (svc.root / "service.log").read_text()
    assert code == 2 and "Traceback" not in said
    assert "no backup" in said and "momentry-edge backup" in said and "restore SRC" in said


def test_scheduled_backups_keep_the_newest(start_service, database_url):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    svc = start_service(service={"backup_interval": 0.5, "backup_keep": 2})
    submit_steps(svc, 1)
    by_hand = Path(json.loads(momentry(svc, "backup", "--json").stdout)["path"])
    folder = svc.data_dir / "backups"
    seen: set[str] = set()

    def scheduled() -> list[str]:
        names = sorted(p.parent.name for p in folder.glob("*/manifest.json"))
        return [n for n in names if n != by_hand.name]

    def rotated() -> bool:
        seen.update(scheduled())
        return len(seen) >= 4

    wait_for(rotated, timeout=60)
    svc.stop()

    kept = scheduled()
    assert len(kept) == 2
    assert kept == sorted(seen)[-2:]  # the newest
    assert by_hand.is_dir()  # a backup taken by hand is never removed
    for name in kept:
        manifest = json.loads((folder / name / "manifest.json").read_text())
        assert manifest["scheduled"] is True and manifest["size"] > 0


def test_a_scheduled_backup_that_would_leave_too_little_room_is_skipped_with_an_alert(
    start_service, tmp_path
):
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    with receiving() as rx:
        svc = start_service(
            service={"backup_interval": 0.5},
            queue={"min_free_disk_mb": free_mb + 10**6},
            alerts={"url": rx.url},
        )
        skipped = wait_for(
            lambda: [p for p in rx.posts if "backup skipped" in p.headers.get("Title", "")]
        )
        svc.stop()
    reason = skipped[0].body.decode()
    assert "queue.min_free_disk_mb" in reason and "MB free" in reason
    assert "scheduled backup skipped" in svc.log() and "queue.min_free_disk_mb" in svc.log()
    assert not list((svc.data_dir / "backups").glob("*")), "nothing written, not even .partial"


def test_a_backup_refuses_a_destination_with_less_room_than_it_needs(start_service, tmp_path):
    svc = start_service()
    submit_steps(svc, 1)
    with small_filesystem(tmp_path / "small") as small:
        fill(small)
        said = momentry(svc, "backup", str(small / "backup"), expect=2).stderr
        assert "needs up to" in said and "MB free" in said and "give another DEST" in said
        assert sorted(p.name for p in small.iterdir()) == ["filler"]  # no folder left behind
        (small / "filler").unlink()  # room again: the same backup is taken
        momentry(svc, "backup", str(small / "backup"))
        assert (small / "backup" / "manifest.json").is_file()


def _has(tool: str) -> bool:
    return shutil.which(tool) is not None
