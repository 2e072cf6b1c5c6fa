"""The one transcription asr and asrx share: decode the audio tracks, hear speech (VAD),
pack it into chunks, transcribe them on an engine (whisper.py) with checkpoints to
resume from, and map segments and word timings back to the file's timeline."""

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

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from momentry_edge import audio, media
from momentry_edge.processors.base import PermanentError, ProcessorError, RunContext, Stop
from momentry_edge.processors.whisper import WINDOW_SECONDS, Options, Piece

if TYPE_CHECKING:  # the members are asr's processors, which call run_shared
    from momentry_edge.processors.asr import AsrProcessor

log = logging.getLogger(__name__)

SAMPLE_RATE = audio.SAMPLE_RATE

Outcome = dict[str, Any] | BaseException


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
        assert lead.engine is not None and lead.spec is not None
        engine = lead.engine
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
