"""Result documents: a failed processor leaves one too, a failure never replaces a complete
result, a later success replaces the failure, and the group can read them."""

from __future__ import annotations

import json
import os
import random
import stat
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from conftest import ServiceProcess, wait_for

from momentry_edge import durable, outputs, store
from momentry_edge.clock import iso
from momentry_edge.processors.keyframes import Keyframes
from momentry_edge.store import Job, MediaFile

PRAGMAS = ("synchronous", "fullfsync", "checkpoint_fullfsync")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_failed_processor_writes_its_document_and_a_successful_retry_replaces_it(
    start_service,
):
    svc = start_service()
    svc.marker.write_text("storage is down")
    task = svc.submit("flaky.mp4", ["flaky"], max_retries=0)
    job = svc.wait_status(task["task_id"], "failed")
    folder = svc.data_dir / "results" / task["file_uuid"]
    url = f"/api/v1/files/{task['file_uuid']}/results/flaky"

    failed = json.loads((folder / "flaky.json").read_text())
    assert failed["status"] == "failed" and failed["task_id"] == task["task_id"]
    assert "storage unavailable" in failed["error"]
    assert failed["error"] == job["processors"]["flaky"]["error"]
    assert failed["result"] is None and failed["last_checkpoint"] is None
    assert svc.get(url) == failed, "the API returns the failure, not 404"
    assert job["processors"]["flaky"]["output_path"] == str(folder / "flaky.json")
    # Readable by the service's account alone (service.share_group: see test_privacy.py).
    assert (mode(folder / "flaky.json"), mode(folder)) == (0o600, 0o700)

    svc.marker.unlink()  # the cause is fixed; the job is retried
    svc.call("POST", f"/api/v1/jobs/{task['task_id']}/retry")
    job = svc.wait_status(task["task_id"], "completed")
    done = svc.get(url)
    assert done["status"] == "completed" and done["error"] is None and "attempt" in done["result"]
    assert job["processors"]["flaky"]["output_path"] == str(folder / "flaky.json")
    assert json.loads((folder / "flaky.json").read_text()) == done
    assert sorted(p.name for p in folder.iterdir()) == ["flaky.json"]


def test_a_failure_never_replaces_a_complete_result(start_service):
    svc = start_service()
    first = svc.submit("kept.mp4", ["flaky"])
    svc.wait_status(first["task_id"], "completed")
    folder = svc.data_dir / "results" / first["file_uuid"]
    url = f"/api/v1/files/{first['file_uuid']}/results/flaky"
    complete = svc.get(url)

    svc.marker.write_text("storage is down")
    again = svc.call(
        "POST",
        f"/api/v1/file/{first['file_uuid']}/deep-scan",
        expect=202,
        json={"processors": ["flaky"], "force": True, "max_retries": 0},
    )
    job = svc.wait_status(again["task_id"], "failed")
    assert json.loads((folder / "flaky.json").read_text()) == complete, "the result is kept"
    assert job["processors"]["flaky"]["output_path"] == str(folder / "flaky.failed.json")
    failed = json.loads((folder / "flaky.failed.json").read_text())
    assert failed["status"] == "failed" and failed["task_id"] == again["task_id"]
    assert "storage unavailable" in failed["error"]
    # The complete result is what the API shows; the failure beside it, said as such.
    later = {k: failed[k] for k in ("status", "task_id", "completed_at", "error")}
    assert svc.get(url) == complete | {"later_run": later | {"last_checkpoint": None}}
    shown = svc.get(f"/api/v1/files/{first['file_uuid']}")["results"]["flaky"]
    assert shown["status"] == "completed" and shown["task_id"] == first["task_id"]
    assert shown["output_path"] == str(folder / "flaky.json")
    assert shown["later_run"]["task_id"] == again["task_id"]
    assert shown["later_run"]["status"] == "failed"

    svc.marker.unlink()
    svc.call("POST", f"/api/v1/jobs/{again['task_id']}/retry")
    svc.wait_status(again["task_id"], "completed")
    done = svc.get(url)
    assert done["status"] == "completed" and done["task_id"] == again["task_id"]
    assert "later_run" not in done
    assert not (folder / "flaky.failed.json").exists()


