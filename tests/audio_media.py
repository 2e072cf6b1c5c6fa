"""Audio test media: tracks of samples written as audio files or as videos with several
audio tracks, in the common codecs, encoded in-process with PyAV (no ffmpeg binary).

``JFK`` is faster-whisper's own test recording (tests/data/README.md), with the text
its tests expect.
"""

from __future__ import annotations

import io
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

DATA = Path(__file__).parent / "data"
JFK = DATA / "jfk.flac"
JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)
SENTENCE = "Please send the quarterly report to the finance team by Friday morning"
RATE = 16_000  # of the samples handed to ``write``

# The codec for each file ending (a container holding it, by its name).
CODECS = {
    ".m4a": "aac",
    ".mp4": "aac",
    ".mov": "aac",
    ".mkv": "aac",
    ".aac": "aac",
    ".mp3": "libmp3lame",
    ".wav": "pcm_s16le",
    ".flac": "flac",
    ".ogg": "libopus",
    ".opus": "libopus",
}
OPUS_RATE = 48_000  # the only input rate libopus takes


def samples(path: Path | str, rate: int | None = RATE) -> np.ndarray:
    """A file's first audio track as mono float32 at ``rate`` (None: the file's own)."""
    chunks = []
    with av.open(str(path)) as src:
        rate = rate or src.streams.audio[0].sample_rate
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        for frame in src.decode(audio=0):
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(chunks)


def spoken(
    text: str, folder: Path, rate: int | None = RATE, voice: str | None = None
) -> np.ndarray:
    """``text`` read by espeak-ng (in ``voice``, a language, or its default English), as
    mono samples at ``rate`` (None: espeak-ng's own, 22.05 kHz)."""
    wav = folder / "spoken.wav"
    command = ["espeak-ng", *(["-v", voice] if voice else []), "-w", str(wav), text]
    subprocess.run(command, check=True, capture_output=True)
    return samples(wav, rate)


def music(seconds: float = 12.0) -> np.ndarray:
    """Plucked chords with a drum hit on every beat: music, no voice."""
    t = np.arange(round(seconds * RATE)) / RATE
    pcm = np.zeros_like(t)
    notes = [261.6, 329.6, 392.0, 523.3, 440.0, 349.2]
    beat = RATE // 2
    for k in range(len(t) // beat):
        a, b = k * beat, (k + 1) * beat
        f, env = notes[k % len(notes)], np.exp(-3 * (t[a:b] - t[a]))
        partials = ((1, 1), (1.5, 0.5), (2, 0.3))
        tone = sum(g * np.sin(2 * np.pi * f * m * t[a:b]) for m, g in partials)
        pcm[a:b] += 0.2 * env * tone
        hit = np.random.default_rng(k).standard_normal(400) * np.exp(-np.arange(400) / 80)
        pcm[a : a + 400] += 0.3 * hit
    return pcm.astype(np.float32)


def write(
    path: Path | str,
    tracks: list[np.ndarray],
    *,
    rate: int = RATE,
    layout: str = "mono",
    channel: int | None = None,
    video: bool = False,
    seconds: float | None = None,
    cover: bool = False,
    codec: str | None = None,
    source_rate: int = RATE,
) -> Path:
    """``tracks`` (mono samples at ``source_rate``) as audio tracks of ``path``, at ``rate`` in
    ``layout``: every channel the same, or the sound in ``channel`` alone (the others
    silent). ``video``: a small picture track (first) as long as the longest track or
    ``seconds``. ``cover``: cover art (a PNG), as music and podcast files carry it
    (mp3). ``codec``: by default the one for the file ending (``CODECS``)."""
    path = Path(path)
    codec = codec or CODECS[path.suffix]
    rate = OPUS_RATE if codec == "libopus" else rate
    fmt = "adts" if path.suffix == ".aac" else None
    length = seconds or max(len(pcm) for pcm in tracks) / source_rate
    with av.open(str(path), "w", format=fmt) as out:
        # Every track is added before anything is written (the muxer's header).
        picture = out.add_stream("libx264", rate=10) if video else None
        sounds = [out.add_stream(codec, rate=rate, layout=layout) for _ in tracks]
        if cover:
            _add_cover(out)
        if picture is not None:
            picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
            for i in range(max(1, round(length * 10))):
                frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 90, np.uint8), "rgb24")
                frame.pts, frame.time_base = i, Fraction(1, 10)
                out.mux(picture.encode(frame))
            out.mux(picture.encode(None))
        for sound, pcm in zip(sounds, tracks, strict=True):
            _write_track(out, sound, pcm, channel, source_rate)
    return path


def _add_cover(out: av.container.OutputContainer) -> None:
    png = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(png, "PNG")
    art = out.add_stream("png")
    art.width, art.height, art.pix_fmt = 64, 64, "rgb24"
    art.disposition = av.stream.Disposition.attached_pic
    packet = av.Packet(png.getvalue())
    packet.stream, packet.pts, packet.dts = art, 0, 0
    out.mux(packet)


def _write_track(
    out: av.container.OutputContainer, stream, pcm: np.ndarray, channel, rate: int = RATE
) -> None:
    channels = stream.codec_context.layout.nb_channels
    planes = np.zeros((channels, len(pcm)), np.float32)
    planes[:] = pcm if channel is None else 0
    if channel is not None:
        planes[channel] = pcm
    source = av.AudioFrame.from_ndarray(planes, format="fltp", layout=stream.codec_context.layout)
    source.sample_rate, source.pts, source.time_base = rate, 0, Fraction(1, rate)
    ctx = stream.codec_context
    resampler = av.AudioResampler(format=ctx.format, layout=ctx.layout, rate=ctx.sample_rate)
    fifo = av.AudioFifo()
    for frame in [*resampler.resample(source), *resampler.resample(None)]:
        fifo.write(frame)
    size = ctx.frame_size or 1024
    while fifo.samples:
        frame = fifo.read(size, partial=True)
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))
