"""Resources that run out under a running service: inodes, file descriptors.

Each runs out for real (a tmpfs with few inodes, a process with few descriptors); the
service holds work back and says why, loses no job and spends no retry on it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import Any

import httpx
import psutil
import pytest
from conftest import wait_for
from disks import fill, remount, small_filesystem, use_up_inodes
from media_factory import make_video

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

SCENES = 60


def test_inodes_running_out_send_a_run_back_in_line_and_hold_starts_back(start_service, tmp_path):
    results = tmp_path / "node" / "data" / "results"
    with small_filesystem(results, size="64m", inodes=40) as disk:
        svc = start_service(
            queue={
                "max_concurrent": 1,
                "min_free_disk_mb": 1,
                "min_free_inodes": 10,
                "max_retries": 1,
            },
            **{"processors.cut": {"min_scene_len": 2, "thumbnail_max_side": 16}},
        )
        # A thumbnail a scene: more files than the results' disk has inodes for.
        make_video(
            svc.drop / "scenes.mp4",
            segments=SCENES,
            segment_seconds=0.4,
            fps=10,
            size=(64, 48),
            audio=False,
        )
        task = svc.submit("scenes.mp4", ["cut"])
        job = wait_for(lambda: (j := svc.job(task["task_id"]))["error_message"] and j, timeout=120)
        # Back in line, no retry spent, and its half-written thumbnails gone.
        assert job["status"] == "pending" and job["retry_count"] == 0, job
        assert "waiting for disk space" in job["error_message"], job
        assert "No space left on device" in job["error_message"], job
        assert job["processors"]["cut"]["status"] == "pending", job
        folder = disk / task["file_uuid"]
        assert not (folder / ".cut.thumbnails.work").exists(), list(folder.iterdir())

        # No inode left: nothing starts, and the status says why.
        spent = use_up_inodes(disk)
        reason = wait_for(lambda: svc.status()["blocked_reason"], timeout=30)
        assert "low on inodes" in reason and "queue.min_free_inodes" in reason, reason
        assert svc.job(task["task_id"])["status"] == "pending"

        shutil.rmtree(spent)
        remount(disk, SCENES * 4)
        job = svc.wait_status(task["task_id"], "completed", "failed", "partial", timeout=180)
        assert job["status"] == "completed" and job["retry_count"] == 0, job
        assert svc.status()["blocked_reason"] is None
        cut = svc.get(f"/api/v1/files/{task['file_uuid']}/results/cut")
        assert len(cut["result"]["scenes"]) == SCENES
        assert all(scene["thumbnail"] for scene in cut["result"]["scenes"])
        svc.proc.terminate()
        svc.proc.wait(timeout=60)


def test_a_full_queue_database_sends_a_job_back_in_line_and_holds_starts_back(
    start_service, tmp_path
):
    data = tmp_path / "node" / "data"
    # The queue database (and the log) on a small disk of its own, the results on another.
    with small_filesystem(data, size="16m") as disk, small_filesystem(data / "results", "64m"):
        svc = start_service(
            # No free-space floor: the database's own writes are what find the disk full.
            queue={"max_concurrent": 1, "min_free_disk_mb": 0, "min_free_inodes": 0},
            **{"processors.steps": {"steps": 40, "step_seconds": 0.1}},
        )
        first = svc.submit("first.mp4", ["steps"])
        second = svc.submit("second.mp4", ["steps"])
        svc.wait_status(first["task_id"], "processing")
        filler = fill(disk)

        reason = wait_for(lambda: svc.status()["blocked_reason"], timeout=60)
        assert "the queue database's disk is full" in reason, reason
        assert "free some space on it" in reason, reason
        # The run ends (its results are on the other disk), and then its end cannot be
        # recorded, even after the retries of a state change (3.5 s).
        steps = data / "results" / first["file_uuid"] / "steps.log"
        wait_for(lambda: steps.exists() and len(steps.read_text().split()) == 40, timeout=60)
        held = f"job {first['task_id']} held: its run cannot be recorded"
        wait_for(lambda: held in svc.log(), timeout=60)
        # Held, not failed, crashed or retried: nothing can be written, so the first still
        # shows as processing (held in hand, which the reaper leaves); the second waits.
        job = svc.job(first["task_id"])
        assert job["status"] in ("processing", "pending"), job
        assert job["retry_count"] == 0 and job["crash_count"] == 0, job
        assert svc.job(second["task_id"])["status"] == "pending"

        filler.unlink()
        for task in (first, second):
            job = svc.wait_status(task["task_id"], "completed", "failed", "partial", timeout=120)
            assert job["status"] == "completed", job
            assert job["retry_count"] == 0 and job["crash_count"] == 0, job
        assert svc.status()["blocked_reason"] is None
        stderr = (svc.root / "service.log").read_text(errors="replace")
        assert stderr.count("the queue database's disk is full") == 1, stderr[-4000:]
        assert "Traceback" not in stderr, stderr[-4000:]
        svc.proc.terminate()
        svc.proc.wait(timeout=60)


def test_a_run_that_is_cancelled_or_times_out_leaves_no_work_folder(start_service):
    svc = start_service(
        queue={"max_concurrent": 1, "max_retries": 0},
        **{"processors.cut": {"min_scene_len": 2, "thumbnail_max_side": 16}},
    )
    # The timed-out one long enough that its cut cannot end within its 2 s: 800 segments
    # took about 2 s on an idle machine, and the job completed now and then.
    for name, segments in (("cancelled.mp4", 800), ("timed out.mp4", 4000)):
        make_video(
            svc.drop / name,
            segments=segments,
            segment_seconds=0.5,
            fps=10,
            size=(64, 48),
            audio=False,
        )
    for name, timeout in (("cancelled.mp4", None), ("timed out.mp4", 2)):
        task = svc.submit(name, ["cut"], task_timeout=timeout)
        work = svc.data_dir / "results" / task["file_uuid"] / ".cut.thumbnails.work"
        wait_for(work.is_dir, timeout=120, interval=0.01)  # thumbnails are being written
        if timeout is None:
            svc.call("POST", f"/api/v1/jobs/{task['task_id']}/cancel")
        job = svc.wait_status(task["task_id"], "cancelled", "failed", "completed", timeout=120)
        assert job["status"] == ("cancelled" if timeout is None else "failed"), job
        assert not work.exists(), sorted(p.name for p in work.parent.iterdir())


def _logged_bytes(svc) -> int:
    """What the service wrote to its log file and to its stderr."""
    files = [svc.data_dir / "logs" / "momentry-edge.log", svc.root / "service.log"]
    return sum(f.stat().st_size for f in files if f.exists())


def _health_checks(svc, seconds: float, timeout: float = 10) -> dict[str, Any]:
    """/healthz on a new connection each half second for ``seconds``: the answers, their
    latency, and what the service wrote to its logs and spent in CPU meanwhile."""
    process = psutil.Process(svc.proc.pid)
    cpu, logged = sum(process.cpu_times()[:2]), _logged_bytes(svc)
    began = time.monotonic()
    answers, latencies = [], []
    while time.monotonic() - began < seconds:
        asked = time.monotonic()
        try:
            answers.append(httpx.get(f"{svc.url}/healthz", timeout=timeout).status_code)
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)
        latencies.append(time.monotonic() - asked)
        time.sleep(0.5)
    spent = time.monotonic() - began
    return {
        "answers": answers,
        "latency_ms": [round(s * 1000, 1) for s in sorted(latencies)],
        "log_bytes": _logged_bytes(svc) - logged,
        "cpu_percent": round(100 * (sum(process.cpu_times()[:2]) - cpu) / spent),
    }


def _connect_idle(url: str, count: int) -> list[socket.socket]:
    """``count`` connections that never send a request (they wait in the backlog if need be)."""
    host, port = url.removeprefix("http://").split(":")
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]


def test_out_of_descriptors_health_checks_are_answered_and_little_is_logged(start_service):
    # 64 descriptors in all, as `ulimit -n 64` leaves a service, and 80 idle connections.
    svc = start_service(wrapper=["prlimit", "--nofile=64:64", "--"])
    started = svc.log()
    assert "HTTP connections limited to" in started and "open-file limit 64" in started, started

    idle = _connect_idle(svc.url, 80)
    try:
        held = _health_checks(svc, 6)
        print("80 idle connections, 64 descriptors:", held)
        assert set(held["answers"]) == {200}, held
        assert held["log_bytes"] < 20_000, held  # a few lines a second at most

        # None left at all (the limit lowered on the running process): accepting pauses,
        # said once a second at most; the rest of the service says its failures once.
        subprocess.run(["prlimit", f"--pid={svc.proc.pid}", "--nofile=12:64"], check=True)
        idle += _connect_idle(svc.url, 20)
        exhausted = _health_checks(svc, 6, timeout=2)
        print("descriptors exhausted:", exhausted)
        assert exhausted["log_bytes"] < 20_000, exhausted
        assert "out of file descriptors" in svc.log()
        subprocess.run(["prlimit", f"--pid={svc.proc.pid}", "--nofile=64:64"], check=True)
    finally:
        for connection in idle:
            connection.close()
    after = _health_checks(svc, 3)
    print("after:", after)
    assert set(after["answers"]) == {200}, after
    text = svc.log()
    assert "accept() threw" not in text, text
    assert "accepting connections again" in text, text
    assert svc.stop() == 0
