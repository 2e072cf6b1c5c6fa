"""Speech to text (``asr``) and speech to text with word timings (``asrx``)."""

# One piece (~960 lines): the speech processors and the one transcription they share
# (chunks, checkpoints, word timings) change together.

# One pipeline, two backends. The run decodes the audio once (PyAV, 16 kHz mono,
# sample for sample as faster-whisper decodes it), each audio track, and transcribes
# the tracks where Silero VAD hears speech (the only one when there is one), each on
# its own; segments say their track. With ``vad`` it cuts the silences out as
# faster-whisper's own VAD filter does, and packs the speech into chunks of at most
# ``chunk_seconds`` that begin and end at silences. faster-whisper (CTranslate2
# int8, the CPU backend) transcribes a track in one call, window after window as
# Whisper does; with
# ``chunk_seconds`` below Whisper's 30 s window no window reaches past its chunk
# (more checkpoints, at a cost in speed);
# mlx-whisper (Apple silicon; also on MLX's CPU backend on Linux x86_64 when
# configured by name, slower, so that the Apple path is tested) is given one chunk
# per call. Times are mapped back to the file's timeline here, so the result is
# the same shape whichever backend ran.
#
# The run saves a checkpoint (the segments so far and where to go on from) at the
# start of every Whisper window (saved when that window's first segment is out,
# so a resume redoes at most two windows) and after every chunk. Two things carry
# over from one window to the next, and the checkpoint keeps both, so a resumed run
# gives the same segments as an uninterrupted one: the text so far (as in
# faster-whisper's default call, each window is decoded going on from it), and with
# word timings where speech last ended, from which faster-whisper judges whether a
# window's first word follows a pause (and then shortens it, moving the segment's
# start).
#
# asr and asrx of one job with the same settings share one transcription
# (``run_shared``, with word timings); each keeps its own result, progress,
# checkpoint and outcome.

from __future__ import annotations

import copy
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from momentry_edge import audio, media, weights
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
    Stop,
)

log = logging.getLogger(__name__)

# CTranslate2's OpenMP threads otherwise spin between the model's many small steps. Alone
# that costs nothing measurable; beside the frame pass it took about twice the CPU the
# transcription needs, from the cores the frames run on (benchmarks/e2e_bench.py). Read
# once, when ctranslate2 is first imported: set before any import of faster_whisper.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SAMPLE_RATE = audio.SAMPLE_RATE
WINDOW_SECONDS = 30.0  # Whisper's window

Outcome = dict[str, Any] | BaseException


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
        if not 1 <= opts.chunk_seconds <= WINDOW_SECONDS:
            raise ValueError("chunk_seconds must be between 1 and 30 (Whisper's window)")
        if opts.beam_size < 1 or opts.cpu_threads < 0:
            raise ValueError("beam_size must be >= 1 and cpu_threads >= 0")
        if not isinstance(opts.vad, bool):
            raise ValueError("vad must be true or false")
        return opts

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
    """Stretches of one audio track (sample ranges) that are transcribed together,
    concatenated."""

    spans: tuple[tuple[int, int], ...]
    track: int = 0  # among the file's audio tracks, from 0

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


