"""The one transcription asr and asrx share: decode the audio tracks, hear speech (VAD),
pack it into chunks, transcribe them on an engine (whisper.py) with checkpoints to
resume from, and map segments and word timings back to the file's timeline."""

# One piece (~645 lines): a run's sources, their chunks and its checkpoint are one state
# that a resumed run restores whole; the cues are cut in subtitles.py.
# One pipeline, two backends. The run decodes the audio once (PyAV, 16 kHz mono,
# sample for sample as faster-whisper decodes it), each audio track (a stereo track
# whose channels carry different speech as its two channels apart: a source each), and
# transcribes the sources where Silero VAD hears speech (the only one when there is
# one), each on its own and in its own language; segments say their track (and
# channel). A segment where the VAD hears no one is not kept. With ``vad`` it cuts the
# silences out as faster-whisper's own VAD filter does, and packs the speech into
# chunks of at most ``chunk_seconds`` that begin and end at silences. faster-whisper
# (CTranslate2 int8, the CPU backend) transcribes a source in one call, window after
# window as Whisper does; with
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

if TYPE_CHECKING:
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


CHANNELS = ("left", "right")


@dataclass(frozen=True)
class Source:
    """What one transcription hears: an audio track with its channels mixed, or one
    channel of a stereo track whose channels carry different speech (a microphone on
    each, ``audio.channels_apart``)."""

    track: int  # among the file's audio tracks, from 0
    channel: int | None = None  # 0 left, 1 right; None: every channel mixed

    def describe(self) -> dict[str, Any]:
        """How segments and the result name it: its track, and its channel if apart."""
        if self.channel is None:
            return {"track": self.track}
        return {"track": self.track, "channel": CHANNELS[self.channel]}

    def __str__(self) -> str:
        return " ".join(f"{k} {v}" for k, v in self.describe().items())


@dataclass(frozen=True)
class Chunk:
    """Stretches of one source's samples (sample ranges) that are transcribed together,
    concatenated."""

    spans: tuple[tuple[int, int], ...]
    source: int = 0  # the index of its Source in the run's list

    @property
    def start(self) -> float:
        return self.spans[0][0] / SAMPLE_RATE

    @property
    def end(self) -> float:
        return self.spans[-1][1] / SAMPLE_RATE

    def samples(self, pcm: np.ndarray) -> np.ndarray:
        import numpy as np

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


