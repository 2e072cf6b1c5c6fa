"""Restore and backup where the data dir is not as a backup left it: a database with its
WAL, a PostgreSQL queue restored before, a start during a restore, a linked results
folder, results nested deeper than Python recurses, another instance's database."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ServiceProcess, wait_for
from databases import scratch_postgres
from test_backup import (
    _has,
    completed_steps,
    momentry,
    paused,
    restored_task_ids,
    task_ids,
    tree,
)
from test_housekeeping import DAY, make_file

from momentry_edge import jobs, outputs, store, trees
from momentry_edge.upkeep import housekeeping


def serves(svc: ServiceProcess) -> list[str]:
    """The jobs a service started on its database serves (it is stopped again)."""
    return restored_task_ids(svc)


# -- 1. a database file with its WAL beside it ----------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_database_file_with_its_wal_beside_it_restores_what_a_reader_sees(
    start_service, tmp_path
):
    source = start_service("source")
    submitted = completed_steps(source, "a", "b", "c")
    source.kill()  # the last jobs are in the WAL, as after a power cut
    db_file = source.data_dir / "momentry.db"
    wal = Path(f"{db_file}-wal").read_bytes()
    assert wal
    with sqlite3.connect(f"file:{db_file}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT count(*) FROM job").fetchone() == (3,)
    target = ServiceProcess(tmp_path / "target", "", {})

    out = momentry(target, "restore", str(db_file)).stdout

    assert "(3 jobs)" in out, out
    assert serves(target) == submitted
    assert Path(f"{db_file}-wal").read_bytes() == wal, "the source is left as it was"


# -- 2. PostgreSQL: restored before, node rows from the dump, a SQLite file -----------------------


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_postgresql_queue_restored_once_can_be_backed_up_and_restored_again_at_once(
    start_service, database_url, tmp_path
):
    if not _has("pg_restore"):
        pytest.skip("pg_restore is not installed")
    svc = start_service()
    first = completed_steps(svc, "a")
    momentry(svc, "backup", str(tmp_path / "one"))  # taken while it runs: its node row is live
    svc.stop()
    momentry(svc, "restore", str(tmp_path / "one"))
    # At once: the node row the dump brought is no service working on the database.
    momentry(svc, "restore", str(tmp_path / "one"))
    momentry(svc, "backup", str(tmp_path / "two"))  # holds the first restore's aside schema

    out = momentry(svc, "restore", str(tmp_path / "two")).stdout

    assert "(1 jobs)" in out, out
    assert serves(svc) == first
    # A dump of the whole database, as earlier versions took, with every aside schema.
    (tmp_path / "three").mkdir()
    dump = tmp_path / "three" / "momentry.pgdump"
    subprocess.run(["pg_dump", "--format=custom", "--file", str(dump), database_url], check=True)
    out = momentry(svc, "restore", str(tmp_path / "three")).stdout
    assert "(1 jobs)" in out, out
    assert serves(svc) == first


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_sqlite_file_given_to_a_postgresql_service_is_named_for_what_it_is(
    start_service, tmp_path
):
    if not _has("pg_restore"):
        pytest.skip("pg_restore is not installed")
    svc = start_service()
    completed_steps(svc, "a")
    momentry(svc, "backup", str(tmp_path / "live"))
    svc.stop()
    momentry(svc, "restore", str(tmp_path / "live"))  # node rows from a running service
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE job (a)")

    refused = momentry(svc, "restore", str(other), expect=2).stderr

    assert "is a SQLite database" in refused and "uses PostgreSQL" in refused, refused


# -- 3. a start while a restore runs --------------------------------------------------------------


# The restore's first step (its check that no service uses the database), one in the
# middle (copying results), and its last (the restored results renamed into place).
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "step",
    [
        ("sqlite3.connect", "momentry.db"),
        ("open", "results.restoring/"),
        ("os.rename", "results.restoring"),
    ],
    ids=["first", "middle", "last"],
)
def test_a_start_during_a_restore_is_refused_from_its_first_step_to_its_last(
    start_service, tmp_path, step
):
    svc = start_service()
    restored = completed_steps(svc, "a")
    src = tmp_path / "backup"
    momentry(svc, "backup", "--results", str(src))
    completed_steps(svc, "b")
    svc.stop()
    event, under = step

    with paused(svc, [event], under, "restore", str(src)):
        svc.spawn()
        wait_for(lambda: svc.proc.poll() is not None or serving(svc), timeout=120)
        assert not serving(svc), f"it started:\n{svc.log()}"
        assert svc.wait_exit(timeout=60) == 1, svc.log()
        assert "a restore into" in svc.log() and "is under way" in svc.log(), svc.log()

    assert serves(svc) == restored


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_node_starting_elsewhere_during_a_postgresql_restore_is_refused(
    start_service, database_url, tmp_path
):
    if not _has("pg_restore"):
        pytest.skip("pg_restore is not installed")
    svc = start_service()
    restored = completed_steps(svc, "a")
    src = tmp_path / "backup"
    svc.stop()
    momentry(svc, "backup", str(src))
    svc.start()
    completed_steps(svc, "b")
    svc.stop()
    # The restore is run from another machine's config: another data dir, the same queue.
    other = ServiceProcess(tmp_path / "other", database_url, {})

    with paused(other, ["subprocess.Popen"], "--list", "restore", str(src)):
        svc.spawn()
        wait_for(lambda: svc.proc.poll() is not None or serving(svc), timeout=120)
        assert not serving(svc), f"it started:\n{svc.log()}"
        assert svc.wait_exit(timeout=60) == 1, svc.log()
        assert "a restore into" in svc.log() and "is under way" in svc.log(), svc.log()

    assert serves(svc) == restored


def serving(svc: ServiceProcess) -> bool:
    """The service wrote its run.json: it serves."""
    try:
        return json.loads((svc.data_dir / "run.json").read_text())["pid"] == svc.proc.pid
    except (OSError, ValueError, KeyError):
        return False


# -- 4. a linked results folder -------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_restore_keeps_a_linked_results_folder_and_restores_into_where_it_points(
    start_service, tmp_path
):
    svc = start_service()
    completed_steps(svc, "a")
    svc.stop()
    shared = tmp_path / "shared"
    shared.mkdir()
    results = svc.data_dir / "results"
    shutil.move(results, shared / "results")
    results.symlink_to(shared / "results")
    svc.start()
    completed_steps(svc, "b")
    src = tmp_path / "backup"
    momentry(svc, "backup", "--results", str(src))
    completed_steps(svc, "c")
    svc.stop()
    current = tree(shared / "results")

    out = momentry(svc, "restore", str(src)).stdout

    assert results.is_symlink() and results.readlink() == shared / "results"
    assert tree(shared / "results") == tree(src / "results") != current
    (aside,) = shared.glob("results.before-restore-*")
    assert tree(aside) == current and str(aside) in out, out
    assert not list(svc.data_dir.glob("results.before-restore-*"))


# -- 5. results nested deeper than Python recurses ------------------------------------------------


def nest(folder: Path, depth: int) -> Path:
    """``depth`` folders one in another under ``folder``, a file at the bottom."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("bottom.json", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("{}")
    finally:
        os.close(fd)
    return folder


