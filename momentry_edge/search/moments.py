"""The moments of a result document a search can find, each (start, end, text): a
transcript's segments; what a frame processor saw in consecutive samples, as one span."""

# "person" in 3,000 frames in a row is one moment from its first to its last time, an
# on-screen line shown for 8 s is one: a search finds each once.

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..words import fold

Moment = tuple[float | None, float | None, str]

# Processors whose results hold words, and where.
TRANSCRIPTS = ("asr", "asrx")
FRAME_ITEMS = {"ocr": ("lines", "text"), "yolo": ("detections", "label")}
SEARCHED = (*TRANSCRIPTS, *FRAME_ITEMS)


def moments(processor: str, result: Any) -> list[Moment]:
    """The moments of ``processor``'s ``result`` (a completed document's); [] for a
    processor that holds no words."""
    if not isinstance(result, dict):
        return []
    if processor in TRANSCRIPTS:
        return list(_segments(result))
    if processor in FRAME_ITEMS:
        key, field = FRAME_ITEMS[processor]
        return _spans(result, key, field)
    return []


def _segments(result: dict[str, Any]) -> Iterator[Moment]:
    for segment in result.get("segments") or []:
        if not isinstance(segment, dict):
            continue
        text = segment.get("text")
        if isinstance(text, str) and text.strip():
            yield _time(segment.get("start")), _time(segment.get("end")), text.strip()


def _spans(result: dict[str, Any], key: str, field: str) -> list[Moment]:
    """Each item (a text line, a label) over the runs of samples it was seen in: a run
    ends where a sample went by without it."""
    rate = _time(result.get("sample_fps"))
    gap = 1.5 / rate if rate else None  # more than one sample apart: not seen between
    open_spans: dict[str, list[Any]] = {}  # folded item -> [start, last seen, text]
    done: list[Moment] = []
    for frame in result.get("frames") or []:
        if not isinstance(frame, dict) or (at := _time(frame.get("timestamp"))) is None:
            continue
        for item in frame.get(key) or []:
            text = item.get(field) if isinstance(item, dict) else None
            if not isinstance(text, str) or not text.strip():
                continue
            same = fold(" ".join(text.split()))
            span = open_spans.get(same)
            if span is not None and (gap is None or at - span[1] <= gap):
                span[1] = at
                continue
            if span is not None:
                done.append((span[0], span[1], span[2]))
            open_spans[same] = [at, at, text.strip()]
    done += [(start, end, text) for start, end, text in open_spans.values()]
    return sorted(done, key=lambda m: (m[0] or 0.0, m[2]))


def _time(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value else None
