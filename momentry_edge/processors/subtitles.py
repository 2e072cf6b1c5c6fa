"""Subtitles from asr's and asrx's segments: cues cut at word boundaries to broadcast norms
(at most 2 lines of 42 characters, 16 for Chinese, Japanese and Korean; 1 to 7 s; about
20 characters a second), written as SRT and WebVTT."""

# A cue is made of timed words: asrx's own word timings, or for asr (which has none)
# the segment's words laid over the segment's span in proportion to their length (the
# span is narrowed to the speech the VAD heard, so it starts when the speech starts).
# Words are taken in order into a cue until the next would not fit its lines, would
# make it longer than the longest cue, follows a pause, or a sentence has ended and
# the cue is long enough to read. A cue starts with its first word; it ends with its
# last, or later, as long as reading it takes (the shortest cue, the reading speed),
# but never into the next cue.

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CJK = frozenset({"zh", "ja", "ko", "yue"})  # written without spaces between words
PAUSE = 1.5  # seconds of silence between two words that ends a cue
GAP = 0.08  # at least this between a cue's end and the next one's start (2 frames)
_SENTENCE_END = re.compile(r"[.!?。！？…]['\"”’)]*$")


@dataclass(frozen=True)
class Norms:
    """What a cue may hold: ``lines`` lines of ``line_chars`` characters (``cjk_line_chars``
    in Chinese, Japanese and Korean), ``min_seconds`` to ``max_seconds`` on screen, read at
    ``chars_per_second`` at most (a cue stays up that long if the next allows)."""

    line_chars: int = 42
    cjk_line_chars: int = 16
    lines: int = 2
    min_seconds: float = 1.0
    max_seconds: float = 7.0
    chars_per_second: float = 20.0


@dataclass
class Cue:
    start: float
    end: float
    lines: list[str]
    spoken: tuple[float, float]  # where its first word starts and its last ends


@dataclass(frozen=True)
class _Word:
    start: float
    end: float
    text: str
    last_of_segment: bool = False


Spans = Sequence[tuple[float, float]]


def cues(
    segments: Sequence[dict[str, Any]],
    language: str | None,
    norms: Norms,
    speech: Spans = (),
) -> list[Cue]:
    """The cues of ``segments`` (of one source, in time order); ``speech``: where the
    VAD heard it (seconds), over which words without timings are laid."""
    cjk = (language or "") in CJK
    limit = norms.cjk_line_chars if cjk else norms.line_chars
    joiner = "" if cjk else " "
    made: list[Cue] = []
    current: list[_Word] = []
    for word in _words(segments, cjk, speech):
        if current and _ends_before(current, word, limit, joiner, norms):
            made.append(_cue(current, limit, joiner, norms))
            current = []
        current.append(word)
    if current:
        made.append(_cue(current, limit, joiner, norms))
    _time(made, norms)
    return made


def _words(segments: Sequence[dict[str, Any]], cjk: bool, speech: Spans) -> list[_Word]:
    """Every word of the segments with its time: its own, or its share of the speech
    heard within the segment (of the whole segment when none is)."""
    found: list[_Word] = []
    for segment in segments:
        start, end = float(segment["start"]), float(segment["end"])
        timed = [w for w in segment.get("words") or () if str(w["word"]).strip()]
        if timed:
            words = [
                (*_into_speech(float(w["start"]), float(w["end"]), speech), str(w["word"]).strip())
                for w in timed
            ]
        else:
            words = _laid_over(_split(str(segment["text"]), cjk), start, end, speech)
        for i, (a, b, text) in enumerate(words):
            found.append(_Word(a, max(a, b), text, i == len(words) - 1))
    return found


def _into_speech(start: float, end: float, speech: Spans) -> tuple[float, float]:
    """A word's span, its start moved to where speech starts if it starts in silence
    (Whisper's alignment can put a window's first word seconds early)."""
    if any(a <= start < b for a, b in speech):
        return start, end
    later = [a for a, _ in speech if start < a < end]
    return (later[0], end) if later else (start, end)


