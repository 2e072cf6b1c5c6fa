"""A job's parts side by side (queue.job_threads): the speech branch (asr + asrx, one
transcription) and the frame pass (cut, yolo, ocr, face, pose and the ``hold`` workload,
one decode) run at once in a real service, give what they give one after the other, and
stop, resume and fail each on its own.

``hold`` (tests/workloads.py) is a frame-pass member that holds the pass at frame
``HOLD_AT`` while a marker file exists: the frame members' checkpoints before that frame
are saved, and the pass goes on only once the test removes the marker. ``boom`` and
``steps`` are other parts of known shape: one that breaks, one that takes long.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ServiceProcess, wait_for
from frame_media import photo_frame, text_frame
from media_factory import make_video
from PIL import Image
from test_asr import SHORT_SENTENCES as SENTENCES

from momentry_edge import audio

on_sqlite = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

EVERY = 3.0  # seconds between sentences: 30 s of video
FPS = 5
HOLD_AT = 15  # the frame pass saves its checkpoints at frame 10 (2 s of video), then holds
SPEECH = ["asr", "asrx"]
FRAMES = ["cut", "yolo", "ocr", "face", "pose", "hold"]
SCAN = SPEECH + FRAMES


@pytest.fixture(scope="module")
def talk(tmp_path_factory) -> Path:
    """30 s at 640x360: the astronaut photo and a line of text in turn, 6 s each (hard
    cuts), with a short sentence spoken (espeak-ng) every 3 s."""
    folder = tmp_path_factory.mktemp("talk")
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.fail("espeak-ng is not installed: scripts/test installs it")
    pcm = np.zeros(round(EVERY * len(SENTENCES) * audio.SAMPLE_RATE), np.float32)
    for k, sentence in enumerate(SENTENCES):
        wav = folder / f"sentence {k}.wav"
        subprocess.run([espeak, "-w", str(wav), sentence], check=True, capture_output=True)
        speech = audio.decode(wav)
        at = round(k * EVERY * audio.SAMPLE_RATE)
        pcm[at : at + len(speech)] = speech[: len(pcm) - at]
    with wave.open(str(folder / "speech.wav"), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(audio.SAMPLE_RATE)
        out.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    size = (640, 360)
    pictures = (
        np.asarray(Image.fromarray(photo_frame()).resize(size), np.uint8),
        text_frame(size=size, font_size=28),
    )
    return make_video(
        folder / "talk.mp4",
        segments=1,
        segment_seconds=EVERY * len(SENTENCES),
        fps=FPS,
        size=size,
        speech_wav=folder / "speech.wav",
        picture=lambda i: pictures[i // (6 * FPS) % 2],
    )


def settings(models_dir: Path, marker: Path, job_threads: int, **queue: Any) -> dict[str, Any]:
    # Low sample rates keep the frame pass to seconds on two cores; chunk_seconds puts
    # about every sentence in its own Whisper window, so asr saves a checkpoint per sentence.
    # No temperature fallback: tiny.en hears "Good morning." loops in the talk's pauses, and
    # the fallback samples those windows at random (three runs, three texts there).
    whisper = {
        "model": "whisper-tiny.en",
        "models_dir": str(models_dir),
        "chunk_seconds": 2.5,
        "temperature_fallback": False,
    }
    return {
        "service": {"plugins": ["workloads:Hold", "workloads:Boom"]},
        "queue": {"job_threads": job_threads, **queue},
        "processors.asr": whisper,
        "processors.asrx": whisper,
        "processors.yolo": {"models_dir": str(models_dir), "sample_fps": 0.5},
        "processors.ocr": {"sample_fps": 0.1},
        "processors.face": {"sample_fps": 0.5},
        "processors.pose": {"sample_fps": 0.5},
        "processors.hold": {"hold_while_exists": str(marker), "at": HOLD_AT},
        "processors.boom": {"hold_while_exists": str(marker), "step_seconds": 0.2},
    }


def submit(svc: ServiceProcess, talk: Path, processors: list[str], **extra: Any) -> str:
    shutil.copy(talk, svc.drop / "talk.mp4")
    return svc.submit("talk.mp4", processors, **extra)["task_id"]


def results(svc: ServiceProcess, job: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Each processor's result document, by name."""
    return {n: svc.get(f"/api/v1/files/{job['file_uuid']}/results/{n}") for n in names}


def assert_resumed_results(got: dict[str, Any], expected: dict[str, Any]) -> None:
    """A resumed job's results are the uninterrupted ones, every segment's times included."""
    for name in SCAN:
        assert got[name]["result"] == expected[name]["result"], name


def overlapped(job: dict[str, Any], one: str, other: str) -> bool:
    """Whether two runs of a finished job were running at the same time (their recorded
    start and end times; ISO strings in one format compare as times)."""
    a, b = job["processors"][one], job["processors"][other]
    return a["started_at"] < b["completed_at"] and b["started_at"] < a["completed_at"]


