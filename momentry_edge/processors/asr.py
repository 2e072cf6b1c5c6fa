"""Speech to text (``asr``) and speech to text with word timings (``asrx``).

One pipeline, two backends. The run decodes the audio once (PyAV, 16 kHz mono),
finds speech with Silero VAD, and packs the speech into chunks of at most
``chunk_seconds`` (silences between them cut out, as faster-whisper's own VAD
filter does). Each chunk is transcribed on its own by the backend the machine
has: mlx-whisper on Apple silicon, faster-whisper (CTranslate2 int8) elsewhere
(mlx-whisper also runs on MLX's CPU backend on Linux x86_64 when configured by
name: slower than faster-whisper, it is there so that the Apple path is tested).
Times are mapped back to the file's timeline here, so the result is the same
shape whichever backend ran.

After every chunk the run saves a checkpoint (the segments so far and the
audio time reached). Chunks never depend on each other, so a resumed run skips
the finished chunks and returns what an uninterrupted run would.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from momentry_edge import audio, media, models
from momentry_edge.processors.backends import (
    MLX_HINT,
    Backend,
    Platform,
    choose,
    importable,
    this_platform,
)
from momentry_edge.processors.base import (
    PermanentError,
    Processor,
    ProcessorError,
    Readiness,
    RunContext,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = audio.SAMPLE_RATE


# Fastest first; selection (backends.choose) is a pure function of the platform, the
# importable packages and the configured backend, so it is tested on any machine.
# Both use faster-whisper's Silero VAD (onnxruntime), so MLX needs it installed too.
BACKENDS = (
    Backend(
        "mlx",
        ("mlx_whisper", "faster_whisper"),
        apple_only=True,
        runs_elsewhere=True,  # MLX's CPU backend, when `backend = "mlx"` is set
        hint=MLX_HINT,
    ),
    Backend("faster-whisper", ("faster_whisper",)),
)


# -- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    backend: str = "auto"
    model: str = "whisper-base"
    language: str | None = None  # None: detect from the first chunk of speech
    vad: bool = True
    chunk_seconds: float = 30.0  # Whisper's window; also the most work a resume redoes
    beam_size: int = 5  # faster-whisper; mlx-whisper decodes greedily
    compute_type: str = "int8"
    cpu_threads: int = 0  # 0: CTranslate2's default
    models_dir: str | None = None  # default <data_dir>/models

    @classmethod
    def parse(cls, settings: Mapping[str, Any]) -> Options:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown setting {unknown[0]!r}")
        opts = cls(**dict(settings))
        texts = (opts.backend, opts.model, opts.compute_type)
        if not all(isinstance(t, str) for t in texts) or not isinstance(opts.language, str | None):
            raise ValueError("backend, model, language and compute_type must be strings")
        if not all(type(n) is int for n in (opts.beam_size, opts.cpu_threads)):
            raise ValueError("beam_size and cpu_threads must be whole numbers")
        if type(opts.chunk_seconds) not in (int, float):
            raise ValueError("chunk_seconds must be a number")
        if not 1 <= opts.chunk_seconds <= 30:
            raise ValueError("chunk_seconds must be between 1 and 30 (Whisper's window)")
        if opts.beam_size < 1 or opts.cpu_threads < 0:
            raise ValueError("beam_size must be >= 1 and cpu_threads >= 0")
        if not isinstance(opts.vad, bool):
            raise ValueError("vad must be true or false")
        return opts

    def checkpoint_key(self, spec_name: str, backend: str) -> dict[str, Any]:
        """What a checkpoint must have been made with to be resumed from."""
        return {
            "model": spec_name,
            "backend": backend,
            "language": self.language,
            "vad": self.vad,
            "chunk_seconds": self.chunk_seconds,
            "beam_size": self.beam_size,
            "compute_type": self.compute_type,
        }


# -- engines: the backend-specific part, kept small -----------------------------------------------


@dataclass
class Piece:
    """A segment from a backend, times in seconds from the start of the chunk it was given."""

    start: float
    end: float
    text: str
    words: list[dict[str, Any]] | None = None


@dataclass
class Transcript:
    language: str
    language_probability: float | None
    pieces: Iterator[Piece]  # lazy: decoding happens while it is consumed


class Engine(Protocol):
    def transcribe(
        self, samples: np.ndarray, *, language: str | None, word_timestamps: bool
    ) -> Transcript: ...


class FasterWhisperEngine:
    """faster-whisper (CTranslate2) on the CPU."""

    def __init__(self, path: Path, opts: Options) -> None:
        from faster_whisper import WhisperModel

        logging.getLogger("faster_whisper").setLevel(logging.WARNING)
        # A local folder, never a hub name: nothing is downloaded here.
        self.model = WhisperModel(
            str(path),
            device="cpu",
            compute_type=opts.compute_type,
            cpu_threads=opts.cpu_threads,
            local_files_only=True,
        )
        self.beam_size = opts.beam_size

    def transcribe(
        self, samples: np.ndarray, *, language: str | None, word_timestamps: bool
    ) -> Transcript:
        segments, info = self.model.transcribe(
            samples,
            language=language,
            beam_size=self.beam_size,
            word_timestamps=word_timestamps,
            vad_filter=False,  # done once for the whole file, before chunking
        )  # one call per chunk: no text carries over between chunks, so they resume alone
        pieces = (
            Piece(
                s.start,
                s.end,
                s.text,
                # Every asrx segment has its words, if only an empty list.
                [_word(w.start, w.end, w.word, w.probability) for w in s.words or ()]
                if word_timestamps
                else None,
            )
            for s in segments
        )
        return Transcript(info.language, info.language_probability, pieces)


_MLX_LOCK = threading.Lock()  # mlx-whisper keeps its model in a class attribute


class MlxEngine:
    """mlx-whisper on the Apple silicon GPU (or MLX's CPU backend). Imported only here."""

    def __init__(self, path: Path, opts: Options) -> None:
        import mlx.core as mx
        from mlx_whisper.load_models import load_model

        self.path = str(path)
        # float16 on the GPU; MLX's CPU backend computes float32 faster than float16.
        self.fp16 = mx.default_device().type == mx.DeviceType.gpu
        self.model = load_model(self.path, dtype=mx.float16 if self.fp16 else mx.float32)

    def transcribe(
        self, samples: np.ndarray, *, language: str | None, word_timestamps: bool
    ) -> Transcript:
        import mlx_whisper
        from mlx_whisper.transcribe import ModelHolder

        with _MLX_LOCK:
            # Hand mlx-whisper our loaded model so it neither reloads nor looks at the hub.
            ModelHolder.model, ModelHolder.model_path = self.model, self.path
            result = mlx_whisper.transcribe(
                samples,
                path_or_hf_repo=self.path,
                language=language,
                word_timestamps=word_timestamps,
                fp16=self.fp16,  # the dtype the model was loaded with
                verbose=None,
            )
        pieces = [
            Piece(
                s["start"],
                s["end"],
                s["text"],
                [
                    _word(w["start"], w["end"], w["word"], w["probability"])
                    for w in s.get("words") or ()
                ]
                if word_timestamps
                else None,
            )
            for s in result["segments"]
        ]
        return Transcript(result["language"], None, iter(pieces))


ENGINES: dict[str, type] = {"faster-whisper": FasterWhisperEngine, "mlx": MlxEngine}


def _word(start: float, end: float, word: str, probability: float) -> dict[str, Any]:
    return {"start": start, "end": end, "word": word, "probability": probability}


# -- chunks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """Stretches of the audio (sample ranges) that are transcribed together, concatenated."""

    spans: tuple[tuple[int, int], ...]

    @property
    def start(self) -> float:
        return self.spans[0][0] / SAMPLE_RATE

    @property
    def end(self) -> float:
        return self.spans[-1][1] / SAMPLE_RATE

    def samples(self, pcm: np.ndarray) -> np.ndarray:
        return np.concatenate([pcm[a:b] for a, b in self.spans])

    def to_file_time(self, t: float, *, is_end: bool = False) -> float:
        """A time in the concatenated chunk -> seconds in the file."""
        offset = 0.0
        for i, (a, b) in enumerate(self.spans):
            length = (b - a) / SAMPLE_RATE
            last = i == len(self.spans) - 1
            # An end exactly on a seam belongs to the span before it.
            if t < offset + length or (is_end and t <= offset + length) or last:
                return a / SAMPLE_RATE + min(max(t - offset, 0.0), length)
            offset += length
        return self.end


def speech_spans(pcm: np.ndarray, opts: Options) -> list[tuple[int, int]]:
    """Sample ranges with speech (Silero VAD), each at most ``chunk_seconds`` long."""
    limit = int(opts.chunk_seconds * SAMPLE_RATE)
    if not opts.vad:
        return [(a, min(a + limit, len(pcm))) for a in range(0, len(pcm), limit)]
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    found = get_speech_timestamps(
        pcm,
        VadOptions(
            max_speech_duration_s=opts.chunk_seconds,
            min_silence_duration_ms=500,
            speech_pad_ms=200,
        ),
        sampling_rate=SAMPLE_RATE,
    )
    return [(int(s["start"]), int(s["end"])) for s in found if s["end"] > s["start"]]


def plan_chunks(spans: list[tuple[int, int]], chunk_seconds: float) -> list[Chunk]:
    """Pack speech spans, in order, into chunks of at most ``chunk_seconds`` of audio."""
    limit = int(chunk_seconds * SAMPLE_RATE)
    chunks: list[Chunk] = []
    current: list[tuple[int, int]] = []
    length = 0
    for a, b in spans:
        if current and length + (b - a) > limit:
            chunks.append(Chunk(tuple(current)))
            current, length = [], 0
        current.append((a, b))
        length += b - a
    if current:
        chunks.append(Chunk(tuple(current)))
    return chunks


# -- the processor --------------------------------------------------------------------------------


class AsrProcessor(Processor):
    name = "asr"
    version = "1"
    word_timestamps = False

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        platform: Platform | None = None,
        can_import: Callable[[str], bool] = importable,
    ) -> None:
        super().__init__(settings)
        self._engine: Engine | None = None
        self._problem: str | None = None  # why this processor cannot run, known up front
        self.spec: models.ModelSpec | None = None
        try:
            self.opts = Options.parse(self.settings)
        except (TypeError, ValueError) as e:
            self.opts = Options()
            self._problem = f"bad {self.name} settings: {e}"
        self.choice = choose(
            BACKENDS, self.opts.backend, platform=platform or this_platform(), can_import=can_import
        )
        self.backend = self.choice.name
        self.model = self.opts.model
        self.models_dir = (
            Path(self.opts.models_dir).expanduser()
            if self.opts.models_dir
            else models.models_root()
        )
        if self._problem is None and self.choice.backend is None:
            self._problem = f"no {self.name} backend: {self.choice.reason}"
        if self._problem is None:
            self._find_model(self.backend)

    def _find_model(self, backend: str) -> None:
        try:
            catalog = models.load_catalog()
        except models.ModelError as e:
            self._problem = str(e)
            return
        self.spec = catalog.find(self.opts.model, backend)
        if self.spec is None:
            self._problem = (
                f"no {backend} model {self.opts.model!r} in the model catalog "
                "(`momentry-edge models list` shows them)"
            )
        else:
            self.model = self.spec.model

    def readiness(self) -> Readiness:
        if self._problem is not None:
            return Readiness(False, self._problem)
        assert self.spec is not None
        state = models.state(self.spec, self.models_dir)
        return Readiness(state.ready, state.reason)

    def load(self) -> None:
        state = self.readiness()
        if not state.ready:
            raise PermanentError(state.reason or "not ready")
        if self._engine is not None:
            return
        assert self.spec is not None
        folder = models.model_dir(self.spec, self.models_dir)
        try:
            self._engine = ENGINES[self.backend](folder, self.opts)
        except Exception as e:  # a model the library cannot read: pulling it again helps
            raise PermanentError(
                f"{self.backend} cannot load {folder}: {type(e).__name__}: {e}; "
                f"run `{models.pull_command(self.spec, self.models_dir)}`"
            ) from e
        log.info("%s: %s model %s loaded from %s", self.name, self.backend, self.model, folder)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        # The worker loads a processor only if it was ready when first made; a model
        # pulled since then is loaded here, on first use.
        self.load()
        assert self._engine is not None and self.spec is not None
        pcm = _decode(ctx.media_path)
        if pcm is None or len(pcm) == 0:
            result = _result(None, None, 0.0, [])  # no audio track, or an empty one
            ctx.report(1, 1, {"timestamp": 0.0, "partial": result})
            self._write_subtitles(ctx, [])
            return result

        duration = len(pcm) / SAMPLE_RATE
        total = max(1, round(duration))  # progress in whole seconds of audio
        chunks = plan_chunks(speech_spans(pcm, self.opts), self.opts.chunk_seconds)
        key = self.opts.checkpoint_key(self.spec.name, self.backend)
        done, segments, language, probability = _resume(ctx.checkpoint, key, chunks)
        if done:
            log.info(
                "%s: resuming at %.1f s of %.1f s (chunk %d of %d)",
                self.name,
                chunks[done - 1].end,
                duration,
                done,
                len(chunks),
            )
        ctx.report(min(total, math.floor(chunks[done - 1].end)) if done else 0, total)

        for index in range(done, len(chunks)):
            chunk = chunks[index]
            transcript = self._engine.transcribe(
                chunk.samples(pcm),
                language=language or self.opts.language,
                word_timestamps=self.word_timestamps,
            )
            if language is None:  # the first chunk decides for the whole file
                language, probability = transcript.language, transcript.language_probability
            for piece in transcript.pieces:
                segment = _segment(piece, chunk)
                if segment is not None:
                    segments.append(segment)
                    ctx.report(min(total, math.floor(segment["end"])), total)
            partial = _result(language, probability, duration, segments)
            checkpoint = {
                "timestamp": round(chunk.end, 3),
                "chunk": index + 1,
                "settings": key,
                "partial": partial,
            }
            last = index == len(chunks) - 1
            ctx.report(total if last else min(total, math.floor(chunk.end)), total, checkpoint)

        result = _result(language, probability, duration, segments)
        if done == len(chunks):  # no speech at all, or every chunk was done before a restart
            ctx.report(total, total, {"timestamp": round(duration, 3), "partial": result})
        self._write_subtitles(ctx, segments)
        return result

    def _write_subtitles(self, ctx: RunContext, segments: list[dict[str, Any]]) -> None:
        ctx.write_text(f"{self.name}.srt", to_srt(segments))
        ctx.write_text(f"{self.name}.vtt", to_vtt(segments))


