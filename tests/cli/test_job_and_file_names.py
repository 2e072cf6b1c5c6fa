"""A job or a file named as people name them: a job by its task id, integer id or file's
uuid, a file's uuid also in the dashed form copied from elsewhere; in the API and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`momentry-edge ARGS` as a user types it: no MOMENTRY_* variable, no token given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    proc = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@SQLITE
def test_a_file_is_named_by_its_dashed_uuid_too(start_service):
    svc = start_service()
    task = svc.submit("dashed.mp4", ["noop"])["task_id"]
    uuid = svc.wait_status(task, "completed")["file_uuid"]
    dashed = f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}".upper()
    assert svc.get(f"/api/v1/files/{dashed}")["file_uuid"] == uuid
    assert svc.get(f"/api/v1/jobs/{dashed}")["task_id"] == task
    shown = cli("--config", str(svc.config_path), "results", dashed, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["file"]["file_uuid"] == uuid
    refused = svc.client.get(f"/api/v1/files/{dashed}-0")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"


@SQLITE
def test_logs_of_one_job_are_that_job_s_lines_only(start_service):
    svc = start_service()
    tasks = [svc.submit(f"log {i}.mp4", ["noop"])["task_id"] for i in range(2)]
    jobs = [svc.wait_status(t, "completed") for t in tasks]
    config = ("--config", str(svc.config_path))
    first = jobs[0]
    for ref in (str(first["id"]), first["task_id"], first["file_uuid"]):
        shown = cli(*config, "logs", "--job", ref, "-n", "1000")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines and all(first["task_id"] in line for line in lines), (ref, lines)
        assert not any(tasks[1] in line for line in lines)
    unknown = cli(*config, "logs", "--job", "999999")
    assert unknown.returncode == 1 and "no job '999999'" in unknown.stderr