def test_a_cut_setting_no_run_can_use_stops_the_start_and_once_fixed_cut_runs(
    tmp_path, database_url, start_service
):
    # Found at start, naming the setting, rather than failing every job that asks for cut.
    refused = ServiceProcess(
        tmp_path / "node", database_url, {"processors.cut": {"threshold": "high"}}
    )
    refused.spawn()
    try:
        assert refused.proc.wait(timeout=60) == 2
    finally:  # not one of start_service's, so not stopped by it
        if refused.proc.poll() is None:
            refused.proc.kill()
            refused.proc.wait()
    assert "processors.cut: bad cut settings" in refused.log()

    # The operator fixes the setting and starts again.
    svc = start_service(**{"processors.cut": {"threshold": 27.0}})
    task = svc.submit("scenes.mp4", ["cut"])
    svc.wait_status(task["task_id"], "completed", timeout=60)
    done = svc.get(f"/api/v1/files/{task['file_uuid']}/results/cut")
    assert done["status"] == "completed" and done["error"] is None and done["result"]["scenes"]
    folder = svc.data_dir / "results" / task["file_uuid"]
    thumbnail = folder / done["result"]["scenes"][0]["thumbnail"]
    assert (mode(thumbnail), mode(thumbnail.parent)) == (0o600, 0o700)
    thumbnail_url = f"/api/v1/files/{task['file_uuid']}/thumbnails/0"
    assert svc.client.get(thumbnail_url).content == thumbnail.read_bytes()


def test_a_document_is_indented_json_in_a_folder_made_for_it(tmp_path):
    # Written out rather than by json.dumps: the text must be what json.dumps gives.
    record = MediaFile(file_uuid="f" * 32, fingerprint="12:ab")
    job = Job(task_id="task_0123456789ab", file=record)
    result = {
        "text": 'caf\u00e9 \u65e5\u672c "quoted" \\ \n',
        "scenes": [{"start": 0.1, "end": 1e-7, "tags": []}, {"nested": {"deep": [1, [2, {}]]}}],
        "empty": {},
        "count": 3,
        "ratio": 0.25,
        "flag": True,
    }
    folder = tmp_path / "results" / record.file_uuid  # neither folder there yet
    path = outputs.write_result(
        folder, job, "cut", outputs.COMPLETED, result, backend="cpu", version="2"
    )
    text = path.read_text(encoding="utf-8")
    document = json.loads(text)
    assert text == json.dumps(document, ensure_ascii=False, indent=2) + "\n"
    assert document["result"]["text"] == result["text"] and document["task_id"] == job.task_id
    assert (mode(path), mode(folder), mode(folder.parent)) == (0o600, 0o700, 0o700)
    assert [p.name for p in folder.iterdir()] == ["cut.json"]  # no temp file left
    # Strict JSON: NaN is refused, and nothing is written.
    with pytest.raises(store.NotJSON, match="NaN or Infinity"):
        outputs.write_result(folder, job, "yolo", outputs.COMPLETED, {"ratio": float("nan")})
    assert [p.name for p in folder.iterdir()] == ["cut.json"]


