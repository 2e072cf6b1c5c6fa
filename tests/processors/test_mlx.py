"""asr / asrx on the MLX backend (mlx-whisper, the one Apple silicon uses), run for real.

Off a Mac, MLX runs on its CPU build (the mlx-cpu extra, which scripts/test installs on
Linux x86_64), chosen by ``backend = "mlx"``; ``auto`` keeps faster-whisper there. The
models are made here (tests/mlx_models.py): Whisper tiny.en converted from the
CTranslate2 weights the test-models extra carries, whose transcript is checked like
faster-whisper's, and a small random model, fast enough to run every path (asr, asrx,
both databases, checkpoints) whose text is noise: for it the shape is checked, not
the words.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
from media_factory import make_video
from mlx_models import convert_ct2, install, random_model
from reports import Reports
from test_asr import (
    MODEL,
    SENTENCE,
    cue_words,
    run,
    speak,
    speech_interval,
    word_error_rate,
    words,
)

from momentry_edge import audio
from momentry_edge.processors import transcription, whisper
from momentry_edge.processors.asr import AsrProcessor
from momentry_edge.processors.backends import importable, this_platform

HERE = this_platform()
if not (HERE.apple_silicon or (HERE.system, HERE.machine) == ("linux", "x86_64")):
    pytest.skip("MLX has no build for this machine", allow_module_level=True)
if not importable("mlx_whisper"):
    pytest.fail("mlx-whisper is not installed: scripts/test installs it", pytrace=False)


@pytest.fixture(scope="module")
def random_models(tmp_path_factory) -> Path:
    return install(tmp_path_factory.mktemp("random mlx"), random_model)


@pytest.fixture(scope="module")
def converted_models(models_dir, tmp_path_factory) -> Path:
    """The real tiny.en on MLX, converted from the CTranslate2 model pulled for faster-whisper."""
    ct2 = models_dir / MODEL
    return install(tmp_path_factory.mktemp("tiny.en mlx"), lambda out: convert_ct2(ct2, out))


@pytest.fixture(scope="module")
def talk(tmp_path_factory) -> Path:
    """12 s of video, the sentence spoken from 1.0 s."""
    folder = tmp_path_factory.mktemp("talk")
    wav = speak(SENTENCE, folder / "sentence.wav")
    return make_video(
        folder / "talk.mp4",
        segments=1,
        segment_seconds=12,
        fps=5,
        size=(64, 48),
        speech_wav=wav,
        speech_start=1.0,
    )


# MLX's Linux CPU wheel links the reference BLAS (netlib), which runs the tiny.en encoder
# about 9x slower than OpenBLAS. Where OpenBLAS is installed (scripts/test installs it on
# Debian), the services these tests start load it first: the same MLX code, on a faster
# matrix product. Apple silicon runs MLX on its GPU and needs none of this.
OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
FAST_BLAS = {"LD_PRELOAD": str(OPENBLAS)} if OPENBLAS.is_file() else {}


def mlx(models_dir: Path, **settings) -> dict:
    return {"backend": "mlx", "model": MODEL, "models_dir": str(models_dir), **settings}


def assert_result_shape(result: dict, duration: float, with_words: bool) -> None:
    """What the API promises of an asr/asrx result, whatever the words say (a random
    decoder's timestamps need not even come in order)."""
    assert result.keys() == {
        "language", "language_probability", "languages", "duration", "tracks", "text",
        "segments", "subtitles",
    }  # fmt: skip
    assert result["tracks"] == [0]
    assert result["language"] == "en"  # an English-only vocabulary
    assert result["duration"] == pytest.approx(duration, abs=0.1)
    segments = result["segments"]
    assert segments
    assert result["text"] == " ".join(s["text"] for s in segments)
    for s in segments:
        assert 0 <= s["start"] <= s["end"] <= result["duration"] and s["text"]
        assert s["track"] == 0
        assert ("words" in s) == with_words
        for w in s.get("words", []):
            assert 0 <= w["start"] <= w["end"] <= result["duration"]
            assert w["word"] and 0 <= w["probability"] <= 1
    if with_words:
        assert any(s["words"] for s in segments)


# -- selection ------------------------------------------------------------------------------------


def test_auto_keeps_faster_whisper_off_apple_silicon_and_mlx_runs_when_named(random_models):
    auto = AsrProcessor({"model": MODEL, "models_dir": str(random_models)})
    named = AsrProcessor(mlx(random_models))

    assert auto.backend == ("mlx" if HERE.apple_silicon else "faster-whisper")
    assert named.backend == "mlx" and named.spec.name == "whisper-tiny.en-mlx"
    assert named.readiness().ready


def test_doctor_says_mlx_can_run_here_when_named(random_models, tmp_path):
    config = tmp_path / "momentry.toml"
    config.write_text(
        f'[service]\ndata_dir = "{tmp_path / "data"}"\n\n'
        f'[processors.asr]\nbackend = "mlx"\nmodel = "{MODEL}"\nmodels_dir = "{random_models}"\n'
    )
    doctor = subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", "--config", str(config), "doctor", "--json"],
        capture_output=True,
        text=True,
    )
    asr_report = json.loads(doctor.stdout)["processors"]["asr"]
    backends = {b["name"]: b for b in asr_report["backends"]}
    assert asr_report["backend"] == "mlx" and asr_report["ready"]
    assert backends["mlx"]["chosen"] and backends["mlx"]["platform_ok"]
    assert backends["mlx"]["packages_ok"]


