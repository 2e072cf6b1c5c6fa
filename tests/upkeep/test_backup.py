"""Backup, restore and the database check at start-up, through the CLI and a real service."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import ServiceProcess, wait_for
from databases import scratch_postgres
from disks import fill, small_filesystem
from receiver import receiving

from momentry_edge import config
from momentry_edge.upkeep import backup

KILLED = -signal.SIGKILL
SIDECARS = ("-wal", "-shm", "-journal")
CRASH_AT = Path(__file__).resolve().parent.parent / "crash_at.py"


def at_fault(
    mode: str, events: list[str], under: object, nth: int = 1, file: object = ""
) -> list[str]:
    """A wrapper (tests/crash_at.py) that kills or pauses momentry-edge at its ``nth`` step
    of ``events`` naming a path that contains ``under``."""
    spec = {"mode": mode, "events": events, "under": str(under), "nth": nth, "file": str(file)}
    return [sys.executable, str(CRASH_AT), json.dumps(spec)]


def momentry(
    svc: ServiceProcess, *args: str, expect: int = 0, wrapper: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`momentry-edge --config <the service's> ARGS`, as the operator of that service runs it."""
    proc = subprocess.run(
        [
            *wrapper,
            sys.executable,
            *("-m", "momentry_edge.cli", "--config", str(svc.config_path), *args),
        ],
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


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_file_left_by_a_killed_service_whose_pid_is_taken_since_does_not_stop_a_restore(
    start_service, tmp_path
):
    svc = start_service()
    submitted = submit_steps(svc, 1)
    momentry(svc, "backup", str(tmp_path / "backup"))
    svc.kill()  # its run.json stays
    run_file = svc.data_dir / "run.json"
    left = json.loads(run_file.read_text())
    # Its pid is another program's now: one started after the file was written.
    with subprocess.Popen(["sleep", "60"]) as other:
        try:
            run_file.write_text(json.dumps(left | {"pid": other.pid}))
            os.utime(run_file, (time.time() - 30, time.time() - 30))
            momentry(svc, "restore", str(tmp_path / "backup"))
        finally:
            other.kill()
    svc.start()
    assert task_ids(svc) == submitted


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
    conn = sqlite3.connect(database, isolation_level=None)
    # No free page (damage to one is damage to nothing: quick_check rightly passes it, and
    # the middle page's case failed now and then), then the WAL folded in, so that the
    # file holds every page.
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
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
        # A .partial folder is none: one being written, or removed (renamed first).
        return [n for n in names if n != by_hand.name and not n.endswith(".partial")]

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


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_scheduled_backup_held_up_by_a_lock_is_skipped_and_the_service_stops(
    start_service, database_url
):
    # pg_dump waits for a lock another session holds on a table it copies: it gives up
    # after SCHEDULED_LOCK_WAIT, logged, and a stop does not wait for the next one.
    import psycopg

    svc = start_service(service={"backup_interval": 0.5})
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE held_up (n integer)")
        with admin.transaction():
            admin.execute("LOCK TABLE held_up IN ACCESS EXCLUSIVE MODE")
            said = wait_for(
                lambda: [line for line in svc.log().splitlines() if "backup skipped" in line],
                timeout=backup.SCHEDULED_LOCK_WAIT + 15,
            )
            assert "lock" in said[0] and "held_up" in said[0], said
            started = time.monotonic()
            assert svc.stop() == 0
            assert time.monotonic() - started < backup.SCHEDULED_LOCK_WAIT + 10
    assert not list((svc.data_dir / "backups").glob("*.partial")), "no .partial left"


def pg_dumps(svc: ServiceProcess) -> list[psutil.Process]:
    """The service's pg_dump processes now."""
    assert svc.proc is not None
    found = []
    for child in psutil.Process(svc.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == "pg_dump" and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
    return found


@contextlib.contextmanager
def dump_held_up(svc: ServiceProcess, database_url: str) -> Iterator[psutil.Process]:
    """A table pg_dump copies locked by another session until the block ends; yields the
    service's scheduled pg_dump once it waits for that lock."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("CREATE TABLE held_up (n integer)")  # in the schema pg_dump copies
        with admin.transaction():
            admin.execute("LOCK TABLE held_up IN ACCESS EXCLUSIVE MODE")
            wait_for(lambda: waiting_for(admin, "held_up") > 0)
            (dump,) = wait_for(lambda: pg_dumps(svc))
            yield dump
            # The lock is held until here: a pg_dump seen waiting now never got it.


def waiting_for(admin: Any, table: str) -> int:
    query = f"SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '{table}'::regclass"
    return int(admin.execute(query).fetchone()[0])


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_scheduled_backup_held_up_by_a_lock_holds_up_no_other_housekeeping_step(
    start_service, database_url
):
    # The housekeeping step "run_file" writes run.json again (every lease_seconds / 3)
    # once it is gone: it does so while the scheduled pg_dump still waits for the lock,
    # not after that pg_dump gives up (SCHEDULED_LOCK_WAIT, logged as skipped).
    svc = start_service(service={"backup_interval": 0.5}, queue={"lease_seconds": 3})
    run_file = svc.data_dir / "run.json"
    with dump_held_up(svc, database_url) as dump:
        run_file.unlink()
        wait_for(run_file.exists, timeout=backup.SCHEDULED_LOCK_WAIT + 15)
        assert dump.is_running() and pg_dumps(svc) == [dump], "the same pg_dump waits still"
        assert "backup skipped" not in svc.log()
    assert json.loads(run_file.read_text())["pid"] == svc.proc.pid


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_stop_ends_a_scheduled_pg_dump_held_up_by_a_lock_and_leaves_nothing(
    start_service, database_url
):
    import psycopg

    svc = start_service(service={"backup_interval": 0.5})
    folder = svc.data_dir / "backups"
    with dump_held_up(svc, database_url) as dump:
        assert list(folder.glob("*.partial")), "the backup is under way"
        assert svc.stop() == 0  # within the lock: the stop did not wait for pg_dump
        assert not dump.is_running(), "pg_dump was ended"
        with psycopg.connect(database_url, autocommit=True) as other:
            # Its query was cancelled on the server too (pg_dump does so on SIGTERM).
            wait_for(lambda: waiting_for(other, "held_up") == 0)
    log = svc.log()
    assert "scheduled backup cut short by the stop" in log, log
    assert "backup skipped" not in log and "Traceback" not in log, log
    assert not list(folder.glob("*.partial")), "no .partial left"
    assert not list(folder.glob("*")), "nor anything else: the only backup was cut short"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_stop_set_before_a_step_ends_a_sqlite_copy_and_leaves_nothing(start_service):
    # The service's stop (its ``stopping`` event) is checked between the copy's steps.
    svc = start_service()
    svc.stop()
    cfg = config.load(svc.config_path, env={})
    stop = threading.Event()
    stop.set()
    with pytest.raises(backup.BackupStopped):
        backup.take(cfg, scheduled=True, stop=stop)
    assert not list((svc.data_dir / "backups").glob("*")), "no .partial left"
    assert backup.take(cfg, scheduled=True, stop=threading.Event()).jobs == 0


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


# -- a crash at any step ----------------------------------------------------------------------
# tests/crash_at.py kills the command with SIGKILL at one exact step (no handler runs, as
# in a power cut) or pauses it there; what it left is then what a crash leaves.


@contextlib.contextmanager
def paused(svc: ServiceProcess, events: list[str], under: str, *args: str) -> Iterator[None]:
    """`momentry-edge ARGS` held at its first step of ``events`` naming ``under`` while the
    block runs, then let go; it must then succeed."""
    flag = svc.root / "pause"
    wrapper = at_fault("pause", events, under, file=flag)
    command = [*wrapper, sys.executable, "-m", "momentry_edge.cli"]
    held = subprocess.Popen(
        [*command, "--config", str(svc.config_path), *args],
        env=svc.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: Path(f"{flag}.paused").exists() or held.poll() is not None)
        assert held.poll() is None, held.communicate()
        yield
    finally:
        Path(f"{flag}.go").touch()
        _, err = held.communicate(timeout=60)
    assert held.returncode == 0, err


def database_name(database_url: str) -> str:
    return "momentry.pgdump" if database_url else "momentry.db"


@pytest.mark.parametrize("step", ["manifest", "rename"])
def test_a_backup_cut_off_is_never_taken_for_one_and_the_next_backup_removes_it(
    start_service, database_url, step
):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    svc = start_service()
    submit_steps(svc, 2)
    first = Path(json.loads(momentry(svc, "backup", "--json").stdout)["path"])
    folder = svc.data_dir / "backups"
    # Killed as it opens its manifest to write it, or as it renames its folder into place.
    event, under = {
        "manifest": ("open", ".partial/manifest.json"),
        "rename": ("os.rename", ".partial"),
    }[step]

    momentry(svc, "backup", wrapper=at_fault("kill", [event], under), expect=KILLED)

    (left,) = folder.glob("*.partial")
    assert (left / database_name(database_url)).stat().st_size > 0, "a whole database copy"
    assert (left / "manifest.json").is_file() == (step == "rename")
    assert backup.latest(svc.data_dir) == first, "the newest complete backup"
    refused = momentry(svc, "restore", str(left), expect=2).stderr
    assert "unfinished" in refused
    refused = momentry(svc, "restore", str(left / database_name(database_url)), expect=2).stderr
    assert "unfinished" in refused

    second = Path(json.loads(momentry(svc, "backup", "--json").stdout)["path"])
    assert sorted(folder.iterdir()) == sorted([first, second]), "the leftover is gone"
    assert backup.latest(svc.data_dir) == second


def test_a_scheduled_backup_cut_off_is_not_counted_among_those_kept(start_service, database_url):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    svc = start_service(service={"backup_interval": 2, "backup_keep": 2})
    folder = svc.data_dir / "backups"
    wait_for(lambda: "backup written to" in svc.log())
    svc.stop()
    kept = max(folder.iterdir())
    # The next start is killed as its first scheduled backup renames its folder into place.
    svc.wrapper = at_fault("kill", ["os.rename"], "/backups/")
    svc.start()
    assert svc.wait_exit() == KILLED
    (left,) = folder.glob("*.partial")
    assert (left / "manifest.json").is_file()
    svc.wrapper = []
    written = svc.log().count("backup written to")

    svc.start()
    wait_for(lambda: svc.log().count("backup written to") > written)  # and pruned
    svc.stop()

    complete = [p for p in folder.iterdir() if (p / "manifest.json").is_file()]
    assert not left.exists()
    assert len(complete) == 2, "the leftover took no place of the two kept"
    assert kept in complete


def test_a_crash_while_removing_an_old_backup_leaves_no_broken_one(start_service, database_url):
    if database_url and not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    name = database_name(database_url)
    # Killed as it deletes the database copy of the first backup it prunes.
    svc = start_service(
        service={"backup_interval": 0.5, "backup_keep": 1},
        wrapper=at_fault("kill", ["os.remove"], name),
    )
    assert svc.wait_exit() == KILLED
    folder = svc.data_dir / "backups"

    newest = backup.latest(svc.data_dir)
    assert newest is not None and (newest / name).is_file()
    for path in folder.iterdir():  # a backup whole, or a leftover named as one
        assert path.name.endswith(".partial") or (path / name).is_file(), sorted(path.iterdir())
    svc.wrapper = []
    svc.start()
    momentry(svc, "backup")
    svc.stop()  # no scheduled backup under way now
    for path in folder.iterdir():
        assert (path / "manifest.json").is_file() and (path / name).is_file(), path


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_backup_into_a_folder_another_backup_is_writing_is_refused(start_service, tmp_path):
    svc = start_service()
    submit_steps(svc, 2)
    dest = tmp_path / "backup"
    with paused(svc, ["open"], "backup.partial/manifest.json", "backup", str(dest)):
        refused = momentry(svc, "backup", str(dest), expect=2).stderr
        assert "under way" in refused
    with sqlite3.connect(dest / "momentry.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert (dest / "manifest.json").is_file()


# -- restore, killed at each step ---------------------------------------------------------------

# Each step of a restore a crash can come between: what it writes, renames, links, removes.
RESTORE_STEPS = [
    "open",
    "os.rename",
    "os.link",
    "os.remove",
    "os.mkdir",
    "shutil.copyfile",
    "shutil.copytree",
    "shutil.rmtree",
    "sqlite3.connect",
]


def sqlite_task_ids(path: Path, scratch: Path) -> list[str] | None:
    """The task ids in the SQLite database at ``path`` as the service would open it (with
    whatever WAL lies beside it), on a copy; None when there is no database there."""
    if not path.exists():
        return None
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    for suffix in ("", "-wal", "-shm", "-journal"):
        if Path(f"{path}{suffix}").exists():
            shutil.copyfile(f"{path}{suffix}", scratch / f"momentry.db{suffix}")
    conn = sqlite3.connect(scratch / "momentry.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], path
        return sorted(row[0] for row in conn.execute("SELECT task_id FROM job"))
    finally:
        conn.close()


def tree(folder: Path) -> dict[str, bytes] | None:
    if not folder.is_dir():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def completed_steps(svc: ServiceProcess, *names: str) -> list[str]:
    """Jobs of ``steps`` on new videos named ``names``, once they completed."""
    submitted = sorted(svc.submit(f"{name}.mp4", ["steps"])["task_id"] for name in names)
    for task_id in submitted:
        svc.wait_status(task_id, "completed")
    return submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_restore_killed_at_any_step_leaves_a_database_and_a_rerun_restores(
    start_service, tmp_path
):
    svc = start_service()
    restored = completed_steps(svc, "a", "b")
    src = tmp_path / "backup"
    momentry(svc, "backup", "--results", str(src))
    current = sorted(restored + completed_steps(svc, "c"))
    svc.kill()  # the WAL stays beside the database, as after a power cut
    data, db_file, scratch = svc.data_dir, svc.data_dir / "momentry.db", tmp_path / "scratch"
    assert Path(f"{db_file}-wal").stat().st_size > 0
    current_results, backup_results = tree(data / "results"), tree(src / "results")
    template = tmp_path / "template"
    shutil.copytree(data, template, symlinks=True)

    trace = tmp_path / "steps"
    momentry(svc, "restore", str(src), wrapper=at_fault("trace", RESTORE_STEPS, data, file=trace))
    steps = trace.read_text().splitlines()
    assert len(steps) > 5, steps

    for nth, step in enumerate(steps, 1):
        shutil.rmtree(data)
        shutil.copytree(template, data, symlinks=True)
        killed = at_fault("kill", RESTORE_STEPS, data, nth)
        momentry(svc, "restore", str(src), wrapper=killed, expect=KILLED)

        said = f"killed at step {nth}, {step}"
        assert sqlite_task_ids(db_file, scratch) in (current, restored), said
        assert tree(data / "results") in (current_results, backup_results, None), said

        momentry(svc, "restore", str(src))
        assert sqlite_task_ids(db_file, scratch) == restored, said
        assert tree(data / "results") == backup_results, said
        assert not list(data.glob("*.restoring*")), said
        asides = data.glob("momentry.db.before-restore-*")
        asides = [p for p in asides if not p.name.endswith(SIDECARS)]
        assert current in [sqlite_task_ids(p, scratch) for p in asides], said
        assert current_results in [tree(p) for p in data.glob("results.before-restore-*")], said


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_wal_left_without_its_database_is_not_replayed_into_the_restored_one(
    start_service, tmp_path
):
    svc = start_service()
    restored = completed_steps(svc, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", str(src))
    completed_steps(svc, "b", "c")
    svc.kill()
    db_file = svc.data_dir / "momentry.db"
    wal = Path(f"{db_file}-wal").read_bytes()
    assert wal
    # As an earlier version's restore left it when cut off between moving the database
    # aside and its WAL (or a user who moved only the database away).
    db_file.rename(tmp_path / "moved.db")

    momentry(svc, "restore", str(src))

    assert sqlite_task_ids(db_file, tmp_path / "scratch") == restored
    kept = list(svc.data_dir.glob("momentry.db.before-restore-*-wal"))
    assert [p.read_bytes() for p in kept] == [wal], "kept aside, as it was"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_restore_into_postgresql_killed_at_any_step_changes_all_or_nothing(
    start_service, database_url, tmp_path
):
    if not _has("pg_restore"):
        pytest.skip("pg_restore is not installed")
    import psycopg

    svc = start_service()
    restored = completed_steps(svc, "a", "b")
    # Taken with the service stopped: a copy of a live node's heartbeat would hold each
    # restore of it back until that heartbeat is old.
    src, before = tmp_path / "backup", tmp_path / "before"
    svc.stop()
    momentry(svc, "backup", str(src))
    svc.start()
    current = sorted(restored + completed_steps(svc, "c"))
    svc.stop()
    momentry(svc, "backup", str(before))

    def task_ids_in(schema: str) -> list[str] | None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass(%s)", (f"{schema}.job",)).fetchone()[0] is None:
                return None
            rows = conn.execute(f"SELECT task_id FROM {schema}.job").fetchall()
        return sorted(row[0] for row in rows)

    def asides() -> list[str]:
        with psycopg.connect(database_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'momentry_before_restore_%'"
            ).fetchall()
        return [row[0] for row in rows]

    def reset() -> None:  # the database as it was before any restore
        momentry(svc, "restore", str(before))
        with psycopg.connect(database_url, autocommit=True) as conn:
            for schema in asides():
                conn.execute(f"DROP SCHEMA {schema} CASCADE")

    trace = tmp_path / "steps"
    events = ["subprocess.Popen"]
    momentry(svc, "restore", str(src), wrapper=at_fault("trace", events, "", file=trace))
    steps = trace.read_text().splitlines()
    assert steps, "the restore runs PostgreSQL's client tools"

    for nth, step in enumerate(steps, 1):
        reset()
        momentry(svc, "restore", str(src), wrapper=at_fault("kill", events, "", nth), expect=KILLED)

        said = f"killed at step {nth}, {step}"
        assert task_ids_in("public") in (current, restored), said
        momentry(svc, "restore", str(src))
        assert task_ids_in("public") == restored, said
        assert current in [task_ids_in(schema) for schema in asides()], said


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "step", [("sqlite3.connect", "momentry.db.restoring"), ("open", "results.restoring/")]
)
def test_the_copies_a_killed_restore_left_go_when_the_service_starts(start_service, tmp_path, step):
    svc = start_service()
    restored = completed_steps(svc, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", "--results", str(src))
    current = sorted(restored + completed_steps(svc, "c"))
    svc.stop()
    event, under = step
    momentry(svc, "restore", str(src), wrapper=at_fault("kill", [event], under), expect=KILLED)
    left = list(svc.data_dir.glob("*.restoring"))
    assert left

    svc.start()
    assert task_ids(svc) == current, "nothing was restored"
    assert not [p for p in left if p.exists()]
    assert "left by a restore that was cut off" in svc.log()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_second_restore_while_one_runs_is_refused(start_service, tmp_path):
    svc = start_service()
    restored = completed_steps(svc, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", str(src))
    completed_steps(svc, "b")
    svc.stop()
    with paused(svc, ["sqlite3.connect"], "momentry.db.restoring", "restore", str(src)):
        refused = momentry(svc, "restore", str(src), expect=2).stderr
        assert "another restore" in refused
    svc.start()
    assert task_ids(svc) == restored


# -- what is not a backup, or cannot be written where it is asked ---------------------------------


def stopped_with_jobs(start_service, *names: str) -> tuple[ServiceProcess, list[str]]:
    """A service that completed jobs on videos ``names``, then was stopped."""
    svc = start_service()
    submitted = completed_steps(svc, *names)
    svc.stop()
    return svc, submitted


def restored_task_ids(svc: ServiceProcess) -> list[str]:
    """The jobs the service serves after a start (it is stopped again)."""
    svc.start()
    try:
        return task_ids(svc)
    finally:
        svc.stop()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_postgresql_dump_of_another_database_is_refused_and_the_queue_is_untouched(
    start_service, database_url, tmp_path
):
    if not _has("pg_dump"):
        pytest.skip("pg_dump is not installed")
    import psycopg

    svc, submitted = stopped_with_jobs(start_service, "a")
    src = tmp_path / "other"
    src.mkdir()
    with scratch_postgres() as other:
        with psycopg.connect(other, autocommit=True) as conn:
            conn.execute("CREATE TABLE other (a int)")
        subprocess.run(
            ["pg_dump", "--format=custom", "--file", str(src / "momentry.pgdump"), other],
            check=True,
        )

    refused = momentry(svc, "restore", str(src), expect=2).stderr

    assert "not a momentry-edge queue" in refused and "nothing was changed" in refused
    with psycopg.connect(database_url, autocommit=True) as conn:
        schemas = [row[0] for row in conn.execute("SELECT nspname FROM pg_namespace")]
        assert conn.execute("SELECT to_regclass('public.other')").fetchone()[0] is None
    assert not [name for name in schemas if name.startswith("momentry_before_restore")]
    assert restored_task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("kind", ["a table job", "a newer version", "not sqlite"])
def test_a_sqlite_file_that_is_not_a_queue_is_refused_and_nothing_changes(
    start_service, tmp_path, kind
):
    svc, submitted = stopped_with_jobs(start_service, "a")
    src = tmp_path / "other.db"
    if kind == "not sqlite":
        src.write_bytes(os.urandom(4 << 20))
    elif kind == "a table job":
        with contextlib.closing(sqlite3.connect(src)) as conn:
            conn.execute("CREATE TABLE job (a)")
    else:  # a backup taken by a later momentry-edge
        momentry(svc, "backup", str(tmp_path / "later"))
        shutil.copyfile(tmp_path / "later" / "momentry.db", src)
        with contextlib.closing(sqlite3.connect(src)) as conn, conn:
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (999, 0)")
    before = sorted(p.name for p in svc.data_dir.iterdir())

    refused = momentry(svc, "restore", str(src), expect=2).stderr

    said = {
        "a table job": "not a momentry-edge queue: it has no table schema_version",
        "a newer version": "upgrade momentry-edge",
        "not sqlite": "not a SQLite database",
    }[kind]
    assert said in refused and "nothing was changed" in refused, refused
    assert sorted(p.name for p in svc.data_dir.iterdir()) == before
    assert restored_task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("link", ["a file in results", "results itself"])
def test_a_restore_brings_in_no_links_and_gives_results_the_service_s_modes(
    start_service, tmp_path, link
):
    svc, submitted = stopped_with_jobs(start_service, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", "--results", str(src))
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "shadow").write_text("root:secret\n")
    (document,) = (src / "results").glob("*/steps.json")
    expected = tree(src / "results")
    if link == "a file in results":
        document.chmod(0o666)
        document.parent.chmod(0o777)
        (document.parent / "asr.json").symlink_to(secret / "shadow")
        (document.parent / "elsewhere").symlink_to(secret)
    else:
        shutil.rmtree(src / "results")
        (src / "results").symlink_to(secret)
    results = svc.data_dir / "results"
    before = tree(results)

    said = momentry(svc, "restore", str(src))

    assert "links are not copied" in said.stderr
    assert not [p for p in results.rglob("*") if p.is_symlink()]
    assert "root:secret" not in str(tree(results))
    if link == "results itself":
        assert "results" in said.stderr and tree(results) == before, "not followed"
    else:
        assert "asr.json" in said.stderr and "elsewhere" in said.stderr
        assert tree(results) == expected
        for path in [results, *results.rglob("*")]:
            mode = path.stat().st_mode & 0o777
            assert mode == (0o700 if path.is_dir() else 0o600), path
    assert restored_task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_backup_skips_links_in_results(start_service, tmp_path):
    svc, _ = stopped_with_jobs(start_service, "a")
    (document,) = (svc.data_dir / "results").glob("*/steps.json")
    (document.parent / "link.json").symlink_to("/etc/hostname")

    said = momentry(svc, "backup", "--results", str(tmp_path / "backup"))

    assert "links are not copied" in said.stderr and "link.json" in said.stderr
    copied = tmp_path / "backup" / "results"
    assert (copied / document.relative_to(svc.data_dir / "results")).is_file()
    assert not [p for p in copied.rglob("*") if p.is_symlink()]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("dest", ["a mounted drive", "a link to an empty folder"])
def test_a_backup_into_an_existing_empty_folder_is_written_there(start_service, tmp_path, dest):
    svc, submitted = stopped_with_jobs(start_service, "a")
    with contextlib.ExitStack() as stack:
        if dest == "a mounted drive":
            folder = stack.enter_context(small_filesystem(tmp_path / "drive"))
        else:
            (tmp_path / "empty").mkdir()
            folder = tmp_path / "link"
            folder.symlink_to(tmp_path / "empty")
        beside = sorted(folder.parent.iterdir())

        momentry(svc, "backup", "--results", str(folder))

        assert sorted(p.name for p in folder.iterdir()) == [
            "manifest.json",
            "momentry.db",
            "momentry.toml",
            "results",
        ]
        assert sorted(folder.parent.iterdir()) == beside, "nothing written beside it"
        momentry(svc, "restore", str(folder))
        assert restored_task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_mounted_drive_with_too_little_room_is_refused_by_its_own_free_space(
    start_service, tmp_path
):
    svc, _ = stopped_with_jobs(start_service, "a")
    # Many small results: a block each on the disk, far more than their bytes.
    many = svc.data_dir / "results" / "many"
    many.mkdir()
    for n in range(1500):
        (many / f"{n}.json").write_text("{}")
    with small_filesystem(tmp_path / "drive", "4m") as drive:
        said = momentry(svc, "backup", "--results", str(drive), expect=2).stderr
        assert "needs up to" in said and f"the disk of {drive}" in said, said
        assert not list(drive.iterdir()), "nothing left behind"
    with small_filesystem(tmp_path / "small", "4m") as small:
        said = momentry(svc, "backup", "--results", str(small / "new"), expect=2).stderr
        assert "needs up to" in said and "MB free" in said, said
        assert not list(small.iterdir())


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_backup_into_a_mounted_drive_cut_off_is_never_taken_for_one(start_service, tmp_path):
    svc, submitted = stopped_with_jobs(start_service, "a")
    with small_filesystem(tmp_path / "drive") as drive:
        # Killed as it moves its manifest, the last of its files, out of its staging folder.
        cut = at_fault("kill", ["os.rename"], ".momentry-backup.partial/manifest.json")
        momentry(svc, "backup", "--results", str(drive), wrapper=cut, expect=KILLED)
        assert (drive / "momentry.db").is_file() and not (drive / "manifest.json").exists()

        for src in (drive, drive / "momentry.db"):
            refused = momentry(svc, "restore", str(src), expect=2).stderr
            assert "unfinished" in refused

        momentry(svc, "backup", "--results", str(drive))  # what the cut-off one left goes
        assert (drive / "manifest.json").is_file()
        assert not (drive / ".momentry-backup.partial").exists()
        momentry(svc, "restore", str(drive))
    assert restored_task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_backup_into_the_results_it_copies_is_refused(start_service):
    svc, _ = stopped_with_jobs(start_service, "a")
    results = svc.data_dir / "results"
    before = tree(results)
    (folder,) = results.iterdir()
    for args in (["--results", str(results / "bk")], [str(folder / "bk")]):
        said = momentry(svc, "backup", *args, expect=2).stderr
        assert "inside the results folder" in said
    assert tree(results) == before and sorted(results.iterdir()) == [folder]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_restore_onto_a_full_disk_is_refused_and_leaves_nothing(start_service, tmp_path):
    with small_filesystem(tmp_path / "disk") as disk:
        svc = ServiceProcess(disk / "node", "", {"queue": {"min_free_disk_mb": 0}})
        svc.start()
        try:
            submitted = completed_steps(svc, "a")
            src = tmp_path / "backup"
            momentry(svc, "backup", "--results", str(src))
            completed_steps(svc, "b")
        finally:
            svc.stop()
        fill(disk)
        before = sorted(p.name for p in svc.data_dir.iterdir())

        said = momentry(svc, "restore", str(src), expect=2).stderr

        assert "a restore needs up to" in said and "Nothing was changed" in said
        assert sorted(p.name for p in svc.data_dir.iterdir()) == before
        (disk / "filler").unlink()
        momentry(svc, "restore", str(src))
        assert restored_task_ids(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_odd_paths_get_a_clear_error_and_nothing_is_made(start_service, tmp_path):
    svc, _ = stopped_with_jobs(start_service, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", str(src))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for dest, said in [
        (a_file / "x", "is not a folder"),
        ("/dev/null/x", "is not a folder"),
        ("/proc/momentry-backup", "/proc is not writable"),
    ]:
        refused = momentry(svc, "backup", str(dest), expect=2).stderr
        assert said in refused and "under way" not in refused, refused
    assert not Path("/proc/momentry-backup.partial").exists()

    momentry(svc, "backup", str(tmp_path / "bk" / "b2" / ".." / "b3"))
    assert sorted(p.name for p in (tmp_path / "bk").iterdir()) == ["b3"]

    for data_dir, said in [(a_file, "is not a folder"), (tmp_path / "none", "no database")]:
        other = ServiceProcess(tmp_path / "other", "", {"service": {"data_dir": str(data_dir)}})
        assert said in momentry(other, "backup", expect=2).stderr
        if data_dir == a_file:
            assert said in momentry(other, "restore", str(src), expect=2).stderr
    assert not (tmp_path / "none").exists(), "a backup of nothing makes nothing"
    assert a_file.read_text() == "x"


def test_a_restore_into_an_unreachable_postgresql_says_so(tmp_path):
    src = tmp_path / "backup"
    src.mkdir()
    (src / "momentry.pgdump").write_bytes(b"PGDMP")
    closed = ServiceProcess(tmp_path / "node", "postgresql://postgres@127.0.0.1:1/none", {})
    said = momentry(closed, "restore", str(src), expect=2).stderr
    assert "cannot reach the database" in said


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_folders_that_cannot_be_written_get_a_clear_error(start_service, tmp_path, unprivileged):
    svc, submitted = stopped_with_jobs(start_service, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", "--results", str(src))
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    svc.data_dir.chmod(0o555)
    try:
        for args, said in [
            (["backup"], f"{svc.data_dir} is not writable (Permission denied)"),
            (["backup", str(read_only / "bk")], f"{read_only} is not writable"),
            (["restore", str(src)], "Permission denied"),
        ]:
            refused = momentry(svc, *args, wrapper=unprivileged, expect=2).stderr
            assert said in refused, refused
        assert not list(read_only.iterdir())
    finally:
        svc.data_dir.chmod(0o755)
    assert not list(svc.data_dir.glob("*.restoring")) and not (svc.data_dir / "backups").exists()
    # A result the service cannot read: the backup stops there, names it, leaves nothing.
    (document,) = (svc.data_dir / "results").glob("*/steps.json")
    document.chmod(0)
    refused = momentry(
        svc, "backup", "--results", str(tmp_path / "b2"), wrapper=unprivileged, expect=2
    ).stderr
    assert str(document) in refused and "Permission denied" in refused, refused
    assert not list(tmp_path.glob("b2*"))
    assert restored_task_ids(svc) == submitted


def _has(tool: str) -> bool:
    return shutil.which(tool) is not None
