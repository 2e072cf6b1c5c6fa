"""Speech quality: the asr processor's transcript beside faster-whisper's own default call.

    .venv/bin/python benchmarks/quality_audio.py [--model whisper-tiny.en] [--seconds 120]

Public media: JFK from faster-whisper's tests/data (tests/data/jfk.flac) as .m4a, as
an audio-only .mp4, and on the second audio track of a video behind a silent first;
the spoken sentence of issue #30 (espeak-ng); music with no voice; and a clip of
``--seconds`` of speech (the tests' sentences, one every 8 s) for the time asr takes.
Each row: whether the service takes the file (ingest extensions and probe), word
error rate of asr alone, of asr in a job with asrx, and of ``WhisperModel.transcribe``
with its defaults on the same file and model folder (music: words written, none
wanted), and asr's wall time (a loaded machine gives noisy times).
``rows`` (the same, as quality_bench.py's rows) is imported by quality_bench.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from audio_media import JFK, JFK_TEXT, SENTENCE, music, samples, spoken, write  # noqa: E402
from test_asr import SENTENCES, speech_track, word_error_rate  # noqa: E402

from momentry_edge import config, media, weights  # noqa: E402
from momentry_edge.processors import asr  # noqa: E402
from momentry_edge.processors.base import RunContext  # noqa: E402

COLUMNS = ("case", "taken", "tracks", "asr WER", "asr+asrx WER", "direct WER", "asr s", "direct s")


def _taken(path: Path) -> str:
    """What the service does with the file dropped: takes it, or why not."""
    if path.suffix not in config.IngestConfig().extensions:
        return "refused: extension"
    try:
        media.probe(path)
    except media.MediaError as e:
        return f"rejected: {e.reason}"
    return "yes"


def _score(reference: str, text: str) -> str:
    if not reference:  # nothing should be written
        return f"{len(text.split())} words"
    return f"{word_error_rate(reference, text):.3f}"


def _cases(work: Path, seconds: float) -> list[tuple[str, Path, Path, str]]:
    """(name, file, the file faster-whisper is given, reference text): the library reads
    a file's first audio track only, so it is given the second track's speech alone."""
    jfk = samples(JFK)
    m4a = write(work / "jfk.m4a", [jfk])
    sentence = spoken(SENTENCE, work)
    sentences = [SENTENCES[k % len(SENTENCES)] for k in range(max(1, int(seconds // 8)))]
    clip = write(work / "talk.mp4", [samples(speech_track(sentences, work, 8.0))], video=True)
    second = write(work / "jfk2.mp4", [jfk * 0, jfk], video=True)
    cases = [
        ("JFK .flac (as published)", JFK, JFK_TEXT),
        ("JFK .m4a", m4a, JFK_TEXT),
        ("JFK audio-only .mp4", write(work / "jfk audio.mp4", [jfk]), JFK_TEXT),
        ("JFK on track 2, track 1 silent", second, JFK_TEXT),
        ("spoken sentence, espeak-ng's 22.05 kHz .wav", work / "spoken.wav", SENTENCE),
        ("spoken sentence .wav", write(work / "memo.wav", [sentence]), SENTENCE),
        ("spoken sentence .m4a", write(work / "memo.m4a", [sentence]), SENTENCE),
        ("music only .mp3", write(work / "music.mp3", [music()]), ""),
        (f"{seconds:g} s of speech .mp4", clip, " ".join(sentences)),
    ]
    return [(name, path, m4a if path == second else path, text) for name, path, text in cases]


def table_rows(model: str = "whisper-tiny.en", seconds: float = 120.0) -> list[dict[str, Any]]:
    """One row per case (see the module docstring), keyed by ``COLUMNS``."""
    from faster_whisper import WhisperModel

    with tempfile.TemporaryDirectory(prefix="quality-audio-") as scratch:
        work = Path(scratch)
        spec = weights.load_catalog().get(model)
        weights.pull(spec, work / "models")
        settings = {
            "model": spec.model,
            "backend": "faster-whisper",
            "models_dir": str(work / "models"),
        }
        alone, pair = asr.AsrProcessor(settings), asr.AsrxProcessor(settings)
        alone.load()
        pair.load()
        folder = next((work / "models").rglob("model.bin")).parent
        direct = WhisperModel(str(folder), device="cpu", compute_type="int8")
        out = work / "out"
        out.mkdir()

        def context(path: Path) -> RunContext:
            return RunContext(path, out, None, 1, lambda *args: None)

        table = []
        for name, path, alike, reference in _cases(work, seconds):
            started = time.perf_counter()
            ours = asr.run_shared(path, [(alone, context(path))])[0]
            ours_seconds = time.perf_counter() - started
            shared = asr.run_shared(path, [(alone, context(path)), (pair, context(path))])[0]
            started = time.perf_counter()
            theirs = "".join(s.text for s in direct.transcribe(str(alike))[0]).strip()
            theirs_seconds = time.perf_counter() - started
            texts = [r["text"] if isinstance(r, dict) else f"error: {r}" for r in (ours, shared)]
            table.append(
                {
                    "case": name,
                    "taken": _taken(path),
                    "tracks": ours.get("tracks", "-") if isinstance(ours, dict) else "-",
                    "asr WER": _score(reference, texts[0]),
                    "asr+asrx WER": _score(reference, texts[1]),
                    "direct WER": _score(reference, theirs),
                    "asr s": f"{ours_seconds:.2f}",
                    "direct s": f"{theirs_seconds:.2f}",
                }
            )
        return table


def rows(model: str = "whisper-tiny.en", seconds: float = 120.0) -> list[tuple[str, ...]]:
    """quality_bench.py's rows: (processor, media, edge, reference, verdict); ok where the
    service takes the file and asr, alone and beside asrx, is no worse than the library."""
    out = []
    for row in table_rows(model, seconds):
        ours, paired, theirs = row["asr WER"], row["asr+asrx WER"], row["direct WER"]
        if theirs.endswith("words"):  # no speech: no words wanted
            good = ours == paired == "0 words"
        else:
            good = max(float(ours), float(paired)) <= float(theirs)
        edge = f"WER {ours} (with asrx {paired}), tracks {row['tracks']}, taken {row['taken']}"
        verdict = "ok" if good and row["taken"] == "yes" else "FAIL"
        out.append(("asr", row["case"], edge, f"faster-whisper default {theirs}", verdict))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-tiny.en", help="a faster-whisper catalog entry")
    parser.add_argument("--seconds", type=float, default=120.0, help="the speech clip's length")
    args = parser.parse_args()
    table = table_rows(args.model, args.seconds)
    widths = [max(len(c), *(len(str(r[c])) for r in table)) for c in COLUMNS]
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for row in table:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))


if __name__ == "__main__":
    main()
