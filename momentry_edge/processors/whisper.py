"""Whisper's engines: faster-whisper (CTranslate2 int8, the CPU backend) and mlx-whisper
(Apple silicon, or MLX's CPU backend), each loading a model folder and giving the
segments of the samples it is given; and the asr settings they and the run share."""

from __future__ import annotations

import copy
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

from momentry_edge.processors.backends import MLX_HINT, Backend
from momentry_edge.processors.subtitles import Norms

# CTranslate2's OpenMP threads otherwise spin between the model's many small steps. Alone
# that costs nothing measurable; beside the frame pass it took about twice the CPU the
# transcription needs, from the cores the frames run on (benchmarks/e2e_bench.py). Read
# once, when ctranslate2 is first imported: set before any import of faster_whisper.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

WINDOW_SECONDS = 30.0  # Whisper's window


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
    # Off, as in faster-whisper's default call: cutting the silences out (Silero VAD) is
    # faster on sparse speech, but moves Whisper's windows and can cost words.
    vad: bool = False
    chunk_seconds: float = WINDOW_SECONDS  # speech packed into one Whisper window (at most)
    beam_size: int = 5  # faster-whisper; mlx-whisper decodes greedily
    compute_type: str = "int8"
    cpu_threads: int = 0  # 0: CTranslate2's default
    # On, as in both libraries' default call: a window heard as a loop or gibberish is
    # decoded again by random sampling at rising temperatures, so its text differs from
    # run to run (and a resumed run's from an unbroken one's). Off: always greedy/beam,
    # the same text each time.
    temperature_fallback: bool = True
    models_dir: str | None = None  # default <data_dir>/models
    # Subtitle cues (subtitles.Norms, whose defaults are broadcast norms).
    subtitle_lines: int = Norms.lines
    subtitle_line_chars: int = Norms.line_chars
    subtitle_line_chars_cjk: int = Norms.cjk_line_chars
    subtitle_min_seconds: float = Norms.min_seconds
    subtitle_max_seconds: float = Norms.max_seconds
    subtitle_chars_per_second: float = Norms.chars_per_second

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
        if not 1 <= opts.chunk_seconds <= WINDOW_SECONDS:
            raise ValueError("chunk_seconds must be between 1 and 30 (Whisper's window)")
        if opts.beam_size < 1 or opts.cpu_threads < 0:
            raise ValueError("beam_size must be >= 1 and cpu_threads >= 0")
        if not isinstance(opts.vad, bool) or not isinstance(opts.temperature_fallback, bool):
            raise ValueError("vad and temperature_fallback must be true or false")
        counts = (opts.subtitle_lines, opts.subtitle_line_chars, opts.subtitle_line_chars_cjk)
        if not all(type(n) is int and n >= 1 for n in counts):
            raise ValueError(
                "subtitle_lines and subtitle_line_chars(_cjk) must be whole numbers >= 1"
            )
        spans = (opts.subtitle_min_seconds, opts.subtitle_max_seconds)
        rate = opts.subtitle_chars_per_second
        if not all(type(n) in (int, float) and n > 0 for n in (*spans, rate)):
            raise ValueError("subtitle seconds and chars_per_second must be numbers above 0")
        if opts.subtitle_min_seconds > opts.subtitle_max_seconds:
            raise ValueError("subtitle_min_seconds must not be above subtitle_max_seconds")
        return opts

    def norms(self) -> Norms:
        """What a subtitle cue may hold."""
        return Norms(
            line_chars=self.subtitle_line_chars,
            cjk_line_chars=self.subtitle_line_chars_cjk,
            lines=self.subtitle_lines,
            min_seconds=float(self.subtitle_min_seconds),
            max_seconds=float(self.subtitle_max_seconds),
            chars_per_second=float(self.subtitle_chars_per_second),
        )

    def temperature(self) -> dict[str, float]:
        """The temperature argument of either library's call: its own fallback by default."""
        return {} if self.temperature_fallback else {"temperature": 0.0}

    def checkpoint_key(self, spec_name: str, backend: str, words: bool) -> dict[str, Any]:
        """What a checkpoint must have been made with to be resumed from (word timings
        move where Whisper's windows start, so they are part of it)."""
        return {
            "model": spec_name,
            "backend": backend,
            "word_timestamps": words,
            "language": self.language,
            "vad": self.vad,
            "chunk_seconds": self.chunk_seconds,
            "beam_size": self.beam_size,
            "compute_type": self.compute_type,
            "temperature_fallback": self.temperature_fallback,
        }


