"""Media probing and frame decoding with PyAV (no ffmpeg binary)."""

# ``probe`` tells whether a file is usable and what it is; every failure becomes a
# ``MediaError`` whose ``reason`` can be shown to a user as is. ``iter_frames``
# yields decoded frames with exact frame indices, starting anywhere, so a resumed
# run sees the same frames (indices and pixels) as an uninterrupted one.
#
# Frame indices are computed from each frame's presentation timestamp and the
# stream's frame rate, not by counting, so they do not depend on where decoding
# started. For variable-frame-rate files the rate is the stream's base rate (the
# one every timestamp fits), so each frame keeps an index of its own; each frame's
# time is its own timestamp.

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

# PyAV and numpy load on first use, not with this module: the service imports it at start
# (ingest probes uploads) and serves a long time before the first upload arrives.
if TYPE_CHECKING:
    import numpy as np
    from av.container import InputContainer
    from av.video.frame import VideoFrame
    from av.video.stream import VideoStream

# FFmpeg's AV_TIME_BASE: a container's start_time and duration are in its units.
_AV_TIME_BASE = 1_000_000

EMPTY = "file is empty (0 bytes)"

# Packets to try before concluding that no frame decodes (keeps probe cheap on garbage).
_PROBE_PACKETS = 300
# Damaged packets in a row that iter_frames skips before it gives up on the file.
_MAX_BAD_PACKETS = 100

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MediaInfo:
    duration: float  # seconds
    # width, height, fps and video_codec are None for a file without a video track
    # (an audio file); its frame_count is 0.
    width: int | None
    height: int | None
    fps: float | None
    frame_count: int  # from the container's frame count, else duration * fps
    video_codec: str | None
    audio_codec: str | None  # the first audio track's
    has_audio: bool
    size: int  # bytes
    container: str  # demuxer name, e.g. "mov,mp4,m4a,3gp,3g2,mj2"
    audio_tracks: int = 0
    # Degrees counterclockwise a player turns the stored picture (a phone's display
    # matrix); width and height are those of the picture shown, upright.
    rotation: int = 0
    # Whether a player then flips it left to right (a front camera's or an editor's flip).
    mirrored: bool = False
    # The stored pixels' width / height ("num:den"); width and height are in square
    # pixels, as a player shows the picture (a 720x576 16:9 PAL frame, 64:45, is 1024x576).
    sample_aspect_ratio: str = "1:1"
    # "pq" or "hlg" for HDR video (as phones record): the processors see it tone mapped
    # to SDR; None for SDR video and audio files.
    hdr: str | None = None

    @property
    def has_video(self) -> bool:
        return self.video_codec is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Errors reading a file that can pass without the file changing: permissions put right,
# a volume (re)mounted, network storage back. A file rejected for one is looked at again.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.ENOENT,
        errno.EIO,
        errno.ENXIO,
        errno.ENODEV,
        errno.ESTALE,
        errno.EAGAIN,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.ENOTCONN,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENOLCK,
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether an OS error reading a file may go away by itself (see TRANSIENT_ERRNOS)."""
    return getattr(exc, "errno", None) in TRANSIENT_ERRNOS


class MediaError(Exception):
    """The file cannot be used; ``reason`` says why in words a user understands.

    ``transient``: the cause may pass without the file changing (permissions, storage).
    """

    def __init__(self, reason: str, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


class MediaNotFoundError(MediaError):
    """The file is not there. Often transient: uploads on network storage briefly vanish."""


def av_errors() -> tuple[type[BaseException], ...]:
    """What PyAV raises for unreadable, odd or vanished input."""
    import av

    return (av.FFmpegError, OSError, ValueError, EOFError)


def probe(path: Path | str) -> MediaInfo:
    """Read the container and decode the first (and a late) video frame; a file with
    audio but no video track (an audio file) has its first audio frame decoded instead.

    Raises ``MediaError`` (``MediaNotFoundError`` for a missing file); never a PyAV error.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise MediaNotFoundError(f"file not found: {path}") from None
    except OSError as e:
        raise MediaError(f"cannot read file: {e.strerror or e}", is_transient(e)) from None
    if not path.is_file():
        raise MediaError(f"not a regular file: {path}")
    if size == 0:
        raise MediaError(EMPTY)
    try:
        with _open(path) as container:
            return _probe_open(container, size)
    except MediaError:
        raise
    except FileNotFoundError:
        raise MediaNotFoundError(f"file not found: {path}") from None
    except av_errors() as e:
        if is_transient(e):
            raise MediaError(f"cannot read file: {_message(e)}", transient=True) from None
        raise MediaError(f"truncated or corrupt: {_message(e)}") from None