@pytest.fixture
def removed_after(tmp_path):
    """The test's folder removed by a loop: pytest's removal recurses once per level."""
    yield
    trees.remove(tmp_path)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_results_nested_1500_folders_deep_are_backed_up_and_restored(
    start_service, tmp_path, removed_after
):
    svc = start_service()
    submitted = completed_steps(svc, "a")
    svc.stop()
    nest(svc.data_dir / "results", 1500)
    src = tmp_path / "backup"

    momentry(svc, "backup", "--results", str(src))
    momentry(svc, "restore", str(src))

    bottom = svc.data_dir / "results" / Path(*["d"] * 1500) / "bottom.json"
    assert bottom.read_text() == "{}"
    assert serves(svc) == submitted


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_results_nested_past_the_longest_path_give_a_message_not_a_traceback(
    start_service, tmp_path
):
    svc = start_service()
    svc.stop()
    deep = svc.data_dir / "results" / "deep"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY)
    name = "long-name-" * 20
    try:  # 40 names of 200 characters: a path of 8,000, past PATH_MAX
        for _ in range(40):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    src = tmp_path / "backup"

    refused = momentry(svc, "backup", "--results", str(src), expect=2).stderr

    assert "error:" in refused and "long-name" in refused, refused
    assert not src.exists()


# -- 10. another instance's database, on the same host --------------------------------------------


def test_a_restored_copy_of_another_instance_s_database_starts_beside_it(
    start_service, database_url, tmp_path
):
    if database_url and not _has("pg_restore"):
        pytest.skip("pg_restore is not installed")
    first = start_service("first")
    submitted = completed_steps(first, "a")
    momentry(first, "backup", str(tmp_path / "backup"))  # the same node id: this host's name

    with scratch_postgres() if database_url else contextlib.nullcontext() as other_url:
        second = ServiceProcess(tmp_path / "second", other_url or "", {})
        momentry(second, "restore", str(tmp_path / "backup"))
        second.start()
        try:
            assert task_ids(second) == submitted
            assert task_ids(first) == submitted  # the first goes on serving its own
        finally:
            second.stop()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_node_id_a_live_service_holds_on_the_same_database_is_still_refused(
    start_service, tmp_path
):
    first = start_service("first")
    shared = f"sqlite:///{first.data_dir / 'momentry.db'}"
    second = ServiceProcess(tmp_path / "second", shared, {})
    second.spawn()
    assert second.wait_exit(timeout=120) == 1
    assert f"in use by process {first.proc.pid}" in second.log()


# -- the same depth in the hourly sweep and retention ----------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_sweep_removes_temp_files_and_old_results_nested_1500_folders_deep(
    tmp_path, database_url, removed_after
):
    data = tmp_path / "data"
    store.connect(database_url, data)
    try:
        jobs.init_queue_state(2, False)
        done_file, waiting_file = make_file("aa"), make_file("bb")
        finished, _ = jobs.submit(done_file, ["noop"], max_retries=0)
        jobs.submit(waiting_file, ["noop"], max_retries=0)
        jobs.cancel(finished)
        # Gone from the drop folder: the results of a file still there are kept.
        store.MediaFile.update(state=store.FileState.MISSING).where(
            store.MediaFile.id == done_file.id
        ).execute()
        old_results = outputs.results_dir(data, done_file.file_uuid)
        kept_results = outputs.results_dir(data, waiting_file.file_uuid)
        for folder in (old_results, kept_results):
            folder.mkdir(parents=True)
            nest(folder, 1500)
        bottom = kept_results / Path(*["d"] * 1500)
        debris = bottom / ".asr.json.0123456789ab"  # a temp name outputs.py writes
        debris.write_text("{}")

        counts = housekeeping.sweep(data, retention_seconds=30 * DAY, now=time.time() + 31 * DAY)

        assert counts["results"] == 1 and counts["temp_files"] == 1, counts
        assert not old_results.exists() and not debris.exists()
        assert (bottom / "bottom.json").read_text() == "{}"
    finally:
        store.Job._meta.database.close()