def test_times_read_as_datetime_renders_them():
    def by_datetime(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    moments = [0.0, 1764563000.9999996, 1764563000.0004999, 1764563001.5, -1.25, 4102444799.9995]
    rng = random.Random(7)
    moments += [rng.uniform(0, 4.1e9) for _ in range(2000)]
    assert [iso(ts) for ts in moments] == [by_datetime(ts) for ts in moments]
    assert iso(1764563000.9999996) == "2025-12-01T04:23:21.000Z"  # rounded up a second


# -- on disk before it is recorded --------------------------------------------------------------

_steps: list[tuple[str, str]] | None = None  # recorded while a test sets it


def _record_step(event: str, args: tuple) -> None:
    if _steps is None:
        return
    if event == "os.rename":  # os.replace too
        _steps.append(("rename", os.fsdecode(args[1])))
    elif event == "os.mkdir":
        _steps.append(("mkdir", os.fsdecode(args[0])))
    elif event == "open" and args[1] is None and not args[2] & (os.O_WRONLY | os.O_RDWR):
        _steps.append(("flush", os.fsdecode(args[0])))  # os.open to read: only to flush


sys.addaudithook(_record_step)


def test_a_document_and_every_new_folder_are_flushed_into_their_folders(tmp_path):
    # On a power cut a rename or a new folder lives only once its folder is on disk, and a
    # run's completion is committed right after its document is placed.
    global _steps
    record = MediaFile(file_uuid="e" * 32, fingerprint="12:ab")
    folder = tmp_path / "results" / record.file_uuid
    _steps = []
    try:
        job = Job(task_id="task_1", file=record)
        path = outputs.write_result(folder, job, "asr", outputs.COMPLETED, {"text": ""})
    finally:
        steps, _steps = _steps, None

    assert steps == [
        ("mkdir", str(folder)),  # not there: its parent first
        ("mkdir", str(folder.parent)),
        ("flush", str(tmp_path)),
        ("mkdir", str(folder)),
        ("flush", str(folder.parent)),
        ("rename", str(path)),
        ("flush", str(folder)),
    ]


def test_scene_thumbnails_are_flushed_before_cut_json_names_them(tmp_path):
    global _steps
    thumbnails = Keyframes(tmp_path, 64, fresh=True)
    thumbnails.open_scene(0)
    thumbnails.offer(0, np.zeros((48, 64, 3), np.uint8))
    thumbnails.close(1)
    _steps = []
    try:
        (name,) = thumbnails.publish([0])
    finally:
        steps, _steps = _steps, None

    staged = tmp_path / f".{outputs.THUMBNAILS}.new"
    work = str(tmp_path / f".{outputs.THUMBNAILS}.work")  # read by its removal at the end
    flushed = [step for step in steps if step[0] != "mkdir" and step[1] != work]
    assert flushed == [
        ("flush", str(tmp_path)),  # the staged folder's entry
        ("flush", str(staged / Path(name).name)),
        ("flush", str(staged)),
        ("rename", str(tmp_path / outputs.THUMBNAILS)),
        ("flush", str(tmp_path)),
    ]


def test_a_folder_its_file_system_cannot_flush_is_left_as_it_is():
    durable.flush_folder("/proc")  # procfs: fsync gives EINVAL


def test_the_queue_database_flushes_through_the_drive_cache(tmp_path):
    database = store.sqlite(tmp_path / "queue.db")
    database.connect()
    pragmas = [database.execute_sql(f"PRAGMA {p}").fetchone()[0] for p in PRAGMAS]
    assert pragmas == [2, 1, 1]  # FULL; F_FULLFSYNC where the system has it (macOS)


def strict(constant: str) -> None:
    """json.loads's parse_constant: NaN, Infinity and -Infinity are not JSON."""
    raise AssertionError(f"{constant} is not JSON")


@pytest.mark.parametrize(
    "holds, error",
    [
        ("nan", "it holds NaN or Infinity, which JSON cannot carry"),
        ("surrogate", "it holds '\\udce9', which UTF-8 cannot carry"),
        ("deep", "it is nested too deep to be written"),
    ],
    ids=["nan", "surrogate", "deep"],
)
def test_a_result_no_json_can_hold_fails_its_run_and_every_document_is_json(
    start_service, holds, error
):
    svc = start_service(
        service={"plugins": ["workloads:UnwritableResult", "workloads:Steps"]},
        **{"processors.unwritable_result": {"holds": holds}},
    )
    task = svc.submit("diverged.mp4", ["steps", "unwritable_result"])["task_id"]  # max_retries 3

    def ended() -> dict | None:  # every answer on the way parses as strict JSON
        job = json.loads(svc.client.get(f"/api/v1/jobs/{task}").text, parse_constant=strict)
        return job if job["status"] in ("completed", "partial", "failed") else None

    job = wait_for(ended)
    # Not kept as completed, and not retried: the model gives the same on every try.
    assert job["status"] == "partial", job
    run = job["processors"]["unwritable_result"]
    assert run["status"] == "failed" and run["attempts"] == 1, run
    assert run["error"] == f"the result cannot be written: {error}", run
    reply = svc.client.get(f"/api/v1/files/{job['file_uuid']}/results/unwritable_result")
    document = json.loads(reply.text, parse_constant=strict)
    assert document["status"] == "failed" and document["result"] is None
    assert document["error"] == run["error"]