class AsrxProcessor(AsrProcessor):
    """``asr`` plus the start, end and probability of every word."""

    name = "asrx"
    word_timestamps = True


def _decode(path: Path) -> np.ndarray | None:
    try:
        return audio.decode(path)
    except media.MediaNotFoundError as e:
        raise ProcessorError(e.reason, transient=True) from None
    except media.MediaError as e:
        raise PermanentError(e.reason) from None


def _resume(
    checkpoint: dict[str, Any] | None, key: dict[str, Any], chunks: list[Chunk]
) -> tuple[int, list[dict[str, Any]], str | None, float | None]:
    """(chunks done, segments so far, language, its probability) from a usable checkpoint.

    One made with other settings, or whose chunk boundary does not fall where this
    run's plan puts it, is ignored: the run starts over rather than mix two plans.
    """
    fresh: tuple[int, list[dict[str, Any]], str | None, float | None] = (0, [], None, None)
    if not checkpoint or checkpoint.get("settings") != key:
        return fresh
    done = checkpoint.get("chunk")
    partial = checkpoint.get("partial") or {}
    if not isinstance(done, int) or not 0 < done <= len(chunks):
        return fresh
    if abs(chunks[done - 1].end - checkpoint.get("timestamp", -1)) > 1e-3:
        return fresh
    return (
        done,
        list(partial.get("segments", [])),
        partial.get("language"),
        partial.get("language_probability"),
    )