def _laid_over(
    texts: list[str], start: float, end: float, speech: Spans
) -> list[tuple[float, float, str]]:
    """``texts`` spread over the speech between ``start`` and ``end``, each taking time
    in proportion to its length (a pause within the segment gets none)."""
    parts = [(max(a, start), min(b, end)) for a, b in speech if a < end and b > start]
    parts = [(a, b) for a, b in parts if b > a] or [(start, end)]
    heard = sum(b - a for a, b in parts)
    total = sum(len(t) for t in texts) or 1

    def at(share: float) -> float:  # the time ``share`` (0-1) into the speech heard
        left = share * heard
        for a, b in parts:
            if left <= b - a:
                return a + left
            left -= b - a
        return parts[-1][1]

    laid, done = [], 0
    for text in texts:
        # A word's start is just after a pause, not at the end of the speech before it.
        first = at(done / total + 1e-9)
        done += len(text)
        laid.append((first, at(done / total), text))
    return laid


def _split(text: str, cjk: bool) -> list[str]:
    """A text's words; in Chinese, Japanese and Korean (no spaces) each character but
    runs of Latin letters and digits, which stay whole."""
    if not cjk:
        return text.split()
    return re.findall(r"[A-Za-z0-9'’.,!?-]+|\S", text)


def _ends_before(current: list[_Word], word: _Word, limit: int, joiner: str, norms: Norms) -> bool:
    """Whether the cue of ``current`` ends before ``word``."""
    if word.end - current[0].start > norms.max_seconds:
        return True
    if word.start - current[-1].end > PAUSE:
        return True
    if _wrap([*(w.text for w in current), word.text], limit, norms.lines, joiner) is None:
        return True
    # A sentence that has ended starts no new one in a cue long enough to be read.
    ended = _SENTENCE_END.search(current[-1].text) is not None
    return ended and current[-1].end - current[0].start >= norms.min_seconds


def _cue(words: list[_Word], limit: int, joiner: str, norms: Norms) -> Cue:
    texts = [w.text for w in words]
    lines = _wrap(texts, limit, norms.lines, joiner) or [joiner.join(texts)]  # one long word
    return Cue(words[0].start, words[-1].end, lines, (words[0].start, words[-1].end))


def _wrap(texts: list[str], limit: int, most: int, joiner: str) -> list[str] | None:
    """``texts`` in as few lines of at most ``limit`` characters as they fit, the lines as
    even as they can be; None when they need more than ``most`` lines."""
    best = _greedy(texts, limit, joiner)
    if len(best) > most or any(len(line) > limit for line in best):
        return None
    width = limit
    while width > 1:
        narrower = _greedy(texts, width - 1, joiner)
        if len(narrower) > len(best) or any(len(line) > width - 1 for line in narrower):
            break
        best, width = narrower, width - 1
    return best


def _greedy(texts: list[str], width: int, joiner: str) -> list[str]:
    lines: list[str] = []
    for text in texts:
        if lines and len(lines[-1]) + len(joiner) + len(text) <= width:
            lines[-1] += joiner + text
        else:
            lines.append(text)
    return lines


def _time(made: list[Cue], norms: Norms) -> None:
    """Each cue's end: kept on screen as long as reading it takes, if the next allows."""
    for i, cue in enumerate(made):
        chars = sum(len(line) for line in cue.lines)
        needed = max(norms.min_seconds, chars / norms.chars_per_second)
        latest = made[i + 1].start - GAP if i + 1 < len(made) else float("inf")
        end = max(cue.end, min(cue.start + needed, latest, cue.start + norms.max_seconds))
        cue.end = round(end, 3)
        cue.start = round(cue.start, 3)


# -- formats --------------------------------------------------------------------------------------


def to_srt(made: Sequence[Cue]) -> str:
    blocks = [
        f"{i}\n{_clock(c.start, ',')} --> {_clock(c.end, ',')}\n" + "\n".join(c.lines) + "\n"
        for i, c in enumerate(made, 1)
    ]
    return "\n".join(blocks)


def to_vtt(made: Sequence[Cue]) -> str:
    blocks = [
        f"{_clock(c.start, '.')} --> {_clock(c.end, '.')}\n" + "\n".join(c.lines) + "\n"
        for c in made
    ]
    return "\n".join(["WEBVTT\n", *blocks])


def _clock(seconds: float, decimal: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"
