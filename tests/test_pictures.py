"""Frames as the processors get them, from the sources cameras and editors write: 10-bit,
HEVC, full-range MJPEG, odd sizes, every display rotation, flipped display matrices,
pixels that are not square, HDR (PQ, HLG). Each comes out upright, unflipped, in square
pixels, in one piece of memory (MediaPipe refuses a strided view) and with the source's
colours (HDR's as the SDR picture it shows)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from frame_media import (
    anamorphic_video,
    hdr_video,
    mirrored_video,
    photo_frame,
    portrait_frame,
    set_display_rotation,
)
from PIL import Image

from momentry_edge import media
from momentry_edge.pictures import Orientation, display_size, matrix_orientation
from momentry_edge.processors.frames import fit_size


def encode(
    path: Path,
    picture: np.ndarray,
    codec: str,
    pix_fmt: str,
    sar: Fraction | None = None,
    **options: str,
) -> Path:
    height, width = picture.shape[:2]
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if sar is not None:
            stream.codec_context.sample_aspect_ratio = sar
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


@pytest.mark.parametrize("degrees", [0, 90, 180, -90])
@pytest.mark.parametrize("size", [None, (180, 320)])
def test_every_mirrored_display_matrix_gives_the_upright_unflipped_picture(tmp_path, degrees, size):
    # Stored flipped (and turned back), as a front camera or an editor's flip leaves it.
    clip = mirrored_video(tmp_path / "selfie.mp4", PICTURE, degrees, seconds=0.3)

    info = media.probe(clip)
    _, _, image = next(media.iter_frames(clip, fmt="rgb24", size=size))

    assert (info.width, info.height, info.rotation % 360) == (360, 640, degrees % 360)
    assert info.mirrored
    assert image.flags.c_contiguous
    expected = resized(PICTURE, size or (360, 640))
    assert image.shape == expected.shape
    assert np.abs(image.astype(int) - expected).mean() < 6


# As FFmpeg writes them (av_display_rotation_set, then av_display_matrix_flip): a turn
# counterclockwise, then the shown picture flipped left to right.
ONE = 1 << 16
MATRICES = [
    ((ONE, 0, 0, 0, ONE, 0), Orientation(0, False)),
    ((0, -ONE, 0, ONE, 0, 0), Orientation(1, False)),
    ((-ONE, 0, 0, 0, ONE, 0), Orientation(0, True)),  # hflip: PyAV reads a half turn
    ((ONE, 0, 0, 0, -ONE, 0), Orientation(2, True)),  # vflip: PyAV reads no turn at all
    ((0, ONE, 0, ONE, 0, 0), Orientation(3, True)),  # -90 then flipped: a transpose
    ((0, -ONE, 0, -ONE, 0, 0), Orientation(1, True)),
    ((0, 0, 0, 0, 0, 0), Orientation(0, False)),  # degenerate
]


@pytest.mark.parametrize(("matrix", "expected"), MATRICES)
def test_a_display_matrix_is_read_as_quarter_turns_and_a_flip(matrix, expected):
    assert matrix_orientation((*matrix, 0, 0, 1 << 30)) == expected


# A 16:9 picture in square pixels, stored squeezed as DV, DVD and broadcast store it.
SHOWN = resized(photo_frame(), (1024, 576))


@pytest.mark.parametrize(("sar", "stored"), [(Fraction(64, 45), 720), (Fraction(16, 15), 960)])
@pytest.mark.parametrize("side", [0, 320])
def test_pixels_that_are_not_square_are_made_square(tmp_path, sar, stored, side):
    clip = anamorphic_video(tmp_path / "pal.mp4", SHOWN, sar, seconds=0.3)
    with av.open(str(clip)) as container:
        assert container.streams.video[0].width == stored

    info = media.probe(clip)
    size = fit_size(info.width, info.height, side)
    _, _, image = next(media.iter_frames(clip, fmt="rgb24", size=size))

    assert (info.width, info.height) == (1024, 576)
    assert info.sample_aspect_ratio == f"{sar.numerator}:{sar.denominator}"
    assert image.flags.c_contiguous
    expected = resized(SHOWN, size or (1024, 576))
    assert image.shape == expected.shape
    assert np.abs(image.astype(int) - expected).mean() < 6


@pytest.mark.parametrize("sar", [Fraction(12, 1), Fraction(1, 11)])
def test_a_sample_aspect_ratio_beyond_ten_to_one_is_damaged_metadata(tmp_path, sar):
    picture = resized(photo_frame(), (320, 180))
    clip = encode(tmp_path / "damaged.mp4", picture, "libx264", "yuv420p", sar=sar)
    with av.open(str(clip)) as container:
        assert container.streams.video[0].sample_aspect_ratio == sar

    info = media.probe(clip)
    _, _, image = next(media.iter_frames(clip, fmt="rgb24"))

    assert (info.width, info.height, info.sample_aspect_ratio) == (320, 180, "1:1")
    assert image.shape == picture.shape  # the stored pixels, taken as square


@pytest.mark.parametrize(
    ("stored", "sar", "shown"),
    [
        ((720, 576), Fraction(64, 45), (1024, 576)),  # PAL 16:9
        ((720, 576), Fraction(16, 15), (768, 576)),  # PAL 4:3
        ((720, 480), Fraction(8, 9), (640, 480)),  # NTSC 4:3
        ((1440, 1080), Fraction(4, 3), (1920, 1080)),  # HDV
        ((720, 576), Fraction(0, 1), (720, 576)),  # unset
        ((720, 576), Fraction(11, 1), (720, 576)),  # damaged
    ],
)
def test_the_shown_size_scales_the_width_and_keeps_the_height(stored, sar, shown):
    assert display_size(*stored, sar) == shown


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transfer", ["pq", "hlg"])
@pytest.mark.parametrize("codec", ["libx265", "libx264"])
@pytest.mark.parametrize("side", [0, 320])
def test_hdr_comes_out_as_the_sdr_picture_it_was_made_from(tmp_path, transfer, codec, side):
    # 10-bit BT.2020 with the SDR picture's light: read as SDR it is dim and grey (PQ's
    # white near 150 of 255), which a player does not show and the models do not expect.
    clip = hdr_video(tmp_path / "hdr.mp4", PICTURE, transfer, seconds=0.3, codec=codec)
    with av.open(str(clip)) as container:
        stored = container.streams.video[0].codec_context
        assert (stored.color_trc, stored.color_primaries) == ({"pq": 16, "hlg": 18}[transfer], 9)

    info = media.probe(clip)
    size = fit_size(info.width, info.height, side)

    assert info.hdr == transfer
    for fmt in ("rgb24", "bgr24"):
        _, _, image = next(media.iter_frames(clip, fmt=fmt, size=size))
        expected = resized(PICTURE, size or (360, 640))
        if fmt == "bgr24":
            expected = expected[..., ::-1]
        assert image.flags.c_contiguous and image.shape == expected.shape
        error = np.abs(image.astype(int) - expected).mean(axis=(0, 1))
        assert error.max() < 4, error


@pytest.mark.timeout(120)
def test_an_sdr_frame_is_converted_as_before(tmp_path):
    # BT.709 10-bit video: not HDR, so not tone mapped; PyAV's own conversion, bit for bit.
    clip = encode(tmp_path / "sdr.mp4", PICTURE, "libx264", "yuv420p10le", crf="10")

    assert media.probe(clip).hdr is None
    _, _, image = next(media.iter_frames(clip, fmt="rgb24"))
    with av.open(str(clip)) as container:
        plain = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert np.array_equal(image, plain)