def plan_chunks(spans: list[tuple[int, int]], chunk_seconds: float, source: int = 0) -> list[Chunk]:
    """Pack speech spans, in order, into chunks of at most ``chunk_seconds`` of audio."""
    limit = int(chunk_seconds * SAMPLE_RATE)
    chunks: list[Chunk] = []
    current: list[tuple[int, int]] = []
    length = 0
    for a, b in spans:
        if current and length + (b - a) > limit:
            chunks.append(Chunk(tuple(current), source))
            current, length = [], 0
        current.append((a, b))
        length += b - a
    if current:
        chunks.append(Chunk(tuple(current), source))
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
    # Each source's language and its probability, by source index: the first call on
    # a source detects it from that source's own speech (unless one is configured).
    languages: dict[int, tuple[str, float | None]] = field(default_factory=dict)


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
        self.sources: list[Source] = []  # every source of the file
        self.pairs: dict[int, np.ndarray] = {}  # a channel source's stereo pair, by source
        self.chosen: list[int] = []  # the sources transcribed (indices)
        self.heard: dict[int, list[tuple[int, int]]] = {}  # speech by source (VAD)
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
        self.sources, samples, self.pairs = _decode(self.media_path)
        if not any(len(pcm) for pcm in samples):  # no audio track, or empty ones
            self._report(1, 1, lambda partial: {"timestamp": 0.0, "partial": partial})
            self._finish()
            return

        self.duration = max(len(pcm) for pcm in samples) / SAMPLE_RATE
        # Where the VAD hears speech, source by source: which sources to transcribe,
        # where segments start and end (Whisper's own segment times run from the start
        # of its window, often seconds before the speech), and where nobody speaks (no
        # segment is kept there: a window of silence heard as a loop and sampled again
        # at random can come out as a sentence).
        heard = {
            t: speech_spans(pcm, opts) if opts.vad else _hears(pcm)
            for t, pcm in enumerate(samples)
            if len(pcm)
        }
        speech = {
            t: heard[t] if opts.vad else speech_spans(samples[t], opts)
            for t in _speaking_tracks(heard)
        }
        self.heard = heard
        self.chosen = sorted(speech)
        self.total = max(1, round(self.duration)) * len(speech)
        clips: list[list[tuple[float, float]]] = []  # a streaming engine's, unit by unit
        for source, spans in speech.items():
            chunks = plan_chunks(spans, opts.chunk_seconds, source)
            if getattr(engine, "streams", False):
                # A track's speech in one unit. By default in Whisper's own windows, as
                # faster-whisper's VAD filter has them. Shorter chunks become the call's
                # clips, so windows end at their silences; that costs windows beyond the
                # checkpoints gained: Whisper seldom closes a short window's last segment,
                # which is then decoded again (twice the windows with 30 s clips).
                if spans:
                    unit = Chunk(tuple(spans), source)
                    self.units.append(unit)
                    short = opts.chunk_seconds < WINDOW_SECONDS
                    clips.append(_clips(chunks if short else [unit]))
            else:
                self.units += chunks
        units = self.units
        self.key = opts.checkpoint_key(lead.spec.name, lead.backend, self.words)
        self.key["sources"] = [self.sources[i].describe() for i in self.chosen]
        self.state = state = _resume(self.lead_ctx.checkpoint, self.key, units, self.sources)
        reached = _file_time(units, state.unit, state.at)
        if state.saved:
            for processor, _ in self.members:
                log.info("%s: resuming at %.1f s of %.1f s", processor.name, reached, self.duration)
        self._report(self._progress(state.unit, reached) if state.saved else 0, self.total)

        first = state.unit
        for index in range(first, len(units)):
            unit = units[index]
            start = state.at  # 0 but where a run resumes inside a unit
            known = state.languages.get(unit.source)
            log.info(
                "%s: %s transcribes %.1f s of speech from %.1f s of audio %s",
                self.names,
                lead.backend,
                sum(b - a for a, b in unit.spans) / SAMPLE_RATE - start,
                unit.to_file_time(start),
                self.sources[unit.source],
            )
            transcript = engine.transcribe(
                unit.samples(samples[unit.source]),
                language=known[0] if known else opts.language,
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
            if known is None:  # a source's first call decides for the source
                state.languages[unit.source] = (
                    transcript.language,
                    transcript.language_probability,
                )
            window = start
            for piece in transcript.pieces:
                if piece.window > window:  # every window before this piece's is decoded
                    window = piece.window
                    self._checkpoint(index, window, piece.last_speech, piece.prompt)
                segment = _segment(piece, unit, self.sources[unit.source], self.heard)
                if segment is not None and self._spoken(unit.source, segment):
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
        """Whole seconds of audio done, ``seconds`` into unit ``unit``'s source (the
        sources are transcribed one after the other)."""
        if unit >= len(self.units):
            return self.total
        done = self.chosen.index(self.units[unit].source) * max(1, round(self.duration))
        return min(self.total, done + math.floor(seconds))

    def _finish(self) -> None:
        """Each member's subtitles and result."""
        speech = {
            _where(self.sources[i]): [(a / SAMPLE_RATE, b / SAMPLE_RATE) for a, b in spans]
            for i, spans in self.heard.items()
        }
        for slot in list(self.active):
            processor, ctx = self.members[slot]
            try:
                result = self._partial(processor)
                processor.write_subtitles(ctx, result, speech)
                self.outcomes[slot] = result
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
        languages = {self.sources[i]: found for i, found in state.languages.items()}
        chosen = [self.sources[i] for i in self.chosen]
        return _result(languages, self.duration, segments, chosen, processor.name)

    def _spoken(self, source: int, segment: dict[str, Any]) -> bool:
        """Whether someone speaks where ``segment`` is: the VAD hears speech within it,
        and, on one channel of a pair, that channel is not 10 dB quieter there than the
        other (what it has is the other microphone's speech bleeding in)."""
        start, end = segment["start"], segment["end"]
        heard = self.heard.get(source, [])
        if not any(a / SAMPLE_RATE < end and b / SAMPLE_RATE > start for a, b in heard):
            return False
        channel = self.sources[source].channel
        pair = self.pairs.get(source)
        return (
            pair is None or channel is None or not audio.louder_elsewhere(pair, channel, start, end)
        )


def _decode(path: Path) -> tuple[list[Source], list[np.ndarray], dict[int, np.ndarray]]:
    """The file's sources and their samples, and each channel source's stereo pair: a
    track as one, its channels mixed; a stereo track whose channels carry different
    speech as two, left and right. 5.1 and other layouts are mixed into one (as
    FFmpeg mixes them, the centre's dialogue foremost)."""
    import numpy as np

    try:
        tracks = audio.decode_tracks(path)
        channels = audio.channel_counts(path)
        sources: list[Source] = []
        samples: list[np.ndarray] = []
        pairs: dict[int, np.ndarray] = {}
        for track, pcm in enumerate(tracks):
            pair = audio.decode(path, track, stereo=True) if channels[track] == 2 else None
            if pair is not None and pair.shape[1] and audio.channels_apart(pair):
                for channel in (0, 1):
                    pairs[len(sources)] = pair
                    sources.append(Source(track, channel))
                    samples.append(np.ascontiguousarray(pair[channel]))
            else:
                sources.append(Source(track))
                samples.append(pcm)
        return sources, samples, pairs
    except media.MediaNotFoundError as e:
        raise ProcessorError(e.reason, transient=True) from None
    except media.MediaError as e:
        raise PermanentError(e.reason) from None


def _speaking_tracks(heard: dict[int, list[tuple[int, int]]]) -> list[int]:
    """The sources to transcribe: the one there is, or every source where the VAD hears
    speech (a camera's silent or noise-only track is left out); the first when it hears
    none, as on a file with one track."""
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


def _resume(
    checkpoint: dict[str, Any] | None,
    key: dict[str, Any],
    units: list[Chunk],
    sources: list[Source],
) -> _State:
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
    index = {tuple(s.describe().items()): i for i, s in enumerate(sources)}
    languages: dict[int, tuple[str, float | None]] = {}
    for found in partial.get("languages") or []:
        where = tuple((k, found.get(k)) for k in ("track", "channel") if k in found)
        if where in index and isinstance(found.get("language"), str):
            languages[index[where]] = (found["language"], found.get("language_probability"))
    return _State(
        unit=unit,
        at=float(at),
        last_speech=float(last_speech),
        prompt=prompt,
        saved=saved,
        segments=list(partial.get("segments", [])),
        languages=languages,
    )


def _segment(
    piece: Piece,
    chunk: Chunk,
    source: Source | None = None,
    heard: dict[int, list[tuple[int, int]]] | None = None,
) -> dict[str, Any] | None:
    """A piece as a segment of the result; without word timings, its span narrowed to
    the speech heard within it."""
    text = piece.text.strip()
    if not text:
        return None
    start, end = _span(chunk, piece.start, piece.end)
    spans = (heard or {}).get(chunk.source)
    if spans and piece.words is None:
        start, end = _snap(start, end, spans)
    place = (source or Source(0)).describe()
    segment: dict[str, Any] = {"start": start, "end": end, "text": text, **place}
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
    languages: dict[Source, tuple[str, float | None]],
    duration: float,
    segments: list[dict[str, Any]],
    chosen: list[Source],
    name: str,
) -> dict[str, Any]:
    """The API.md ``asr``/``asrx`` result of processor ``name``; with several sources,
    their segments in time order (each says its track, and channel). ``language``: the
    first source's; ``subtitles``: the files each source's cues are in."""
    if len(chosen) > 1:
        segments = sorted(
            segments, key=lambda s: (s["start"], s.get("track", 0), s.get("channel", ""))
        )
    each = [
        {
            **source.describe(),
            "language": languages[source][0],
            "language_probability": _rounded(languages[source][1]),
        }
        for source in chosen
        if source in languages
    ]
    first = each[0] if each else {"language": None, "language_probability": None}
    return {
        "language": first["language"],
        "language_probability": first["language_probability"],
        "languages": each,
        "duration": round(duration, 3),
        "tracks": sorted({source.track for source in chosen}),
        "text": " ".join(s["text"] for s in segments),
        "segments": segments,
        "subtitles": [{**s.describe(), **_subtitle_files(name, s, chosen)} for s in chosen],
    }


def _subtitle_files(name: str, source: Source, chosen: list[Source]) -> dict[str, str]:
    """Where ``source``'s cues are: ``<name>.srt`` (and .vtt) when it is the only source,
    else a pair of its own, ``<name>.track<N>[.left|.right].srt``."""
    stem = name
    if len(chosen) > 1:
        stem += "".join(
            f".{k}{v}" if k == "track" else f".{v}" for k, v in source.describe().items()
        )
    return {"srt": f"{stem}.srt", "vtt": f"{stem}.vtt"}


def _rounded(probability: float | None) -> float | None:
    return None if probability is None else round(float(probability), 4)


def _where(source: Source) -> tuple[int, str | None]:
    return source.track, None if source.channel is None else CHANNELS[source.channel]
