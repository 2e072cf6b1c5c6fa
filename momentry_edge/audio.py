"""Audio decode with PyAV: a media file's audio tracks as 16 kHz mono float32."""

# Speech models want exactly this, and a whole track at 16 kHz is small (3.8 MB
# per minute), so a run decodes it once, up front, and works on the array.
# Sample 0 is the start of the file's timeline (the container start), the same
# origin frame timestamps use, so times from audio and video agree. Every channel
# (stereo, 5.1) is mixed into the one, at any source rate; a stereo track can also be
# had as its two channels apart (one microphone on each), as faster-whisper's own
# ``decode_audio(split_stereo=True)`` gives them.

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import av
    import numpy as np

from .media import MediaError, MediaNotFoundError, _message, _open, av_errors, decode_tolerant

SAMPLE_RATE = 16_000
_BLOCK = 500_000  # source samples per resample call


# Channel energies are compared in windows this long (samples at SAMPLE_RATE).
_WINDOW = SAMPLE_RATE // 2
_QUIET = 10 ** (-50 / 10)  # mean square below -50 dBFS: no one speaks in this window
_APART_DB = 10.0  # one channel this much louder than the other: its own microphone
_LAG = 24  # samples: 1.5 ms, the most one voice reaches one microphone after the other


def decode(path: Path | str, track: int = 0, *, stereo: bool = False) -> np.ndarray | None:
    """Audio track ``track`` (0: the first), resampled; None when there is no such track.
    ``stereo``: its left and right channels apart, shape (2, samples).

    Raises ``MediaError`` (``MediaNotFoundError`` for a missing file).
    """
    import av
    import numpy as np

    with _open(path) as container:
        if track >= len(container.streams.audio):
            return None
        stream = container.streams.audio[track]
        origin = container.start_time or 0  # microseconds (av.time_base)
        # 16-bit, as faster-whisper's own decode_audio has it: Whisper's text can hinge on
        # the last bit of the samples, and it must match the library's own call's.
        layout = "stereo" if stereo else "mono"
        resampler = av.AudioResampler(format="s16", layout=layout, rate=SAMPLE_RATE)
        # Decoded frames are gathered in a FIFO and resampled in large blocks: one
        # resample call per ~10 s instead of one per 20 ms frame (half the time).
        fifo = av.AudioFifo()
        chunks: list[np.ndarray] = []
        first_at: float | None = None  # seconds from the container start

        def resample(frame: av.AudioFrame | None) -> None:
            chunks.extend(
                f.to_ndarray().reshape(-1).astype(np.float32) / 32768.0
                for f in resampler.resample(frame)
            )

        try:
            for frame in decode_tolerant(container, stream):
                if first_at is None and frame.pts is not None and frame.time_base:
                    first_at = float(frame.pts * frame.time_base) - origin / av.time_base
                frame.pts = None  # the FIFO checks continuity; times are kept above
                try:
                    fifo.write(frame)
                except ValueError:  # the format changed mid-stream: flush, start anew
                    if fifo.samples:
                        resample(fifo.read())
                    fifo = av.AudioFifo()
                    fifo.write(frame)
                if fifo.samples >= _BLOCK:
                    resample(fifo.read())
            if fifo.samples:
                resample(fifo.read())
            resample(None)
        except FileNotFoundError:
            raise MediaNotFoundError(f"file not found: {path}") from None
        except av_errors() as e:
            reason = f"truncated or corrupt: decoding audio failed: {_message(e)}"
            raise MediaError(reason) from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if stereo:  # interleaved, left first
        samples = samples.reshape(-1, 2).T
    # A track that starts late is padded so its samples sit at their real time;
    # encoder priming before the start (negative) is dropped.
    shift = round((first_at or 0.0) * SAMPLE_RATE)
    if shift > 0:
        pad = np.zeros((*samples.shape[:-1], shift), np.float32)
        samples = np.concatenate([pad, samples], axis=-1)
    elif shift < 0:
        samples = samples[..., -shift:]
    return np.ascontiguousarray(samples, dtype=np.float32)


def channel_counts(path: Path | str) -> list[int]:
    """How many channels each audio track has, in the file's order."""
    with _open(path) as container:
        return [s.codec_context.channels for s in container.streams.audio]


def channels_apart(pair: np.ndarray) -> bool:
    """Whether a stereo track's two channels carry different speech (a microphone on
    each), judged in half-second windows: in at least a second's worth of them, and 5 %
    of those where anyone is heard, both channels are heard with sounds that do not
    match (correlation below 0.5 at any delay up to 1.5 ms: two people at once); or each
    channel is the louder by 10 dB or more in that many (one after the other). Dual mono,
    one microphone heard on both sides (bleed) or sound on one side only: not apart."""
    import numpy as np

    length = pair.shape[1] // _WINDOW * _WINDOW
    if not length:
        return False
    both = pair[:, :length].astype(np.float64)
    energy = np.square(both).reshape(2, -1, _WINDOW).mean(axis=2)
    heard = energy.max(axis=0) > _QUIET
    least = max(2, 0.05 * heard.sum())
    ratio = 10 * np.log10((energy[0] + 1e-12) / (energy[1] + 1e-12))
    left, right = heard & (ratio >= _APART_DB), heard & (ratio <= -_APART_DB)
    if left.sum() >= least and right.sum() >= least:
        return True
    together = (energy > _QUIET).all(axis=0)
    if together.sum() < least:
        return False
    # The best match over small delays (a spaced pair hears one voice a little later).
    match = np.zeros(together.shape)
    norm = np.sqrt(energy[0] * energy[1]) * _WINDOW
    for lag in range(-_LAG, _LAG + 1, 2):
        moved = np.roll(both[1], lag)
        dots = (both[0] * moved).reshape(-1, _WINDOW).sum(axis=1)
        match = np.maximum(match, np.abs(dots) / np.maximum(norm, 1e-12))
    return bool((together & (match < 0.5)).sum() >= least)


def louder_elsewhere(pair: np.ndarray, channel: int, start: float, end: float) -> bool:
    """Whether, between ``start`` and ``end`` seconds, the other channel of ``pair`` is
    the louder by 10 dB or more: what ``channel`` has there is the other microphone's
    speech bleeding in."""
    import numpy as np

    a, b = max(0, round(start * SAMPLE_RATE)), min(pair.shape[1], round(end * SAMPLE_RATE))
    if b <= a:
        return False
    own, other = (
        float(np.mean(np.square(pair[c, a:b], dtype=np.float64))) for c in (channel, 1 - channel)
    )
    return other > own * 10 ** (_APART_DB / 10)


def decode_tracks(path: Path | str) -> list[np.ndarray]:
    """Every audio track, in the file's order; empty when there is none."""
    with _open(path) as container:
        count = len(container.streams.audio)
    return [pcm for track in range(count) if (pcm := decode(path, track)) is not None]