def running_with_checkpoints(svc: ServiceProcess, task: str, names: list[str]) -> bool:
    runs = svc.job(task)["processors"]
    return all(runs[n]["status"] == "running" and runs[n].get("last_checkpoint") for n in names)


def hold_log(svc: ServiceProcess, job: dict[str, Any]) -> list[int]:
    path = svc.data_dir / "results" / job["file_uuid"] / "hold.log"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="module")
def one_after_another(talk, models_dir, tmp_path_factory) -> tuple[dict[str, Any], dict]:
    """The whole scan with job_threads = 1 (one part after the other): the job, and each
    processor's result document."""
    root = tmp_path_factory.mktemp("sequential")
    svc = ServiceProcess(root, "", settings(models_dir, root / "no marker", 1))
    svc.start()
    try:
        task = submit(svc, talk, SCAN)
        job = svc.wait_status(task, "completed", "partial", "failed", timeout=300)
        assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
        return job, results(svc, job, SCAN)
    finally:
        svc.stop()


def test_side_by_side_gives_what_one_after_another_gives(
    start_service, talk, models_dir, tmp_path, one_after_another
):
    alone, expected = one_after_another
    svc = start_service(**settings(models_dir, tmp_path / "no marker", 2))
    task = submit(svc, talk, SCAN)

    job = svc.wait_status(task, "completed", "partial", "failed", timeout=300)

    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    got = results(svc, job, SCAN)
    for name in SCAN:
        assert got[name]["result"] == expected[name]["result"], name
    assert [s["text"] for s in got["asr"]["result"]["segments"]]  # speech was heard
    assert got["yolo"]["result"]["summary"].get("person")  # and the astronaut seen
    # The speech branch and the frame pass ran at the same time here, one after the other
    # with job_threads = 1.
    assert overlapped(job, "asr", "yolo") and overlapped(job, "asrx", "cut")
    assert not overlapped(alone, "asr", "yolo") and not overlapped(alone, "asrx", "cut")


@on_sqlite
def test_kill_9_with_both_parts_checkpointed_resumes_each_from_its_checkpoint(
    start_service, talk, models_dir, tmp_path, one_after_another
):
    _, expected = one_after_another
    marker = tmp_path / "hold"
    marker.touch()
    svc = start_service(**settings(models_dir, marker, 2))
    task = submit(svc, talk, SCAN)
    job = svc.job(task)
    # The frame pass holds at HOLD_AT, its checkpoints saved; asr goes on beside it.
    wait_for(lambda: len(hold_log(svc, job)) == HOLD_AT, timeout=120)
    wait_for(lambda: running_with_checkpoints(svc, task, SCAN), timeout=120)
    held = svc.job(task)["processors"]["hold"]["last_checkpoint"]["frame"]
    assert 0 < held <= HOLD_AT

    svc.kill()
    marker.unlink()
    svc.start()

    job = svc.wait_status(task, "completed", "partial", "failed", timeout=300)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    assert job["crash_count"] == 1
    for name in SCAN:
        assert job["processors"][name]["attempts"] == 2, name
    assert_resumed_results(results(svc, job, SCAN), expected)
    # Resumed, not started over: asr says where it went on, and the frame pass went on
    # from its checkpoint (only the frames after it were fed twice): the one seen before
    # the kill, or one the pass saved after it, before the hold.
    log = (svc.data_dir / "logs" / "momentry-edge.log").read_text()
    assert "asr: resuming at" in log and "asrx: resuming at" in log
    fed = hold_log(svc, job)
    resumed = fed[HOLD_AT]
    assert held <= resumed <= HOLD_AT
    assert fed == [*range(HOLD_AT), *range(resumed, FPS * round(EVERY * len(SENTENCES)))]


@on_sqlite
def test_a_graceful_stop_puts_the_job_back_and_both_parts_resume(
    start_service, talk, models_dir, tmp_path, one_after_another
):
    _, expected = one_after_another
    marker = tmp_path / "hold"
    marker.touch()
    svc = start_service(**settings(models_dir, marker, 2))
    task = submit(svc, talk, SCAN)
    wait_for(lambda: running_with_checkpoints(svc, task, SCAN), timeout=120)

    svc.proc.send_signal(signal.SIGTERM)  # both parts stop at their next report
    marker.unlink()  # the held frame pass too
    assert svc.wait_exit(timeout=60) == 0
    svc.start()

    job = svc.wait_status(task, "completed", "partial", "failed", timeout=300)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    assert job["crash_count"] == 0, "a clean stop is not a crash"
    for name in SCAN:
        assert job["processors"][name]["attempts"] == 2, name
    assert_resumed_results(results(svc, job, SCAN), expected)


