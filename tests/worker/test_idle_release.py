"""An idle service lets its models go (``models.idle_release_seconds``) and starts afresh
in its own process to give their libraries' memory back (``models.idle_restart``); the next
job loads them again and completes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import ServiceProcess, wait_for
from frame_media import photo_frame
from media_factory import make_video
from PIL import Image
from test_asr import speech_track

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

# The frame pass on two threads and asr with asrx (one shared transcription): the parts
# whose finished runs once kept their models referenced.
SCAN = ["asr", "asrx", "yolo", "face"]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """4 s at 320x180, 5 fps: the astronaut, and a sentence spoken."""
    folder = tmp_path_factory.mktemp("clip")
    wav = speech_track(["Good morning."], folder, 4.0)
    picture = np.asarray(Image.fromarray(photo_frame()).resize((320, 180)), np.uint8)
    return make_video(
        folder / "clip.mp4",
        segments=1,
        segment_seconds=4.0,
        fps=5,
        size=(320, 180),
        speech_wav=wav,
        picture=lambda i: picture,
    )


def loaded(svc: ServiceProcess) -> dict[str, int]:
    """Processor -> instances holding a loaded model, as GET /api/v1/processors says."""
    return {n: p["loaded"] for n, p in svc.get("/api/v1/processors")["processors"].items()}


def scan(svc: ServiceProcess, clip: Path, name: str) -> None:
    shutil.copy(clip, svc.drop / name)
    with (svc.drop / name).open("ab") as f:
        f.write(name.encode())  # another file's content: not a duplicate of the first
    task = svc.submit(name, SCAN)["task_id"]
    job = svc.wait_status(task, "completed", "partial", "failed", timeout=120)
    assert job["status"] == "completed", job


@on_sqlite
def test_an_idle_service_lets_its_models_go_starts_afresh_and_the_next_job_loads_them(
    start_service, models_dir, clip
) -> None:
    whisper = {"model": "whisper-tiny.en", "models_dir": str(models_dir)}
    svc = start_service(
        queue={"job_threads": 2},
        models={"idle_release_seconds": 1},
        **{
            "processors.asr": whisper,
            "processors.asrx": whisper,
            "processors.yolo": {"models_dir": str(models_dir)},
        },
    )
    assert set(loaded(svc).values()) == {0}  # nothing loaded at start
    process = psutil.Process(svc.proc.pid)
    at_start = process.memory_info().rss

    scan(svc, clip, "first.mp4")
    used = _high_water_mark(process)
    # Idle: the models go, then the service starts afresh in the same process, on the
    # same port; what the model libraries kept is given back with the old image.
    wait_for(lambda: starts(svc) == 2, timeout=60)
    assert "starting afresh" in svc.log()
    assert set(loaded(svc).values()) == {0}  # the API answers, as before, on the same port
    assert svc.proc.poll() is None and process.pid == svc.proc.pid
    rss = process.memory_info().rss
    assert rss < 100 * 2**20 and rss < used / 4, (at_start, used, rss)

    scan(svc, clip, "second.mp4")  # loads them again
    wait_for(lambda: starts(svc) == 3, timeout=60)  # and afresh again
    assert set(loaded(svc).values()) == {0}
    assert svc.stop() == 0  # an ordinary stop ends it


@on_sqlite
def test_with_idle_restart_off_the_models_go_and_the_process_stays(
    start_service, models_dir, clip
) -> None:
    svc = start_service(
        models={"idle_release_seconds": 1, "idle_restart": False},
        **{"processors.yolo": {"models_dir": str(models_dir)}},
    )
    shutil.copy(clip, svc.drop / "clip.mp4")
    task = svc.submit("clip.mp4", ["yolo"])["task_id"]
    assert svc.wait_status(task, "completed", "failed", timeout=120)["status"] == "completed"
    # The release and the fresh start are said by one thread, one line after the other.
    wait_for(lambda: "let go" in svc.log(), timeout=30)
    assert loaded(svc) == {name: 0 for name in loaded(svc)}
    assert "starting afresh" not in svc.log() and starts(svc) == 1


def starts(svc: ServiceProcess) -> int:
    """How often the service said it listens: at its start and at each fresh start."""
    log_file = svc.data_dir / "logs" / "momentry-edge.log"
    return log_file.read_text(errors="replace").count(" listening on ")


def _high_water_mark(process: psutil.Process) -> int:
    """The process's peak resident size over its image's life (Linux /proc), bytes."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")