def plan_chunks(spans: list[tuple[int, int]], chunk_seconds: float, track: int = 0) -> list[Chunk]:
    """Pack speech spans, in order, into chunks of at most ``chunk_seconds`` of audio."""
    limit = int(chunk_seconds * SAMPLE_RATE)
    chunks: list[Chunk] = []
    current: list[tuple[int, int]] = []
    length = 0
    for a, b in spans:
        if current and length + (b - a) > limit:
            chunks.append(Chunk(tuple(current), track))
            current, length = [], 0
        current.append((a, b))
        length += b - a
    if current:
        chunks.append(Chunk(tuple(current), track))
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
        self._bad_settings: str | None = None
        self.spec: weights.ModelSpec | None = None
        try:
            self.opts = Options.parse(self.settings)
        except (TypeError, ValueError) as e:
            self.opts = Options()
            self._problem = self._bad_settings = f"bad {self.name} settings: {e}"
        self.choice = choose(
            BACKENDS, self.opts.backend, platform=platform or this_platform(), can_import=can_import
        )
        self.backend = self.choice.name
        self.model = self.opts.model
        self.models_dir = (
            Path(self.opts.models_dir).expanduser()
            if self.opts.models_dir
            else weights.models_root()
        )
        if self._problem is None and self.choice.backend is None:
            self._problem = f"no {self.name} backend: {self.choice.reason}"
        if self._problem is None:
            self._find_model(self.backend)

    def _find_model(self, backend: str) -> None:
        try:
            catalog = weights.load_catalog()
        except weights.ModelError as e:
            self._problem = str(e)
            return
        self.spec = catalog.find(self.opts.model, backend, self.name)
        if self.spec is None:
            # A model no run here can load: the service refuses to start with it.
            self._problem = self._bad_settings = (
                f"model: {catalog.unknown(self.name, self.opts.model, backend)}"
            )
        else:
            self.model = self.spec.model

    def settings_problem(self) -> str | None:
        return self._bad_settings

    def readiness(self) -> Readiness:
        if self._problem is not None:
            return Readiness(False, self._problem)
        assert self.spec is not None
        state = weights.state(self.spec, self.models_dir)
        return Readiness(state.ready, state.reason)

    def load(self) -> None:
        state = self.readiness()
        if not state.ready:
            raise PermanentError(state.reason or "not ready")
        if self._engine is not None:
            return
        assert self.spec is not None
        folder = weights.model_dir(self.spec, self.models_dir)
        try:
            self._engine = ENGINES[self.backend](folder, self.opts)
        except Exception as e:  # verified files the library cannot read, or the library
            raise PermanentError(
                f"{self.backend} cannot load {folder}: {type(e).__name__}: {e}; "
                + weights.unloadable_fix(self.spec, self.models_dir)
            ) from e
        log.info("%s: %s model %s loaded from %s", self.name, self.backend, self.model, folder)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        outcome = run_shared(ctx.media_path, [(self, ctx)])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def write_subtitles(self, ctx: RunContext, segments: list[dict[str, Any]]) -> None:
        ctx.write_text(f"{self.name}.srt", to_srt(segments))
        ctx.write_text(f"{self.name}.vtt", to_vtt(segments))


class AsrxProcessor(AsrProcessor):
    """``asr`` plus the start, end and probability of every word."""

    name = "asrx"
    word_timestamps = True


def can_share(first: Processor, second: Processor) -> bool:
    """Whether two processors of one job can share one transcription (``run_shared``):
    asr and asrx with the same settings. Otherwise each runs on its own."""
    return (
        isinstance(first, AsrProcessor)
        and isinstance(second, AsrProcessor)
        and first.opts == second.opts
        and first.backend == second.backend
    )


def run_shared(
    media_path: Path, members: Sequence[tuple[AsrProcessor, RunContext]]
) -> list[Outcome]:
    """Transcribe ``media_path`` once for every member; each member's result or error.

    The members have the same settings (``can_share``); words are decoded when one
    of them wants them, and left out of the others' results. A ``Stop`` from any
    member's report (cancel, shutdown, timeout: all job-wide) ends the run after
    every member has saved its checkpoint; each unfinished member's outcome is then
    that ``Stop``. A member whose report or output fails leaves the run alone.
    """
    return _Transcription(media_path, members).run()


class _NobodyLeft(Exception):
    """Every member failed: nothing is left to transcribe for."""


@dataclass
class _State:
    """How far a transcription got: units [0, unit) done, and unit ``unit`` up to ``at``
    seconds into its samples, where speech last ended ``last_speech`` seconds into them;
    ``saved`` checkpoints so far."""

    unit: int = 0
    at: float = 0.0
    last_speech: float = 0.0
    prompt: list[int] = field(default_factory=list)
    saved: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    language: str | None = None
    probability: float | None = None