# -- engines: the backend-specific part, kept small -----------------------------------------------


@dataclass
class Piece:
    """A segment from a backend, times in seconds from the start of the samples it was given."""

    start: float
    end: float
    text: str
    words: list[dict[str, Any]] | None = None
    window: float = 0.0  # where the Whisper window that gave it began
    last_speech: float = 0.0  # where speech last ended before that window (word timings)
    prompt: list[int] = field(default_factory=list)  # the text tokens its window went on from


@dataclass
class Transcript:
    language: str
    language_probability: float | None
    pieces: Iterator[Piece]  # lazy: decoding happens while it is consumed


class Engine(Protocol):
    """Transcribes samples. One with ``streams = True`` decodes lazily, gives each
    piece's ``window`` and ``last_speech``, and takes ``clips=`` and ``last_speech=``:
    it is given all the speech at once."""

    def transcribe(
        self, samples: np.ndarray, *, language: str | None, word_timestamps: bool
    ) -> Transcript: ...

    def close(self) -> None:
        """Let go of the model (what the library keeps of it too)."""


def forget_vad() -> None:
    """faster-whisper keeps its Silero VAD session for the process's life (an lru_cache):
    let it go with the models, if it was loaded at all."""
    vad = sys.modules.get("faster_whisper.vad")
    if vad is not None:
        vad.get_vad_model.cache_clear()


class FasterWhisperEngine:
    """faster-whisper (CTranslate2) on the CPU."""

    # Decodes window by window while the pieces are consumed, and takes clips: all the
    # speech goes in one call, checkpointed between windows.
    streams = True

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
        self.temperature = opts.temperature()

    def transcribe(
        self,
        samples: np.ndarray,
        *,
        language: str | None,
        word_timestamps: bool,
        clips: Sequence[tuple[float, float]] = (),
        last_speech: float = 0.0,
        prompt: Sequence[int] = (),
    ) -> Transcript:
        """Pieces of ``clips`` (start and end seconds into ``samples``; default: all of
        it); no window reaches past the end of its clip. ``last_speech``: where speech
        ended before the first clip (a resumed run), for the word timings; ``prompt``:
        the text tokens the first window goes on from (a resumed run)."""
        model, last_speech_at, prompts = _going_on_from(self.model, last_speech)
        segments, info = model.transcribe(
            samples,
            language=language,
            beam_size=self.beam_size,
            word_timestamps=word_timestamps,
            vad_filter=False,  # done once for the whole file, before this
            # Each window goes on from the text before it, as in faster-whisper's default
            # call; a run resumed at a window's start is given that text (``prompt``).
            condition_on_previous_text=True,
            initial_prompt=list(prompt) or None,
            clip_timestamps=[t for clip in clips for t in clip] or "0",
            **self.temperature,
        )
        per_second = self.model.frames_per_second
        pieces = (
            Piece(
                s.start,
                s.end,
                s.text,
                # Every asrx segment has its words, if only an empty list.
                [_word(w.start, w.end, w.word, w.probability) for w in s.words or ()]
                if word_timestamps
                else None,
                window=s.seek / per_second,
                last_speech=last_speech_at.get(s.seek, 0.0),
                prompt=prompts[-1] if prompts else [],
            )
            for s in segments
        )
        return Transcript(info.language, info.language_probability, pieces)

    def close(self) -> None:
        self.model = None


