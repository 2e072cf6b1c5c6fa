"""Decoded frames to the upright, contiguous arrays the processors are fed.

A resize is done in the decoder's own pixel format and only then converted to
RGB/BGR: swscale's one-step scale-and-convert turns near-black pixels into fully
saturated ones (false scene cuts at fades), the two steps do not and cost less.
A display matrix (phone video) is applied, so every processor sees the picture a
player shows. Arrays are C-contiguous: PyAV pads rows to a multiple of 16 bytes
and some models (MediaPipe) refuse a strided view.
"""

from __future__ import annotations

import numpy as np
from av.video.frame import VideoFrame
from av.video.reformatter import VideoReformatter


def quarter_turns(rotation: float) -> int:
    """A display rotation (degrees counterclockwise, as PyAV gives it) in quarter turns
    counterclockwise, 0-3; rotations between quarter turns are rounded to the nearest."""
    return round(rotation / 90) % 4


def upright_size(width: int, height: int, rotation: float) -> tuple[int, int]:
    """The size a player shows a ``width`` x ``height`` picture with ``rotation``."""
    return (height, width) if quarter_turns(rotation) % 2 else (width, height)


class Converter:
    """Converts frames to one (size, pixel format): upright, C-contiguous, read-only.

    ``size`` is (width, height) of the upright picture, None for the source size.
    One converter per output keeps each swscale context cached between frames.
    """

    def __init__(self, size: tuple[int, int] | None, fmt: str) -> None:
        self.size, self.fmt = size, fmt
        self._scale = VideoReformatter()
        self._convert = VideoReformatter()

    def __call__(self, frame: VideoFrame) -> np.ndarray:
        turns = quarter_turns(frame.rotation)
        if self.size is None:
            converted = self._convert.reformat(frame, format=self.fmt, threads=1)
        else:
            width, height = self.size
            if turns % 2:  # the stored picture is sideways: scale it to the transposed size
                width, height = height, width
            scaled = frame
            if (width, height) != (frame.width, frame.height):
                scaled = self._scale.reformat(frame, width, height, threads=1)
            converted = self._convert.reformat(scaled, format=self.fmt, threads=1)
        image: np.ndarray = converted.to_ndarray()
        if turns:
            image = np.rot90(image, turns)
        image = np.ascontiguousarray(image)
        image.flags.writeable = False  # shared by members, maybe on other threads
        return image