def iter_frames(
    path: Path | str,
    *,
    start_frame: int = 0,
    step: int = 1,
    size: tuple[int, int] | None = None,
    fmt: str = "bgr24",
) -> Iterator[tuple[int, float, np.ndarray]]:
    """Yield ``(frame_index, seconds, image)`` for every frame from ``start_frame`` on
    whose index is a multiple of ``step`` (so a resumed run samples the same frames).

    ``image`` is HxWx3 in ``fmt``, upright, resized to ``size=(width, height)`` when given.
    Starting later seeks to the keyframe before ``start_frame`` and decodes forward.
    Raises ``MediaError`` for unreadable input.
    """
    from momentry_edge.pictures import Converter

    if start_frame < 0 or step < 1:
        raise ValueError("start_frame must be >= 0 and step >= 1")
    with _open(path) as container:
        stream = _decoded_stream(container, threaded=True)
        convert = Converter(size, fmt, sample_aspect_ratio(stream))  # as a player shows it
        for index, seconds, frame in _decode_indexed(container, stream, start_frame):
            if index % step == 0:
                yield index, seconds, convert(frame)


def iter_decoded(
    path: Path | str, *, start_frame: int = 0, threaded: bool = True
) -> Iterator[tuple[int, float, VideoFrame]]:
    """Yield ``(frame_index, seconds, frame)`` for every frame from ``start_frame`` on,
    still in the decoder's pixel format: for callers that convert one frame to
    several sizes (the shared decode pass). Raises ``MediaError`` for unreadable input.
    ``threaded``: the decoder may use threads of its own (a caller with a thread just
    for decoding needs none: they only add their hand-offs to the CPU it takes).
    """
    if start_frame < 0:
        raise ValueError("start_frame must be >= 0")
    with _open(path) as container:
        stream = _decoded_stream(container, threaded)
        yield from _decode_indexed(container, stream, start_frame)


def sample_aspect_ratio(stream: VideoStream) -> Fraction:
    """The width / height of the stream's stored pixels (the container's, else the
    codec's, as FFmpeg guesses it); square when unset or implausible (see usable_sar)."""
    from momentry_edge.pictures import usable_sar

    return usable_sar(stream.sample_aspect_ratio)


def _decoded_stream(container: InputContainer, threaded: bool) -> VideoStream:
    stream = video_stream(container)
    if stream is None:
        raise MediaError("no video stream")
    if threaded:
        stream.thread_type = "AUTO"
    else:
        stream.thread_count = 1
    return stream


def _decode_indexed(
    container: InputContainer, stream: VideoStream, start_frame: int
) -> Iterator[tuple[int, float, VideoFrame]]:
    clock = _Clock(stream)
    index = -1
    try:
        for frame in _decode_from(container, stream, clock, start_frame):
            # A frame without a timestamp (rare, raw streams) follows the previous one.
            index = clock.index(frame.pts) if frame.pts is not None else index + 1
            if index < start_frame:
                continue
            yield index, clock.seconds(frame.pts, index), frame
    except av_errors() as e:
        raise MediaError(
            f"truncated or corrupt: decoding failed after frame {index}: {_message(e)}"
        ) from None


class _Clock:
    """Maps a stream's timestamps to frame indices and seconds from the stream start."""

    def __init__(self, stream: VideoStream) -> None:
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        if not rate:
            raise MediaError("unsupported video: no frame rate")
        base: Any = stream.base_rate  # a Fraction, or None
        # Variable frame rate (dropped frames, a phone's): on the average rate's grid two
        # frames can round to one index. The base rate is the one FFmpeg finds every
        # timestamp fits; taken when it is plausibly that of the frames (not a time base).
        self.variable = bool(base) and rate < base <= 4 * rate
        if self.variable:
            rate = base
        self.rate = Fraction(rate)
        self.time_base = Fraction(stream.time_base or Fraction(1, 90_000))
        self.origin = stream.start_time or 0

    def index(self, pts: int) -> int:
        return round((pts - self.origin) * self.time_base * self.rate)

    def seconds(self, pts: int | None, index: int) -> float:
        if pts is None:
            return float(index / self.rate)
        return float((pts - self.origin) * self.time_base)

    def pts_at(self, seconds: Fraction) -> int:
        return self.origin + math.floor(seconds / self.time_base)