def _going_on_from(model: Any, last_speech: float) -> tuple[Any, dict[int, float], list[list[int]]]:
    """A copy of faster-whisper's ``model`` for one call whose word timings go on from
    ``last_speech`` (a call starts from 0), and where speech last ended before each
    window of the call (by the window's seek), filled in as the windows are decoded.

    faster-whisper carries that value from window to window and shortens a window's
    first word if it ends long after that; a run resumed at a window must start from the
    value the uninterrupted run had there, or the segment starts elsewhere. faster-whisper
    has no option for it, so the call's word alignment is wrapped.

    And the text tokens each window went on from (the newest last): its ``prompt``,
    which a run resumed at that window is given to go on from alike."""
    call = copy.copy(model)  # shares the loaded model; only this call sees the override
    last_speech_at: dict[int, float] = {}
    own = False  # faster-whisper tracks it itself from the first window with segments

    def add_word_timestamps(segments: list, *args: Any, last_speech_timestamp: float) -> Any:
        nonlocal own
        if not own:
            last_speech_timestamp = last_speech
        if segments and segments[0]:  # the window's segments: from here on it is tracked
            last_speech_at[segments[0][0]["seek"]] = last_speech_timestamp
            own = True
        try:
            return model.add_word_timestamps(
                segments, *args, last_speech_timestamp=last_speech_timestamp
            )
        except IndexError:
            # faster-whisper finds no alignment for a sliver left at a clip's end (no
            # audio frames to align its tokens to) and fails indexing the empty result:
            # those segments keep their times, without word timings.
            for segment in segments:
                for piece in segment:
                    piece["words"] = []
            return last_speech_timestamp

    prompts: list[list[int]] = []
    kept = model.max_length // 2 - 1  # as many as Whisper's prompt takes (get_prompt)

    def get_prompt(tokenizer: Any, previous_tokens: list[int], **options: Any) -> Any:
        prompts.append(list(previous_tokens[-kept:]))  # asked once a window, before it
        return model.get_prompt(tokenizer, previous_tokens, **options)

    call.add_word_timestamps = add_word_timestamps
    call.get_prompt = get_prompt
    return call, last_speech_at, prompts


_MLX_LOCK = threading.Lock()  # mlx-whisper keeps its model in a class attribute


class MlxEngine:
    """mlx-whisper on the Apple silicon GPU (or MLX's CPU backend). Imported only here."""

    def __init__(self, path: Path, opts: Options) -> None:
        import mlx.core as mx
        from mlx_whisper.load_models import load_model

        self.path = str(path)
        # float16 on the GPU; MLX's CPU backend computes float32 faster than float16.
        self.fp16 = mx.default_device().type == mx.DeviceType.gpu
        self.temperature = opts.temperature()
        self.model = load_model(self.path, dtype=mx.float16 if self.fp16 else mx.float32)
        # Every array read in now, the positional embeddings too (not parameters): MLX
        # cannot evaluate an array on a thread other than the one that made it, and the
        # model runs on a runner thread (worker/runners.py), not this one.
        mx.eval([v for m in self.model.modules() for v in m.values() if isinstance(v, mx.array)])

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
                **self.temperature,
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

    def close(self) -> None:
        transcribe = sys.modules.get("mlx_whisper.transcribe")
        with _MLX_LOCK:
            holder = getattr(transcribe, "ModelHolder", None)
            if holder is not None and holder.model is self.model:
                holder.model = holder.model_path = None  # mlx-whisper's reference to it
        self.model = None


ENGINES: dict[str, type] = {"faster-whisper": FasterWhisperEngine, "mlx": MlxEngine}


def _word(start: float, end: float, word: str, probability: float) -> dict[str, Any]:
    return {"start": start, "end": end, "word": word, "probability": probability}
