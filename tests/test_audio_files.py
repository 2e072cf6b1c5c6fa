"""Audio as studios get it, dropped in the watched folder, results read over HTTP: audio
files of every common format, an audio-only mp4, a video without sound, speech on the
second of two audio tracks, mono/stereo/5.1 at odd rates, and music with no voice.

asr's text is held to faster-whisper's own default call on the same file (the library
as its users call it): never more word errors than that, with asrx beside it or not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from audio_media import JFK, JFK_TEXT, SENTENCE, music, samples, spoken, write
from conftest import ServiceProcess, wait_for
from test_asr import MODEL, word_error_rate

FRAME_PROCESSORS = ["cut", "yolo", "ocr", "face", "pose"]
NOT_APPLICABLE = "not applicable: the file has no video track"
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture(scope="module")
def direct(models_dir: Path) -> Callable[[Path], str]:
    """faster-whisper's default call on a file: its text. Asked again for the same bytes
    (a test's two cases make the same files), the text it gave them."""
    from faster_whisper import WhisperModel

    folder = next(models_dir.rglob("model.bin")).parent
    model = WhisperModel(str(folder), device="cpu", compute_type="int8")
    texts: dict[str, str] = {}

    def call(path: Path) -> str:
        key = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if key not in texts:
            texts[key] = "".join(s.text for s in model.transcribe(str(path))[0]).strip()
        return texts[key]

    return call


def drop_service(
    start_service: Callable[..., ServiceProcess], models_dir: Path, processors: list[str]
) -> ServiceProcess:
    whisper = {"model": MODEL, "models_dir": str(models_dir)}
    return start_service(
        ingest={"processors": processors, "settle_seconds": 0.3, "rescan_interval": 3600},
        **{
            "processors.asr": whisper,
            "processors.asrx": whisper,
            "processors.yolo": {"models_dir": str(models_dir)},
        },
    )


def drop(svc: ServiceProcess, made: Path) -> None:
    """Into the watched folder whole, as an upload that ends with a rename."""
    made.rename(svc.drop / made.name)


def finished_jobs(svc: ServiceProcess, names: list[str], timeout: float = 240) -> dict[str, dict]:
    """Each dropped file's job once it has ended, by file name."""

    def ended() -> dict[str, dict] | None:
        known = {f["path"]: f for f in svc.get("/api/v1/files?limit=100")["files"]}
        found = {}
        for name in names:
            record = known.get(name)
            if record is None or record["state"] != "present":
                return None
            detail = svc.get(f"/api/v1/files/{record['file_uuid']}")
            if not detail["jobs"]:
                return None
            job = svc.job(detail["jobs"][0]["task_id"])
            if job["status"] not in ("completed", "partial", "failed"):
                return None
            found[name] = job
        return found

    return wait_for(ended, timeout=timeout, interval=0.5)


def result(svc: ServiceProcess, job: dict, name: str = "asr") -> dict:
    return svc.get(f"/api/v1/files/{job['file_uuid']}/results/{name}")["result"]


def test_audio_files_of_every_common_format_are_transcribed(
    start_service, models_dir, direct, tmp_path
):
    svc = drop_service(start_service, models_dir, ["asr", *FRAME_PROCESSORS])
    jfk = samples(JFK)
    made = [
        write(tmp_path / f"interview{ext}", [jfk])
        for ext in (".m4a", ".wav", ".aac", ".flac", ".ogg", ".opus")
    ]
    made.append(write(tmp_path / "interview.mp3", [jfk], cover=True))  # with cover art
    made.append(write(tmp_path / "voice-over only.mp4", [jfk]))  # audio only, video's ending
    for path in made:
        drop(svc, path)

    jobs = finished_jobs(svc, [p.name for p in made])
    for path in made:
        job = jobs[path.name]
        assert job["status"] == "completed", (path.name, job["processors"])
        assert job["processors"]["asr"]["status"] == "completed"
        for name in FRAME_PROCESSORS:
            run = job["processors"][name]
            assert (run["status"], run.get("reason")) == ("skipped", NOT_APPLICABLE), name
        text = result(svc, job)["text"]
        reference = word_error_rate(JFK_TEXT, direct(svc.drop / path.name))
        assert word_error_rate(JFK_TEXT, text) <= reference, (path.name, text)
        assert word_error_rate(JFK_TEXT, text) <= 0.1, (path.name, text)
    files = {f["path"]: f for f in svc.get("/api/v1/files?limit=100")["files"]}
    detail = svc.get(f"/api/v1/files/{files['interview.m4a']['file_uuid']}")
    assert detail["audio_codec"] == "aac" and detail["video_codec"] is None
    assert (detail["hdr"], detail["sample_aspect_ratio"], detail["mirrored"]) == (None, None, False)
    assert detail["duration"] == pytest.approx(11.0, abs=0.1)


def test_a_video_without_sound_completes_with_an_empty_transcript(
    start_service, models_dir, tmp_path
):
    svc = drop_service(start_service, models_dir, ["asr", "cut"])
    silent = write(tmp_path / "b-roll.mp4", [], video=True, seconds=3.0)
    drop(svc, silent)

    job = finished_jobs(svc, ["b-roll.mp4"])["b-roll.mp4"]
    assert job["status"] == "completed", job["processors"]
    assert result(svc, job)["text"] == ""
    assert result(svc, job)["tracks"] == []
    assert result(svc, job, "cut")["scenes"]


def test_speech_on_the_second_audio_track_is_found_and_named(
    start_service, models_dir, direct, tmp_path
):
    svc = drop_service(start_service, models_dir, ["asr", "asrx"])
    jfk = samples(JFK)
    sentence = spoken(SENTENCE, tmp_path)
    quiet = write(tmp_path / "camera.mp4", [jfk * 0, jfk], video=True)
    alone = write(tmp_path / "alone.wav", [jfk])
    # An interview: each voice on its own microphone, one after the other.
    interview = write(
        tmp_path / "two mics.mov",
        [np.concatenate([jfk, sentence * 0]), np.concatenate([jfk * 0, sentence])],
        video=True,
    )
    for path in (quiet, interview):
        drop(svc, path)

    jobs = finished_jobs(svc, ["camera.mp4", "two mics.mov"])
    reference = word_error_rate(JFK_TEXT, direct(alone))
    for name in ("asr", "asrx"):
        job = jobs["camera.mp4"]
        assert job["processors"][name]["status"] == "completed"
        found = result(svc, job, name)
        assert found["tracks"] == [1]
        assert {s["track"] for s in found["segments"]} == {1}
        assert word_error_rate(JFK_TEXT, found["text"]) <= reference, found["text"]

        both = result(svc, jobs["two mics.mov"], name)
        assert both["tracks"] == [0, 1]
        by_track = {
            t: " ".join(s["text"] for s in both["segments"] if s["track"] == t) for t in (0, 1)
        }
        assert word_error_rate(JFK_TEXT, by_track[0]) <= 0.1, by_track
        assert word_error_rate(SENTENCE, by_track[1]) <= 0.25, by_track
        assert min(s["start"] for s in both["segments"] if s["track"] == 1) > 10.5


@pytest.mark.parametrize(
    ("name", "rate", "layout", "channel"),
    [
        ("phone call.wav", 8_000, "mono", None),
        ("field recorder.flac", 96_000, "stereo", None),
        ("stereo, one side.mp3", 44_100, "stereo", 1),
        ("surround.m4a", 48_000, "5.1", 2),  # dialogue in the centre channel alone
    ],
)
def test_any_channel_layout_and_sample_rate_is_heard(
    start_service, models_dir, direct, tmp_path, name, rate, layout, channel
):
    svc = drop_service(start_service, models_dir, ["asr"])
    made = write(tmp_path / name, [samples(JFK)], rate=rate, layout=layout, channel=channel)
    drop(svc, made)

    job = finished_jobs(svc, [name])[name]
    assert job["status"] == "completed", job["processors"]
    text = result(svc, job)["text"]
    assert word_error_rate(JFK_TEXT, text) <= 0.1, text
    assert word_error_rate(JFK_TEXT, text) <= word_error_rate(JFK_TEXT, direct(svc.drop / name))


@pytest.mark.parametrize("processors", [["asr"], ["asr", "asrx"]], ids=["alone", "with asrx"])
def test_asr_is_never_worse_than_the_library_and_music_gives_no_text(
    start_service, models_dir, direct, tmp_path, processors
):
    svc = drop_service(start_service, models_dir, processors)
    native = spoken(SENTENCE, tmp_path, rate=None)  # espeak-ng's own samples, 22.05 kHz
    made = [
        write(tmp_path / "memo.mov", [native], rate=22_050, source_rate=22_050, video=True,
              codec="pcm_s16le"),
        write(tmp_path / "memo.m4a", [spoken(SENTENCE, tmp_path)]),
        write(tmp_path / "soundtrack.mp3", [music()]),
    ]  # fmt: skip
    for path in made:
        drop(svc, path)

    jobs = finished_jobs(svc, [p.name for p in made])
    for memo in ("memo.mov", "memo.m4a"):
        reference = word_error_rate(SENTENCE, direct(svc.drop / memo))
        for name in processors:
            text = result(svc, jobs[memo], name)["text"]
            assert word_error_rate(SENTENCE, text) <= reference, (memo, name, text)
    soundtrack = jobs["soundtrack.mp3"]
    assert direct(svc.drop / "soundtrack.mp3") == ""
    for name in processors:
        assert result(svc, soundtrack, name)["text"] == ""
        assert result(svc, soundtrack, name)["segments"] == []
