"""Decoded frames to the upright, contiguous arrays the processors are fed.

A resize is done in the decoder's own pixel format and only then converted to
RGB/BGR: swscale's one-step scale-and-convert turns near-black pixels into fully
saturated ones (false scene cuts at fades), the two steps do not and cost less.
A display matrix (phone video: a rotation; a front camera or an editor: a flip) is
applied, and pixels that are not square (anamorphic DV, DVD, broadcast) are scaled to
square ones, so every processor sees the picture a player shows. HDR (PQ, HLG) is
tone mapped to SDR after the resize, where it is cheap (see hdr). Arrays are
C-contiguous: PyAV pads rows to a multiple of 16 bytes and some models (MediaPipe)
refuse a strided view.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    from av.video.frame import VideoFrame

from momentry_edge import hdr

SQUARE = Fraction(1)
_HDR_FORMATS = ("rgb24", "bgr24")  # the formats the processors take
# A sample aspect ratio further from square than this is damaged metadata, not a picture
# (real ones are within about 2:1): the pixels are taken as square.
_MAX_SAR = 10


def quarter_turns(rotation: float) -> int:
    """A display rotation (degrees counterclockwise, as PyAV gives it) in quarter turns
    counterclockwise, 0-3; rotations between quarter turns are rounded to the nearest."""
    return round(rotation / 90) % 4


def upright_size(width: int, height: int, rotation: float) -> tuple[int, int]:
    """The size a player shows a ``width`` x ``height`` picture with ``rotation``."""
    return (height, width) if quarter_turns(rotation) % 2 else (width, height)


class Orientation(NamedTuple):
    """How a player shows the stored picture: ``turns`` quarter turns counterclockwise,
    then, when ``mirrored``, flipped left to right."""

    turns: int = 0
    mirrored: bool = False

    @property
    def rotation(self) -> int:
        """The turn in degrees counterclockwise, -90 to 180."""
        return (90, 180, -90, 0)[self.turns - 1]


UPRIGHT = Orientation()


def orientation(frame: VideoFrame) -> Orientation:
    """The frame's display matrix as quarter turns and a flip (UPRIGHT without one).
    PyAV's ``rotation`` alone reads a flipped matrix as a half turn or as none."""
    from av.sidedata.sidedata import Type

    side_data: Any = frame.side_data  # PyAV's stubs know only its motion vectors
    if not side_data:  # most video: none at all, and this is the cheap test
        return UPRIGHT
    try:
        data = bytes(side_data[Type.DISPLAYMATRIX])
    except KeyError:
        return UPRIGHT
    if len(data) < 36:
        return UPRIGHT
    return matrix_orientation(struct.unpack("=9i", data[:36]))


def matrix_orientation(matrix: Sequence[int]) -> Orientation:
    """A display matrix (FFmpeg's nine numbers, rows (a b u) (c d v) (x y w); a shown
    point is x' = a*x + c*y, y' = b*x + d*y) as quarter turns and a flip."""
    a, b, c, d = matrix[0], matrix[1], matrix[3], matrix[4]
    mirrored = a * d - b * c < 0  # a flip reverses the orientation of the plane
    if mirrored:
        a, c = -a, -c  # FFmpeg flips a matrix after its turn (av_display_matrix_flip)
    if a == b == 0:
        return Orientation(0, mirrored)  # degenerate: no turn to read
    # As av_display_rotation_get: counterclockwise, in a picture's downward y.
    return Orientation(quarter_turns(-math.degrees(math.atan2(b, a))), mirrored)


def usable_sar(sar: Fraction | None) -> Fraction:
    """A stream's sample aspect ratio (pixel width / height), square when there is none
    or when it is beyond 1:10 or 10:1 (damaged metadata)."""
    if not sar or sar <= 0 or not 1 / _MAX_SAR <= sar <= _MAX_SAR:
        return SQUARE
    return Fraction(sar)


def display_size(width: int, height: int, sar: Fraction) -> tuple[int, int]:
    """The size in square pixels of a stored ``width`` x ``height`` picture whose pixels
    are ``sar`` wide: the width is scaled and the height kept, as players do."""
    sar = usable_sar(sar)
    if sar == SQUARE:
        return width, height
    return max(1, math.floor(width * sar + Fraction(1, 2))), height


class Converter:
    """Converts frames to one (size, pixel format): upright, unflipped, square pixels,
    C-contiguous, read-only.

    ``size`` is (width, height) of the upright picture, None for the size a player shows
    (the stored one with its pixels, ``sar`` wide, made square). One converter per output
    keeps each swscale context cached between frames.
    """

    def __init__(self, size: tuple[int, int] | None, fmt: str, sar: Fraction = SQUARE) -> None:
        from av.video.reformatter import VideoReformatter

        self.size, self.fmt, self.sar = size, fmt, sar
        self._scale = VideoReformatter()
        self._convert = VideoReformatter()

    def __call__(self, frame: VideoFrame) -> np.ndarray:
        import numpy as np

        turns, mirrored = orientation(frame)
        if self.size is None:
            width, height = display_size(frame.width, frame.height, self.sar)
        else:
            width, height = self.size
            if turns % 2:  # the stored picture is sideways: scale it to the transposed size
                width, height = height, width
        scaled = frame
        if (width, height) != (frame.width, frame.height):
            scaled = self._scale.reformat(frame, width, height, threads=1)
        image: np.ndarray
        kind = hdr.transfer(frame)
        if kind is not None and self.fmt in _HDR_FORMATS:
            # Converted as SDR, an HDR picture comes out dim and grey: kept at 16 bits
            # for its transfer to be undone, then tone mapped.
            wide = self._convert.reformat(scaled, format="rgb48le", threads=1)
            image = hdr.to_sdr(wide.to_ndarray(), kind)
            if self.fmt == "bgr24":
                image = image[..., ::-1]
        else:
            image = self._convert.reformat(scaled, format=self.fmt, threads=1).to_ndarray()
        if turns:
            image = np.rot90(image, turns)
        if mirrored:
            image = image[:, ::-1]
        image = np.ascontiguousarray(image)
        image.flags.writeable = False  # shared by members, maybe on other threads
        return image