def _decode_from(
    container: InputContainer, stream: VideoStream, clock: _Clock, start_frame: int
) -> Iterator[VideoFrame]:
    """Decoded frames beginning at or before ``start_frame``, via a keyframe seek."""
    if start_frame == 0:
        yield from decode_tolerant(container, stream)
        return
    back = Fraction(0)
    while True:
        target = Fraction(start_frame) / clock.rate - back
        if target <= 0:
            container.seek(clock.origin, stream=stream, backward=True)
            yield from decode_tolerant(container, stream)
            return
        container.seek(clock.pts_at(target), stream=stream, backward=True)
        frames = decode_tolerant(container, stream)
        first = next(frames, None)
        # Some demuxers land on a keyframe after the target (e.g. an index built
        # from decode timestamps); then look one, two, four... seconds earlier.
        if first is not None and (first.pts is None or clock.index(first.pts) <= start_frame):
            yield first
            yield from frames
            return
        back = max(Fraction(1), back * 2)


def decode_tolerant(container: InputContainer, stream: Any) -> Iterator[Any]:
    """``container.decode(stream)``, but a damaged stretch mid-file is skipped, as
    players do, instead of ending the run; indices stay exact (they come from pts)."""
    import av

    bad = 0  # consecutive packets the decoder rejected
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.InvalidDataError:
            bad += 1
            if bad > _MAX_BAD_PACKETS:
                raise
            continue
        if bad:
            log.warning("%s: skipped %d damaged %s packets", container.name, bad, stream.type)
            bad = 0
        yield from frames


def _open(path: Path | str) -> InputContainer:
    import av

    try:
        return av.open(str(path), metadata_errors="replace")
    except FileNotFoundError:
        raise MediaNotFoundError(f"file not found: {path}") from None
    except PermissionError:
        raise MediaError(f"cannot read file: permission denied: {path}", transient=True) from None
    except av_errors() as e:
        if is_transient(e):
            raise MediaError(f"cannot read file: {_message(e)}", transient=True) from None
        if _looks_like_media(Path(path)):
            raise MediaError(
                f"truncated or corrupt: cannot read the container ({_message(e)})"
            ) from None
        raise MediaError(f"not a readable media file: {_message(e)}") from None


def video_stream(container: InputContainer) -> VideoStream | None:
    """The first video track that moves: cover art (an mp3's or m4a's attached picture)
    is a still image that players show beside the sound, not video."""
    import av

    for stream in container.streams.video:
        if not stream.disposition & av.stream.Disposition.attached_pic:
            return stream
    return None


def has_video(path: Path | str) -> bool | None:
    """Whether the file has a video track; None when it cannot be read."""
    try:
        with _open(path) as container:
            return video_stream(container) is not None
    except MediaError:
        return None
    except av_errors():
        return None


def _probe_open(container: InputContainer, size: int) -> MediaInfo:
    from momentry_edge import hdr
    from momentry_edge.pictures import display_size, orientation, upright_size

    video = video_stream(container)
    audio = container.streams.audio[0] if container.streams.audio else None
    if video is None:
        if audio is None:
            raise MediaError("no video or audio stream")
        return _probe_audio(container, audio, size)
    clock = _Clock(video)
    fps = float(clock.rate)

    if container.duration:
        duration = container.duration / _AV_TIME_BASE
    elif video.duration:
        duration = float(video.duration * clock.time_base)
    else:
        duration = (video.frames or 0) / fps
    frame_count = round(duration * fps) if clock.variable else video.frames or round(duration * fps)

    first = _first_frame(container, video)
    if first is None:
        raise MediaError("truncated or corrupt: could not decode any video frame")
    if duration > 2.0 and _ends_early(container, video, clock, duration):
        raise MediaError(f"truncated or corrupt: the data ends before the stated {duration:.1f} s")

    ctx = video.codec_context
    shown = orientation(first)
    sar = sample_aspect_ratio(video)
    width, height = upright_size(*display_size(ctx.width, ctx.height, sar), shown.rotation)
    return MediaInfo(
        duration=round(duration, 3),
        width=width,
        height=height,
        fps=fps,
        frame_count=int(frame_count),
        video_codec=codec_name(ctx),
        audio_codec=codec_name(audio.codec_context) if audio is not None else None,
        has_audio=audio is not None,
        size=size,
        container=container.format.name,
        audio_tracks=len(container.streams.audio),
        rotation=shown.rotation,
        mirrored=shown.mirrored,
        sample_aspect_ratio=f"{sar.numerator}:{sar.denominator}",
        hdr=hdr.transfer(first) or hdr.transfer(ctx),
    )


