"""Looking at a frame a piece at a time: overlapping tiles, and the boxes found in them
merged with those found in the whole frame (one box a thing, however many pieces saw it).

A detector that scales its input down to a fixed size (MediaPipe's face models: 192 px)
misses what is small in a large frame; in a tile the same thing is several times larger.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Box = Sequence[float]  # x1, y1, x2, y2
Tile = tuple[int, int, int, int]  # x, y, width, height


def tiles(width: int, height: int, size: int, overlap: int) -> list[Tile]:
    """Tiles of at most ``size`` px covering a ``width`` x ``height`` frame, neighbours
    sharing at least ``overlap`` px: anything up to ``overlap`` px across lies whole in one
    of them. [] when one tile would be the whole frame."""
    if width <= size and height <= size:
        return []

    def starts(length: int) -> list[int]:
        if length <= size:
            return [0]
        count = -(-(length - overlap) // (size - overlap))  # ceil
        step = (length - size) / (count - 1)
        return [round(i * step) for i in range(count)]

    return [
        (x, y, min(size, width), min(size, height)) for y in starts(height) for x in starts(width)
    ]


def cut_by_tile(box: Box, tile: Tile, width: int, height: int, margin: float = 4.0) -> bool:
    """Whether ``box`` (frame pixels) touches an edge of ``tile`` that is inside the frame:
    what it covers may go on beyond the tile, seen whole by another tile or the whole frame."""
    x, y, w, h = tile
    x1, y1, x2, y2 = box
    return (
        (x > 0 and x1 <= x + margin)
        or (y > 0 and y1 <= y + margin)
        or (x + w < width and x2 >= x + w - margin)
        or (y + h < height and y2 >= y + h - margin)
    )


def merge(
    whole: Sequence[tuple[Box, float]],
    pieces: Sequence[tuple[Box, float]],
    iou: float = 0.3,
    inside: float = 0.5,
) -> list[tuple[Box, float]]:
    """(box, score) found in the whole frame, then those found in tiles that no box kept
    before covers (IoU above ``iou``, or ``inside`` of the smaller one within the other);
    each list best first. The whole frame's come first: a tile may see part of a large
    face as a face of its own."""
    kept: list[tuple[Box, float]] = []
    for found, is_piece in ((whole, False), (pieces, True)):
        for box, score in sorted(found, key=lambda item: -item[1]):
            if all(_apart(box, other, iou, inside if is_piece else math.inf) for other, _ in kept):
                kept.append((box, score))
    return kept


def _apart(a: Box, b: Box, iou: float, inside: float) -> bool:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return True
    common = width * height
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    if common / (area_a + area_b - common) > iou:
        return False
    return common / max(min(area_a, area_b), 1e-9) < inside
