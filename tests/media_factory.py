"""Real media files for tests, encoded in-process with PyAV (no ffmpeg binary).

``make_video`` draws ``segments`` flat colours, each with a slowly moving bar
so there is motion inside a segment, and hard cuts exactly at
``k * segment_seconds``. Colours differ in hue and brightness so PySceneDetect's
ContentDetector sees each boundary clearly and never the bar. A caller can draw
the pictures itself instead (``picture``) and keep the audio and muxing.
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

AUDIO_RATE = 48_000


def segment_colour(k: int) -> tuple[int, int, int]:
    """RGB of segment ``k``: hues a golden-ratio step apart, bright and dark in turn."""
    hue = (k * 0.381966) % 1.0
    value = 0.9 if k % 2 == 0 else 0.45
    r, g, b = colorsys.hsv_to_rgb(hue, 0.85, value)
    return round(r * 255), round(g * 255), round(b * 255)


def make_video(
    path: Path | str,
    *,
    segments: int = 4,
    segment_seconds: float = 5.0,
    fps: int = 25,
    size: tuple[int, int] = (320, 240),
    codec: str = "libx264",
    audio: bool = True,
    audio_codec: str | None = None,
    speech_wav: Path | str | None = None,
    speech_start: float = 0.0,
    faststart: bool = False,
    picture: Callable[[int], np.ndarray] | None = None,
    keyframe_every: int | None = None,
) -> Path:
    """Write a clip of ``segments * segment_seconds`` seconds and return its path.

    Audio is a quiet 440 Hz tone, or ``speech_wav`` placed at ``speech_start``
    seconds over silence (``audio_codec``: AAC, or Opus for ``.webm``). ``faststart`` puts the mp4
    index first, as web-optimised files have it. ``picture(i)``, if given, is frame
    ``i`` (HxWx3 RGB of ``size``) in place of the colours and bar. ``keyframe_every``
    frames at most (the encoder's default: 250 for libx264).
    """
    path = Path(path)
    width, height = size
    per_segment = round(segment_seconds * fps)
    total_frames = segments * per_segment
    total_samples = round(total_frames / fps * AUDIO_RATE)
    if speech_wav is None:
        pcm = _tone(total_samples)
    else:
        pcm = np.zeros(total_samples, np.float32)
        speech = _decode_mono(Path(speech_wav))
        at = round(speech_start * AUDIO_RATE)
        speech = speech[: max(0, total_samples - at)]
        pcm[at : at + len(speech)] = speech

    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as out:
        video = out.add_stream(codec, rate=fps)
        video.width, video.height = width, height
        video.pix_fmt = "yuv420p"
        if codec == "libx264":
            video.options = {"preset": "superfast"}  # keeps B-frames, like real files
        if keyframe_every is not None:
            video.gop_size = keyframe_every
        sound = None
        if audio:
            default = "libopus" if path.suffix == ".webm" else "aac"
            sound = out.add_stream(audio_codec or default, rate=AUDIO_RATE, layout="mono")
        audio_frames = _audio_frames(pcm, sound)

        bar = max(4, width // 16)
        colours = range(segments) if picture is None else ()
        bases = [np.full((height, width, 3), segment_colour(k), np.uint8) for k in colours]
        for i in range(total_frames):
            if picture is not None:
                image = picture(i)
            else:
                k = i // per_segment
                image = bases[k].copy()
                x = (i * 2) % (width - bar)  # 2 px per frame: motion, far below a cut
                image[:, x : x + bar] = (255, 255, 255) if k % 2 else (20, 20, 20)
            frame = av.VideoFrame.from_ndarray(image, "rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            out.mux(video.encode(frame))
            # Interleave: audio up to the end of this video frame.
            until = round((i + 1) / fps * AUDIO_RATE)
            while sound is not None and (aframe := next(audio_frames, None)) is not None:
                out.mux(sound.encode(aframe))
                if aframe.pts + aframe.samples >= until:
                    break
        out.mux(video.encode(None))
        if sound is not None:
            out.mux(sound.encode(None))
    return path


def make_corrupt_video(path: Path | str, *, keep: float = 1 / 3, faststart: bool = False) -> Path:
    """A real mp4 cut off after ``keep`` of its bytes, like an interrupted upload.

    By default the mp4 index (written last) is lost; with ``faststart`` the index
    survives and only the media data ends early.
    """
    path = Path(path)
    make_video(path, segments=2, segment_seconds=1.5, faststart=faststart)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def make_damaged_video(path: Path | str) -> Path:
    """A real 8 s mp4 with a stretch of random bytes in the middle of its data."""
    path = Path(path)
    make_video(path, segments=2, segment_seconds=4.0, audio=False)
    data = bytearray(path.read_bytes())
    at, length = len(data) // 2, len(data) // 20
    data[at : at + length] = np.random.default_rng(7).bytes(length)
    path.write_bytes(bytes(data))
    return path


def make_audio_file(path: Path | str, *, seconds: float = 1.0) -> Path:
    """An audio-only file (a tone), e.g. an ``.m4a`` dropped into the video folder."""
    path = Path(path)
    with av.open(str(path), "w") as out:
        sound = out.add_stream("aac", rate=AUDIO_RATE, layout="mono")
        for frame in _audio_frames(_tone(round(seconds * AUDIO_RATE)), sound):
            out.mux(sound.encode(frame))
        out.mux(sound.encode(None))
    return path


def make_text_file(path: Path | str) -> Path:
    """A text file, e.g. named ``notes.mp4`` by mistake."""
    path = Path(path)
    path.write_text("This is not a video.\nJust some notes someone renamed to .mp4.\n" * 20)
    return path


def _tone(samples: int) -> np.ndarray:
    t = np.arange(samples, dtype=np.float32) / AUDIO_RATE
    return (0.05 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


def _audio_frames(pcm: np.ndarray, stream: av.AudioStream | None) -> Iterator[av.AudioFrame]:
    """Mono float frames of the encoder's frame size (last one padded with silence)."""
    if stream is None:
        return
    size = stream.codec_context.frame_size or 1024
    for at in range(0, len(pcm), size):
        block = pcm[at : at + size]
        block = np.pad(block, (0, size - len(block)))
        frame = av.AudioFrame.from_ndarray(block.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = at
        frame.time_base = Fraction(1, AUDIO_RATE)
        yield frame


def _decode_mono(path: Path) -> np.ndarray:
    """Any audio file as mono float32 at ``AUDIO_RATE``."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
    chunks = []
    with av.open(str(path)) as src:
        for frame in src.decode(audio=0):
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
