"""Nothing in the drop folder is passed over in silence: a camera's MXF is taken, a file of
a kind not taken is listed as ignored with its reason (and logged once), and a watched
folder that is not there is a warning in `status`, the TUI and `doctor`. A real service
process watching real folders; the MXF is a real one made with PyAV."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import wait_for

INGEST = {"settle_seconds": 0.5, "processors": ["noop"], "rescan_interval": 3600}


def make_mxf(path: Path, frames: int = 25) -> Path:
    """A one-second MPEG-2 video in an MXF container, as broadcast cameras write."""
    with av.open(str(path), "w", format="mxf") as container:
        stream = container.add_stream("mpeg2video", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            image = np.full((48, 64, 3), i * 8, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOMENTRY_")}
    return subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *args],
        env=env | {"MOMENTRY_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def files_by_name(svc) -> dict[str, dict]:
    return {f["file_name"]: f for f in svc.get("/api/v1/files")["files"]}


def test_mxf_is_taken_and_a_kind_not_taken_is_listed_as_ignored(start_service, tmp_path) -> None:
    svc = start_service(ingest=INGEST)
    make_mxf(svc.drop / "CAMERA_B002.MXF")
    (svc.drop / "notes.txt").write_text("shot list")
    files = wait_for(
        lambda: (f := files_by_name(svc)).keys() >= {"CAMERA_B002.MXF", "notes.txt"} and f
    )

    camera = files["CAMERA_B002.MXF"]
    assert camera["state"] == "present", camera
    job = svc.wait_status(camera["file_uuid"], "completed")
    assert job["file_name"] == "CAMERA_B002.MXF"
    assert svc.get(f"/api/v1/files/{camera['file_uuid']}")["duration"] == pytest.approx(1, 0.2)

    notes = files["notes.txt"]
    assert notes["state"] == "ignored" and notes["status"] is None
    assert notes["reason"] == "extension '.txt' is not in [ingest].extensions"
    ignored = svc.get("/api/v1/files?state=ignored")["files"]
    assert [f["file_name"] for f in ignored] == ["notes.txt"]

    # A rescan counts it (it said "new 0" before) and records it once; the log says it once.
    rescan = cli("rescan", "--url", svc.url, data_dir=tmp_path)
    assert "ignored 1" in rescan.stdout and "new 0" in rescan.stdout, rescan
    assert svc.get("/api/v1/files?state=ignored")["total"] == 1
    logged = svc.log().split("--- stderr ---")[0]  # the JSON-lines log file
    said = [line for line in logged.splitlines() if "notes.txt" in line]
    assert len(said) == 1 and "not in [ingest].extensions" in said[0], svc.log()

    # Its kind taken from now on: read as any new file (not a video, so rejected; written
    # long enough ago not to be taken for an upload still under way).
    svc.stop()
    old = time.time() - 600
    os.utime(svc.drop / "notes.txt", (old, old))
    config = svc.config_path.read_text()
    svc.config_path.write_text(config.replace("[ingest]\n", '[ingest]\nextensions = [".txt"]\n'))
    svc.start()
    notes = wait_for(lambda: (f := files_by_name(svc)["notes.txt"])["state"] == "rejected" and f)
    assert "not a" in notes["reason"] or "media" in notes["reason"], notes


def test_a_watched_folder_gone_is_a_warning_in_status_and_doctor(start_service, tmp_path):
    gone = tmp_path / "volume"
    drop = tmp_path / "node" / "drop"  # the service's own (ServiceProcess.drop)
    svc = start_service(ingest=INGEST, service={"watch": [str(drop), str(gone)]})
    assert svc.drop == drop and gone.is_dir()  # made at the start
    assert svc.status()["warnings"] == []
    gone.rmdir()  # as a volume unmounted

    expected = f"watched folder {gone} does not exist"
    wait_for(lambda: any(expected in w for w in svc.status()["warnings"]))
    status = cli("status", "--url", svc.url, data_dir=tmp_path)
    assert f"warning: {expected}" in status.stdout, status
    doctor = cli("--config", str(svc.config_path), "doctor", data_dir=tmp_path)
    assert f"warning:  {expected}" in doctor.stdout, doctor.stdout + doctor.stderr
    report = json.loads(
        cli("--config", str(svc.config_path), "doctor", "--json", data_dir=tmp_path).stdout
    )
    assert report["watch_warnings"] == [f"{expected}: nothing there is taken"]

    # Once it is back, the warning goes.
    gone.mkdir()
    wait_for(lambda: svc.status()["warnings"] == [])
