"""Frames as the processors get them, from the sources cameras and editors write: 10-bit,
HEVC, full-range MJPEG, odd sizes, every display rotation. Each comes out upright, in
one piece of memory (MediaPipe refuses a strided view) and with the source's colours."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from frame_media import portrait_frame, set_display_rotation
from PIL import Image

from momentry_edge import media
from momentry_edge.processors.frames import fit_size


def encode(path: Path, picture: np.ndarray, codec: str, pix_fmt: str, **options: str) -> Path:
    height, width = picture.shape[:2]
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.options = options
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(picture, "rgb24").reformat(format=pix_fmt)
            frame.pts, frame.time_base = i, Fraction(1, 10)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def resized(picture: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return np.asarray(Image.fromarray(picture).resize(size, Image.Resampling.BILINEAR))


# A 9:16 picture: fitted into 640 px it is 180x320 here, rows PyAV pads.
PICTURE = resized(portrait_frame(), (360, 640))
SOURCES = [
    ("h264 10-bit", "mp4", "libx264", "yuv420p10le", {"crf": "10"}),
    ("hevc", "mp4", "libx265", "yuv420p", {"crf": "10", "x265-params": "log-level=error"}),
    (
        "hevc 10-bit",
        "mp4",
        "libx265",
        "yuv420p10le",
        {"crf": "10", "x265-params": "log-level=error"},
    ),
    ("mjpeg full range", "avi", "mjpeg", "yuvj420p", {"q": "2"}),
    ("h264 4:4:4", "mp4", "libx264", "yuv444p", {"crf": "10"}),
]


@pytest.mark.parametrize(("codec", "pix_fmt", "options", "suffix"), [
    pytest.param(c, p, o, s, id=name) for name, s, c, p, o in SOURCES
])  # fmt: skip
@pytest.mark.parametrize("side", [0, 320])
def test_every_source_gives_contiguous_frames_with_its_colours(
    tmp_path, codec, pix_fmt, options, suffix, side
):
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec} encoder")
    clip = encode(tmp_path / f"clip.{suffix}", PICTURE, codec, pix_fmt, **options)
    info = media.probe(clip)
    size = fit_size(info.width, info.height, side)

    for fmt in ("rgb24", "bgr24"):
        _, _, image = next(media.iter_frames(clip, fmt=fmt, size=size))

        assert image.flags.c_contiguous
        expected = resized(PICTURE, size or (360, 640))
        if fmt == "bgr24":
            expected = expected[..., ::-1]
        assert image.shape == expected.shape
        assert np.abs(image.astype(int) - expected).mean() < 6


@pytest.mark.parametrize("degrees", [90, 180, -90])
@pytest.mark.parametrize("size", [None, (180, 320)])
def test_every_display_rotation_gives_the_upright_picture(tmp_path, degrees, size):
    # Stored as turned back: the display rotation brings it upright again.
    stored = np.ascontiguousarray(np.rot90(PICTURE, -degrees // 90))
    clip = set_display_rotation(
        encode(tmp_path / "phone.mp4", stored, "libx264", "yuv420p"), degrees
    )

    info = media.probe(clip)
    _, _, image = next(media.iter_frames(clip, fmt="rgb24", size=size))

    assert (info.width, info.height, info.rotation % 360) == (360, 640, degrees % 360)
    assert image.flags.c_contiguous
    expected = resized(PICTURE, size or (360, 640))
    assert image.shape == expected.shape
    assert np.abs(image.astype(int) - expected).mean() < 6