def _segment(piece: Piece, chunk: Chunk) -> dict[str, Any] | None:
    text = piece.text.strip()
    if not text:
        return None
    start, end = _span(chunk, piece.start, piece.end)
    segment: dict[str, Any] = {"start": start, "end": end, "text": text}
    if piece.words is not None:
        segment["words"] = []
        for w in piece.words:
            if word := w["word"].strip():
                w_start, w_end = _span(chunk, w["start"], w["end"])
                probability = round(float(w["probability"]), 4)
                segment["words"].append(
                    {"start": w_start, "end": w_end, "word": word, "probability": probability}
                )
    return segment


def _span(chunk: Chunk, start: float, end: float) -> tuple[float, float]:
    """Chunk times -> file times; an end before its start (a decoder's timestamp tokens
    can come out of order) is put at the start, so every span reads forwards."""
    first = round(chunk.to_file_time(float(start)), 3)
    return first, max(first, round(chunk.to_file_time(float(end), is_end=True), 3))


def _result(
    language: str | None,
    probability: float | None,
    duration: float,
    segments: list[dict[str, Any]],
) -> dict[str, Any]:
    """The API.md ``asr``/``asrx`` result."""
    return {
        "language": language,
        "language_probability": None if probability is None else round(float(probability), 4),
        "duration": round(duration, 3),
        "text": " ".join(s["text"] for s in segments),
        "segments": segments,
    }


# -- subtitles ------------------------------------------------------------------------------------


def to_srt(segments: list[dict[str, Any]]) -> str:
    blocks = [
        f"{i}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{s['text']}\n"
        for i, s in enumerate(segments, 1)
    ]
    return "\n".join(blocks)


def to_vtt(segments: list[dict[str, Any]]) -> str:
    blocks = [
        f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text']}\n" for s in segments
    ]
    return "\n".join(["WEBVTT\n", *blocks])


def _clock(seconds: float, decimal: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"