# -- the random model: every path, quickly -----------------------------------------------------


def test_asr_and_asrx_run_on_mlx_through_the_service(start_service, random_models, talk):
    svc = start_service(
        env=FAST_BLAS,
        **{"processors.asr": mlx(random_models), "processors.asrx": mlx(random_models)},
    )
    described = svc.get("/api/v1/processors")["processors"]
    for name in ("asr", "asrx"):
        assert described[name]["backend"] == "mlx" and described[name]["ready"] is True

    shutil.copy(talk, svc.drop / "talk.mp4")
    task = svc.submit("talk.mp4", ["asr", "asrx"])
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=600)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)

    for name in ("asr", "asrx"):
        output = svc.get(f"/api/v1/files/{task['file_uuid']}/results/{name}")
        assert output["backend"] == "mlx" and output["model"] == MODEL
        assert_result_shape(output["result"], 12.0, with_words=name == "asrx")
        subtitles = svc.data_dir / "results" / task["file_uuid"] / f"{name}.srt"
        assert cue_words(subtitles) == words(output["result"]["text"])


def test_mlx_checkpoints_every_chunk_offline(random_models, talk, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    reports = Reports()
    p = AsrProcessor(mlx(random_models, chunk_seconds=2))

    result = run(p, talk, tmp_path, reports)

    assert_result_shape(result, 12.0, with_words=False)
    options = whisper.Options(chunk_seconds=2)
    chunks = transcription.plan_chunks(transcription.speech_spans(audio.decode(talk), options), 2)
    assert len(chunks) >= 3  # the sentence is longer than 2 s
    assert [c["timestamp"] for c in reports.checkpoints] == [round(c.end, 3) for c in chunks]
    assert all(c["settings"]["backend"] == "mlx" for c in reports.checkpoints)
    assert reports.checkpoints[-1]["partial"] == result
    assert reports.calls[-1] == (12, 12)


# -- the real model, converted -------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_converted_tiny_en_transcribes_real_speech_on_mlx(
    start_service, converted_models, talk, models_dir
):
    svc = start_service(env=FAST_BLAS, **{"processors.asrx": mlx(converted_models)})
    shutil.copy(talk, svc.drop / "talk.mp4")
    task = svc.submit("talk.mp4", ["asrx"])
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=900)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)

    output = svc.get(f"/api/v1/files/{task['file_uuid']}/results/asrx")
    result = output["result"]
    assert output["backend"] == "mlx" and output["model"] == MODEL
    assert_result_shape(result, 12.0, with_words=True)
    assert word_error_rate(SENTENCE, result["text"]) <= 0.2, result["text"]
    all_words = [w for s in result["segments"] for w in s["words"]]
    assert words(" ".join(w["word"] for w in all_words)) == words(result["text"])
    start, end = speech_interval(talk)
    assert abs(all_words[0]["start"] - start) <= 0.5 and abs(all_words[-1]["end"] - end) <= 0.5
    assert all(a["start"] <= b["start"] for a, b in pairwise(all_words))


def test_importing_asr_does_not_import_mlx():
    code = "import sys, momentry_edge.processors.asr; print('mlx_whisper' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.stdout.strip() == "False", found.stderr