def codec_name(ctx: Any) -> str:
    """The codec, as ffprobe names it (``av1``, ``mp3``): not the decoder FFmpeg picked for
    it (``libdav1d``, ``mp3float``)."""
    return str(ctx.codec.canonical_name)


def _probe_audio(container: InputContainer, audio: Any, size: int) -> MediaInfo:
    """An audio file: its length and codec, once a frame of it decodes."""
    if container.duration:
        duration = container.duration / _AV_TIME_BASE
    elif audio.duration and audio.time_base:
        duration = float(audio.duration * audio.time_base)
    else:
        duration = 0.0
    if _first_frame(container, audio) is None:
        raise MediaError("truncated or corrupt: could not decode any audio")
    return MediaInfo(
        duration=round(duration, 3),
        width=None,
        height=None,
        fps=None,
        frame_count=0,
        video_codec=None,
        audio_codec=codec_name(audio.codec_context),
        has_audio=True,
        size=size,
        container=container.format.name,
        audio_tracks=len(container.streams.audio),
    )


def _first_frame(container: InputContainer, stream: Any) -> Any:
    """The first frame that decodes (within _PROBE_PACKETS), or None."""
    import av

    try:
        for n, packet in enumerate(container.demux(stream)):
            if n >= _PROBE_PACKETS:
                break
            try:
                if frames := packet.decode():
                    return frames[0]
            except av.InvalidDataError:
                continue  # a damaged packet; a later keyframe may still decode
    except av_errors():
        pass  # demuxing failed: judged as undecodable
    return None


def _ends_early(
    container: InputContainer, video: VideoStream, clock: _Clock, duration: float
) -> bool:
    """True when a file cut short still opens (index up front: mp4 "faststart", mkv).

    Seeks to a keyframe about a second before the stated end and demuxes to the
    real end (no decoding beyond one frame), so it costs one GOP of reading.
    """
    try:
        container.seek(clock.pts_at(Fraction(duration) - 1), stream=video, backward=True)
    except av_errors():
        return False  # not seekable: cannot tell cheaply, so accept
    start = (container.start_time or 0) / _AV_TIME_BASE
    end = 0.0
    decoded = keyed = False
    try:
        for packet in container.demux():
            if not decoded and packet.stream is video:
                keyed = keyed or packet.is_keyframe
                decoded = bool(packet.decode())  # the final empty packet flushes the decoder
            if packet.pts is not None and packet.time_base is not None:
                stop = float((packet.pts + (packet.duration or 0)) * packet.time_base) - start
                end = max(end, stop)
    except av_errors():
        pass  # reading failed part way: judge by what was read
    # A seek that lands between keyframes (MPEG-TS is sought by bytes) reads no keyframe
    # before the end: nothing can decode from there, which says nothing of the file.
    undecodable = keyed and not decoded
    # Some slack: headers may state a little more than the streams hold.
    return undecodable or end < duration - max(1.0, 0.02 * duration)


def _looks_like_media(path: Path) -> bool:
    """True when the first bytes are a known container signature (then it is damaged
    media, not a text file or other document with a video extension)."""
    try:
        with path.open("rb") as f:
            head = f.read(400)
    except OSError:
        return False
    return (
        head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip")  # mp4/mov
        or head.startswith(b"\x1a\x45\xdf\xa3")  # matroska/webm
        or (head.startswith(b"RIFF") and head[8:12] == b"AVI ")
        or head.startswith(b"\x00\x00\x01\xba")  # mpeg program stream
        or head[0:1] == head[188:189] == b"\x47"  # mpeg transport stream
        or head[4:5] == head[196:197] == b"\x47"  # m2ts (AVCHD .mts)
        or head.startswith((b"ID3", b"fLaC", b"OggS"))  # mp3 with tags, flac, ogg/opus
        or (head.startswith(b"RIFF") and head[8:12] == b"WAVE")
    )


def _message(e: BaseException) -> str:
    """FFmpeg's message without errno and path noise."""
    return getattr(e, "strerror", None) or str(e) or type(e).__name__