@on_sqlite
def test_cancel_stops_both_parts_and_writes_their_partial_documents(
    start_service, talk, models_dir, tmp_path
):
    marker = tmp_path / "hold"
    marker.touch()
    svc = start_service(**settings(models_dir, marker, 2))
    task = submit(svc, talk, SCAN)
    wait_for(lambda: running_with_checkpoints(svc, task, SCAN), timeout=120)

    svc.call("POST", f"/api/v1/jobs/{task}/cancel")
    # The speech branch stops at its next report; the held frame pass once let go.
    wait_for(lambda: svc.job(task)["processors"]["asr"]["status"] == "pending", timeout=60)
    marker.unlink()
    job = svc.wait_status(task, "cancelled", timeout=60)

    assert job["error_message"] == "cancelled by user"
    docs = results(svc, job, SCAN)
    for name in SCAN:
        assert job["processors"][name]["status"] == "pending", name  # to do, if retried
        assert docs[name]["status"] == "partial", name
        assert docs[name]["last_checkpoint"] == job["processors"][name]["last_checkpoint"]
    assert docs["asr"]["result"]["segments"]  # what was heard before the cancel
    assert docs["yolo"]["result"]["frames_sampled"] >= 1
    assert docs["hold"]["result"]["frames"] < FPS * EVERY * len(SENTENCES)


@on_sqlite
def test_a_failing_processor_leaves_the_other_parts_complete(
    start_service, talk, models_dir, tmp_path, one_after_another
):
    _, expected = one_after_another
    marker = tmp_path / "hold"  # boom goes on while it exists, then breaks; hold waits too
    marker.touch()
    # Three parts on two threads: speech and boom first, the frame pass once boom broke.
    svc = start_service(**settings(models_dir, marker, 2, max_retries=0))
    task = submit(svc, talk, ["asr", "asrx", "boom", *FRAMES])
    wait_for(lambda: running_with_checkpoints(svc, task, ["asr", "asrx", "boom"]), timeout=120)
    marker.unlink()

    job = svc.wait_status(task, "partial", "completed", "failed", timeout=300)

    assert job["status"] == "partial", json.dumps(job["processors"], indent=1)
    boom = job["processors"]["boom"]
    assert boom["status"] == "failed" and "the model blew up" in boom["error"]
    assert overlapped(job, "asr", "boom")
    got = results(svc, job, SCAN)
    for name in SCAN:
        assert job["processors"][name]["status"] == "completed", name
        assert got[name]["result"] == expected[name]["result"], name


@on_sqlite
def test_a_task_timeout_stops_both_parts_as_timed_out_with_their_checkpoints(
    start_service, talk, models_dir, tmp_path
):
    marker = tmp_path / "hold"
    config = settings(models_dir, marker, 2, max_retries=0)
    # The other part is the steps workload: 20 s of steps, a checkpoint after each.
    config["service"]["plugins"].append("workloads:Steps")
    config["processors.steps"] = {"steps": 400, "step_seconds": 0.05}
    svc = start_service(**config)
    # A first job loads the frame models, so the timed one spends its seconds working.
    warm = submit(svc, talk, FRAMES)
    assert svc.wait_status(warm, "completed", "partial", "failed", timeout=300)["status"] == (
        "completed"
    )
    marker.touch()
    task = svc.submit("talk.mp4", ["steps", *FRAMES], force=True, task_timeout=6)["task_id"]

    # The steps run out of time while the frame pass is held; let go, the frame pass
    # stops at its next report, for the same reason.
    steps = wait_for(
        lambda: (r := svc.job(task)["processors"]["steps"])["status"] == "failed" and r,
        timeout=60,
    )
    marker.unlink()
    job = svc.wait_status(task, "failed", timeout=60)

    assert "timed out after 6 s" in steps["error"] and steps["current"] < 400
    assert "the job's task_timeout" in job["error_message"]
    docs = results(svc, job, ["steps", *FRAMES])
    folder = svc.data_dir / "results" / job["file_uuid"]
    for name in ["steps", *FRAMES]:
        run = job["processors"][name]
        assert run["status"] == "failed" and "timed out after 6 s" in run["error"], name
        assert run.get("last_checkpoint"), (name, run)
        # The frame processors' complete results (the first job's) stay shown; the
        # timed-out run is named beside them, its document set aside with what it had.
        failed = docs[name] if name == "steps" else docs[name]["later_run"]
        assert failed["status"] == "failed" and failed["task_id"] == task, name
        assert failed["last_checkpoint"] == run["last_checkpoint"], name
        if name == "steps":
            assert failed["result"] is not None
        else:
            assert docs[name]["status"] == "completed" and docs[name]["task_id"] == warm, name
            aside = json.loads((folder / f"{name}.failed.json").read_text())
            assert aside["result"] is not None and aside["task_id"] == task, name
