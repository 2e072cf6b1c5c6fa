"""What a started service holds: libraries a job or a client needs are loaded on first use,
not at start (each start of a service costs CPU and memory before it serves anything)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ServiceProcess

# Not for an idle service: an HTTP client (callbacks, alerts and model pulls load it when
# they post), the terminal tables of the CLI, OpenCV (the cut processor's, per job), numpy
# and PyAV (a probe's and a job's), Pillow (thumbnails).
NOT_AT_START = (
    *("httpx", "click", "rich", "pygments", "scenedetect", "cv2", "numpy", "av", "PIL"),
    *("tokenizers", "safetensors"),  # the sentence model: on first search by meaning
    "prometheus_client",  # the first scrape of /metrics
    "snowballstemmer",  # the first moment indexed or searched
)
# The drivers peewee and Huey import wherever installed, not on SQLite without a Redis
# mirror. By a module of each: the packages' own names show in the report as the attempts
# that found them hidden (momentry_edge/imports.py).
DRIVERS = ("psycopg.pq", "redis.client")


def imported(svc: ServiceProcess) -> set[str]:
    """The modules the service process imported, from its -X importtime lines on stderr."""
    said = (svc.root / "service.log").read_text(errors="replace")
    lines = [line for line in said.splitlines() if line.startswith("import time:")]
    assert len(lines) > 100, said[-2000:]  # the report is there: the test can see imports
    return {line.rsplit("|", 1)[1].strip() for line in lines}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_started_service_has_not_loaded_what_only_jobs_and_clients_use(start_service):
    svc = start_service(env={"PYTHONPROFILEIMPORTTIME": "1"})
    # Its processors listed (each one made and asked whether it is ready) load none of it.
    assert "cut" in str(svc.get("/api/v1/processors"))
    modules = imported(svc)
    assert "momentry_edge.service" in modules and "peewee" in modules
    loaded = sorted(m for m in modules if m.split(".")[0] in NOT_AT_START or m in DRIVERS)
    assert not loaded, f"imported at start: {loaded}"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_command_that_asks_the_service_loads_no_driver_nor_httpx_own_command_line(
    start_service,
):
    svc = start_service()
    command = [sys.executable, "-X", "importtime", "-m", "momentry_edge.cli"]
    asked = subprocess.run(
        [*command, "--config", str(svc.config_path), "status"],
        env=svc.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 0 and "running" in asked.stdout.lower(), asked
    modules = {line.rsplit("|", 1)[1].strip() for line in asked.stderr.splitlines() if "|" in line}
    assert "httpx" in modules  # the report is there
    loaded = sorted(m for m in modules if m.split(".")[0] in ("click", "pygments") or m in DRIVERS)
    assert not loaded, f"imported by the command: {loaded}"