class _Transcription:
    def __init__(
        self, media_path: Path, members: Sequence[tuple[AsrProcessor, RunContext]]
    ) -> None:
        self.media_path = media_path
        self.members = list(members)
        self.active = list(range(len(members)))  # slots still running
        self.outcomes: list[Outcome | None] = [None] * len(members)
        # asrx if it is there: its words are left out for asr, not decoded twice.
        self.lead, self.lead_ctx = max(members, key=lambda m: m[0].word_timestamps)
        self.opts = self.lead.opts
        self.words = self.lead.word_timestamps
        self.names = "+".join(p.name for p, _ in members)
        self.state = _State()
        self.duration = 0.0
        self.total = 1  # progress in whole seconds of audio
        self.units: list[Chunk] = []
        self.tracks: list[int] = []  # the audio tracks transcribed
        self.heard: dict[int, list[tuple[int, int]]] = {}  # speech by track, for _snap
        self.key: dict[str, Any] = {}

    def run(self) -> list[Outcome]:
        try:
            self._transcribe()
        except _NobodyLeft:
            pass
        except BaseException as exc:  # Stop, or an error every member shares (media, model)
            for slot in self.active:
                self.outcomes[slot] = exc
        return self.outcomes  # type: ignore[return-value]

    def _transcribe(self) -> None:
        lead, opts, state = self.lead, self.opts, self.state
        # The worker loads a processor only if it was ready when first made; a model
        # pulled since then is loaded here, on first use.
        lead.load()
        assert lead._engine is not None and lead.spec is not None
        engine = lead._engine
        tracks = _decode(self.media_path)
        if not any(len(pcm) for pcm in tracks):  # no audio track, or empty ones
            self._report(1, 1, lambda partial: {"timestamp": 0.0, "partial": partial})
            self._finish()
            return

        self.duration = max(len(pcm) for pcm in tracks) / SAMPLE_RATE
        # Where the VAD hears speech, track by track: which tracks to transcribe, and
        # where segments without word timings start and end (Whisper's own segment
        # times run from the start of its window, often seconds before the speech).
        listen = opts.vad or not self.words or sum(1 for pcm in tracks if len(pcm)) > 1
        heard = {
            t: speech_spans(pcm, opts) if opts.vad else _hears(pcm) if listen else []
            for t, pcm in enumerate(tracks)
            if len(pcm)
        }
        speech = {
            t: heard[t] if opts.vad else speech_spans(tracks[t], opts)
            for t in _speaking_tracks(heard)
        }
        self.heard = {} if self.words else heard
        self.tracks = sorted(speech)
        self.total = max(1, round(self.duration)) * len(speech)
        clips: list[list[tuple[float, float]]] = []  # a streaming engine's, unit by unit
        for track, spans in speech.items():
            chunks = plan_chunks(spans, opts.chunk_seconds, track)
            if getattr(engine, "streams", False):
                # A track's speech in one unit. By default in Whisper's own windows, as
                # faster-whisper's VAD filter has them. Shorter chunks become the call's
                # clips, so windows end at their silences; that costs windows beyond the
                # checkpoints gained: Whisper seldom closes a short window's last segment,
                # which is then decoded again (twice the windows with 30 s clips).
                if spans:
                    unit = Chunk(tuple(spans), track)
                    self.units.append(unit)
                    short = opts.chunk_seconds < WINDOW_SECONDS
                    clips.append(_clips(chunks if short else [unit]))
            else:
                self.units += chunks
        units = self.units
        self.key = opts.checkpoint_key(lead.spec.name, lead.backend, self.words)
        self.key["tracks"] = self.tracks
        self.state = state = _resume(self.lead_ctx.checkpoint, self.key, units)
        reached = _file_time(units, state.unit, state.at)
        if state.saved:
            for processor, _ in self.members:
                log.info("%s: resuming at %.1f s of %.1f s", processor.name, reached, self.duration)
        self._report(self._progress(state.unit, reached) if state.saved else 0, self.total)

        first = state.unit
        for index in range(first, len(units)):
            unit = units[index]
            start = state.at  # 0 but where a run resumes inside a unit
            log.info(
                "%s: %s transcribes %.1f s of speech from %.1f s of audio track %d",
                self.names,
                lead.backend,
                sum(b - a for a, b in unit.spans) / SAMPLE_RATE - start,
                unit.to_file_time(start),
                unit.track,
            )
            transcript = engine.transcribe(
                unit.samples(tracks[unit.track]),
                language=state.language or opts.language,
                word_timestamps=self.words,
                # The clips from where this run starts (only a streaming engine has
                # clips, and only there can a run start inside a unit).
                **(
                    {
                        "clips": _from(clips[index], start),
                        "last_speech": state.last_speech,
                        "prompt": state.prompt,
                    }
                    if clips
                    else {}
                ),
            )
            if state.language is None:  # the first call decides for the whole file
                state.language = transcript.language
                state.probability = transcript.language_probability
            window = start
            for piece in transcript.pieces:
                if piece.window > window:  # every window before this piece's is decoded
                    window = piece.window
                    self._checkpoint(index, window, piece.last_speech, piece.prompt)
                segment = _segment(piece, unit, self.heard.get(unit.track))
                if segment is not None:
                    state.segments.append(segment)
                    self._report(self._progress(index, segment["end"]), self.total)
            self._checkpoint(index + 1, 0.0)

        if first == len(units):  # no speech at all, or every unit was done before a restart
            stamp = round(self.duration, 3)
            self._report(self.total, self.total, lambda p: {"timestamp": stamp, "partial": p})
        self._finish()

    def _checkpoint(
        self, unit: int, at: float, last_speech: float = 0.0, prompt: Sequence[int] = ()
    ) -> None:
        """Units before ``unit``, and ``at`` seconds of unit ``unit``, are done: save that,
        with where speech last ended before ``at`` (word timings go on from there) and
        the text tokens the window at ``at`` goes on from."""
        state = self.state
        state.unit, state.at, state.saved = unit, at, state.saved + 1
        state.last_speech, state.prompt = last_speech, list(prompt)
        stamp = round(_file_time(self.units, unit, at), 3)
        last = unit == len(self.units)
        self._report(
            self.total if last else self._progress(unit, stamp),
            self.total,
            lambda partial: {
                "timestamp": stamp,
                "chunk": state.saved,
                "resume": [unit, round(at, 3)],
                "last_speech": last_speech,  # not rounded: the resumed run goes on from it
                "prompt": state.prompt,
                "settings": self.key,
                "partial": partial,
            },
        )

    def _progress(self, unit: int, seconds: float) -> int:
        """Whole seconds of audio done, ``seconds`` into unit ``unit``'s track (the
        tracks are transcribed one after the other)."""
        if unit >= len(self.units):
            return self.total
        done = self.tracks.index(self.units[unit].track) * max(1, round(self.duration))
        return min(self.total, done + math.floor(seconds))

    def _finish(self) -> None:
        """Each member's subtitles and result."""
        state = self.state
        for slot in list(self.active):
            processor, ctx = self.members[slot]
            try:
                segments = _view(state.segments, processor.word_timestamps)
                processor.write_subtitles(ctx, segments)
                self.outcomes[slot] = _result(
                    state.language, state.probability, self.duration, segments, self.tracks
                )
            except BaseException as exc:
                self.outcomes[slot] = exc

    def _report(
        self,
        current: int,
        total: int,
        checkpoint: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """Report to every member, each with its own checkpoint (made from its partial
        result) if one is due; raises the first Stop once all have reported."""
        first_stop = None
        for slot in list(self.active):
            processor, ctx = self.members[slot]
            try:
                saved = None
                if checkpoint is not None:
                    saved = checkpoint(self._partial(processor))
                ctx.report(current, total, saved)
            except Stop as stop:
                first_stop = first_stop or stop  # job-wide: the others still save theirs
            except BaseException as exc:
                self.outcomes[slot] = exc
                self.active.remove(slot)
        if first_stop is not None:
            raise first_stop
        if not self.active:
            raise _NobodyLeft

    def _partial(self, processor: AsrProcessor) -> dict[str, Any]:
        state = self.state
        segments = _view(state.segments, processor.word_timestamps)
        return _result(state.language, state.probability, self.duration, segments, self.tracks)


def _decode(path: Path) -> list[np.ndarray]:
    try:
        return audio.decode_tracks(path)
    except media.MediaNotFoundError as e:
        raise ProcessorError(e.reason, transient=True) from None
    except media.MediaError as e:
        raise PermanentError(e.reason) from None


def _speaking_tracks(heard: dict[int, list[tuple[int, int]]]) -> list[int]:
    """The tracks to transcribe: the one there is, or every track where the VAD hears
    speech (a camera's silent or noise-only track is left out); the first when it hears
    none, so Whisper has the last word, as on a file with one track."""
    if len(heard) == 1:
        return list(heard)
    return [t for t, spans in heard.items() if spans] or [min(heard)]


def _hears(pcm: np.ndarray) -> list[tuple[int, int]]:
    """Sample ranges with speech (Silero VAD, as ``speech_spans`` finds it)."""
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    options = VadOptions(min_silence_duration_ms=500, speech_pad_ms=200)
    found = get_speech_timestamps(pcm, options, sampling_rate=SAMPLE_RATE)
    return [(int(s["start"]), int(s["end"])) for s in found if s["end"] > s["start"]]


def _clips(chunks: list[Chunk]) -> list[tuple[float, float]]:
    """Each chunk's start and end, in seconds into all the chunks' samples end to end."""
    clips = []
    at = 0
    for chunk in chunks:
        length = sum(b - a for a, b in chunk.spans)
        clips.append((at / SAMPLE_RATE, (at + length) / SAMPLE_RATE))
        at += length
    return clips


def _from(clips: list[tuple[float, float]], start: float) -> list[tuple[float, float]]:
    """What is left of ``clips`` from ``start`` on."""
    return [(max(a, start), b) for a, b in clips if b > start]


def _file_time(units: list[Chunk], unit: int, at: float) -> float:
    """Seconds into the file of a point ``at`` seconds into unit ``unit``'s samples."""
    if unit < len(units):
        return units[unit].to_file_time(at)
    return units[-1].end if units else 0.0


def _view(segments: list[dict[str, Any]], words: bool) -> list[dict[str, Any]]:
    """The segments as a member sees them: with their words for asrx only."""
    if words:
        return segments
    return [{k: v for k, v in s.items() if k != "words"} for s in segments]


def _resume(checkpoint: dict[str, Any] | None, key: dict[str, Any], units: list[Chunk]) -> _State:
    """Where to go on from, from a usable checkpoint.

    One made with other settings, or whose position is not where this run's plan
    puts it, or without where speech last ended or the text it went on from (made
    before those were kept), is ignored: the run starts over rather than mix two plans.
    """
    if not checkpoint or checkpoint.get("settings") != key:
        return _State()
    position, saved = checkpoint.get("resume"), checkpoint.get("chunk")
    if not (isinstance(position, list) and len(position) == 2 and type(saved) is int):
        return _State()
    unit, at = position
    last_speech: Any = checkpoint.get("last_speech")  # checked below
    if type(unit) is not int or not 0 <= unit <= len(units):
        return _State()
    if type(at) not in (int, float) or type(last_speech) not in (int, float):
        return _State()
    if saved < 1 or at < 0 or last_speech < 0 or (unit == len(units) and at):
        return _State()
    if abs(_file_time(units, unit, at) - checkpoint.get("timestamp", -1)) > 1e-3:
        return _State()
    prompt = checkpoint.get("prompt")
    if not (isinstance(prompt, list) and all(type(t) is int for t in prompt)):
        return _State()
    partial = checkpoint.get("partial") or {}
    return _State(
        unit=unit,
        at=float(at),
        last_speech=float(last_speech),
        prompt=prompt,
        saved=saved,
        segments=list(partial.get("segments", [])),
        language=partial.get("language"),
        probability=partial.get("language_probability"),
    )


def _segment(
    piece: Piece, chunk: Chunk, heard: list[tuple[int, int]] | None = None
) -> dict[str, Any] | None:
    text = piece.text.strip()
    if not text:
        return None
    start, end = _span(chunk, piece.start, piece.end)
    if heard and piece.words is None:
        start, end = _snap(start, end, heard)
    segment: dict[str, Any] = {"start": start, "end": end, "text": text, "track": chunk.track}
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


def _snap(start: float, end: float, heard: list[tuple[int, int]]) -> tuple[float, float]:
    """A segment's span narrowed to the speech heard within it (none heard: as it is)."""
    inside = [(a, b) for a, b in heard if a / SAMPLE_RATE < end and b / SAMPLE_RATE > start]
    if not inside:
        return start, end
    first = max(start, round(inside[0][0] / SAMPLE_RATE, 3))
    return first, max(first, min(end, round(inside[-1][1] / SAMPLE_RATE, 3)))


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
    tracks: list[int],
) -> dict[str, Any]:
    """The API.md ``asr``/``asrx`` result; with several tracks, their segments in time
    order (each says its track)."""
    if len(tracks) > 1:
        segments = sorted(segments, key=lambda s: (s["start"], s.get("track", 0)))
    return {
        "language": language,
        "language_probability": None if probability is None else round(float(probability), 4),
        "duration": round(duration, 3),
        "tracks": tracks,
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
