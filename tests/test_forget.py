"""Forgetting a file (footage withdrawn): after `forget`, nothing in the data dir or the
queue database names it, the backups that still hold it are named, and the service goes on."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from conftest import ServiceProcess, wait_for

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def cli(svc: ServiceProcess, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(svc.config_path), *args],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == expect, f"{args}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc


def traces(data_dir: Path, words: list[str], skip: str = "backups") -> list[str]:
    """The files under ``data_dir`` (but ``skip``) whose bytes hold any of ``words``, and the
    rows of the queue database's dump that do."""
    found = []
    needles = [w.encode() for w in words]
    for here, folders, files in os.walk(data_dir):
        folders[:] = [f for f in folders if f != skip]
        for name in folders + files:
            path = Path(here, name)
            held = path.is_file() and any(n in path.read_bytes() for n in needles)
            if held or any(n in name.encode() for n in needles):
                found.append(str(path))
    with sqlite3.connect(data_dir / "momentry.db") as conn:
        found += [row for row in conn.iterdump() if any(w in row for w in words)]
    return found


@SQLITE
def test_forget_through_http_leaves_no_trace_and_names_the_backups_that_hold_it(start_service):
    svc = start_service()
    kept = svc.submit("kept interview.mp4", ["steps"])["task_id"]
    reply = svc.submit("withdrawn footage.mp4", ["steps"])
    uuid, task = reply["file_uuid"], reply["task_id"]
    svc.wait_status(task, "completed")
    svc.wait_status(kept, "completed")
    backup = Path(json.loads(cli(svc, "backup", "--results", "--json").stdout)["path"])
    words = ["withdrawn footage", uuid, task]
    assert traces(svc.data_dir, words)  # the results, the log, the database name it now

    refused = svc.client.post(f"/api/v1/files/{uuid}/forget")
    assert refused.status_code == 409, refused.text
    assert "still in the watched folder" in refused.json()["error"]["message"]
    assert (svc.drop / "withdrawn footage.mp4").exists()

    done = svc.call("POST", f"/api/v1/files/{uuid}/forget", json={"delete_source": True})
    assert done["success"] is True and done["file_uuid"] == uuid
    assert done["jobs"] == [task] and done["source_removed"] is True
    assert done["results_removed"] == [str(svc.data_dir / "results" / uuid)]
    assert done["backups"] == [str(backup)]  # still holds it: said, not changed
    assert not (svc.drop / "withdrawn footage.mp4").exists()
    assert traces(svc.data_dir, words) == []
    # Nothing of it comes back, and the other file and the service are as they were.
    svc.call("POST", "/api/v1/files/rescan")
    assert svc.get("/api/v1/files", params={"name": "withdrawn"})["total"] == 0
    assert svc.job(kept)["status"] == "completed"
    gone = svc.client.get(f"/api/v1/files/{uuid}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    unknown = svc.client.post(f"/api/v1/files/{'0' * 32}/forget")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    kept_uuid = svc.job(kept)["file_uuid"]
    bad = svc.client.post(f"/api/v1/files/{kept_uuid}/forget", json={"delete_source": "yes"})
    assert bad.status_code == 400 and "delete_source" in bad.json()["error"]["message"]
    assert svc.get(f"/api/v1/files/{kept_uuid}")["state"] == "present"


@SQLITE
def test_forget_through_the_cli_cancels_a_running_job(start_service):
    svc = start_service(**{"processors.steps": {"steps": 400, "step_seconds": 0.05}})
    reply = svc.submit("long take.mp4", ["steps"])
    uuid, task = reply["file_uuid"], reply["task_id"]
    svc.wait_status(task, "processing")
    wait_for(lambda: (svc.data_dir / "results" / uuid).exists() or svc.job(task)["progress"] > 0)
    # Moved away from the drop folder by the studio: forget leaves the rest to the service.
    (svc.drop / "long take.mp4").rename(svc.root / "long take.mp4")
    out = cli(svc, "forget", "long take.mp4", "--yes").stdout
    assert f"forgot {uuid}: 1 job(s)" in out
    assert "no backup in the data dir holds it" in out
    assert traces(svc.data_dir, ["long take", uuid, task]) == []
    missing = cli(svc, "results", uuid, expect=1)
    assert "no file" in missing.stderr
    assert cli(svc, "forget", "no such.mp4", "--yes", expect=1).stderr.startswith("error:")
    assert svc.get("/healthz")["status"] == "ok"  # the service goes on


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_forget_on_postgresql_deletes_every_row_of_the_file(start_service, database_url):
    svc = start_service()
    kept = svc.submit("kept.mp4", ["noop"])["task_id"]
    reply = svc.submit("gone.mp4", ["noop"])
    svc.wait_status(reply["task_id"], "completed")
    svc.wait_status(kept, "completed")
    (svc.drop / "gone.mp4").unlink()
    done = svc.call("POST", f"/api/v1/files/{reply['file_uuid']}/forget")
    assert done["jobs"] == [reply["task_id"]] and done["source_removed"] is False
    with psycopg.connect(database_url) as conn:
        dump = [
            str(row)
            for table in ("media_file", "job", "processor_run")
            for row in conn.execute(f"SELECT * FROM {table}").fetchall()
        ]
    named = ("gone.mp4", reply["task_id"], reply["file_uuid"])
    assert dump and not [row for row in dump if any(word in row for word in named)]
    assert [row for row in dump if kept in row]
